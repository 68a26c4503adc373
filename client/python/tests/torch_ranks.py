"""One rank of the tutti.torch exchange tests, under torchrun (the gloo group) or
mpirun (--transport mpi), on synthetic batches (no daemons):

  random N    N steps of random plans, forward and backward, every value checked, one
              message per peer and direction counted (odd steps place rows with
              scatter_image_embeds and backward per micro-batch)
  bad CASE    one rank gives bad input at step 1; every rank prints what it got
  skipped N   N steps where the stagers skip some images' samples: every LLM rank masks
              the documents whose images another rank skipped, as that rank would

Prints "OK ..." or "RESULT <case> <error class> <message>" per rank."""
import argparse
import sys
import time

import numpy as np
import torch

from tutti.torch import _synthetic as synthetic
import tutti
import tutti.torch
from tutti.torch import _transports

HIDDEN = 16


def check(cond, what):
    if not cond:
        print(f"FAIL {what}", flush=True)
        sys.exit(1)


def dropped_by(images, rank, step):
    """Every fifth step (from step 2) each rank's batch lacks the images of the first sample
    it encodes (a sample left out whole): zeros are sent in their place."""
    mine = sorted({im[0] for im in images if im[4] == rank})
    return tuple(mine[:1]) if step % 5 == 2 else ()


def step_batch(args, transport, rank, world, step, images=None, llm_of=None):
    """Step `step`'s random plan, laid out as tutti-packerd lays it out; every third step's
    documents are schema-2 conversations (image runs inside the text)."""
    if images is None:
        rng = np.random.default_rng(1000 + step)
        images, llm_of = synthetic.random_step(world, step, rng)
    return synthetic.batch(world, rank, step, images, llm_of, HIDDEN, transport,
                           dropped=dropped_by(images, rank, step), interleave=step % 3 == 1)


def encoder_keys(batch):
    L = batch._layout
    keys = sorted(L.enc_rows.items(), key=lambda kv: kv[1][0])
    return [(k, n) for k, (_, n) in keys]


def llm_keys(batch):
    return [((s, i), n) for s, i, _, _, n in batch._layout.llm_images]


def recv_keys(batch):
    """The exchange's output rows in order: the plan's receives, grouped by source."""
    out = []
    for t in batch._layout.plan["exchange"]["recvs"]:
        for it in t["items"]:
            out.append(((int(it["sample_id"]), int(it.get("index") or 0)),
                        int(it["bytes"]) // (4 * HIDDEN)))
    return out


def one_per_peer(rows, rank):
    """The messages a rank sends in one direction: one to each other rank it has rows for."""
    return [int(n > 0 and p != rank) for p, n in enumerate(rows)]


def run_random(args, transport, rank, world):
    bytes_checked = 0
    messages = items = 0
    held = []  # the previous step's outputs, kept past their step, and what they held
    seen, reused = set(), 0  # output memory: host blocks come back once free
    for step in range(args.steps):
        rng = np.random.default_rng(1000 + step)
        images, llm_of = synthetic.random_step(world, step, rng)
        batch, seg = step_batch(args, transport, rank, world, step, images, llm_of)
        try:
            t = batch._tables()
            x = torch.from_numpy(synthetic.pattern(encoder_keys(batch), HIDDEN, 0)).requires_grad_()
            emb = tutti.torch.exchange(x, batch)
            # One message per peer forward: this rank's rows for it, back to back.
            forward_msgs = list(transport.messages_sent_to)
            check(forward_msgs == one_per_peer(t.send_rows, rank),
                  f"step {step}: {forward_msgs} messages sent forward to each rank, rows "
                  f"{t.send_rows}")
            # The rows arrive grouped by source; images their encoding rank's batch lacks
            # arrive as zeros.
            lacking = {(im[0], im[1]) for im in images
                       if im[0] in dropped_by(images, im[4], step)}
            want = synthetic.pattern(recv_keys(batch), HIDDEN, 0)
            row = 0
            for key, n in recv_keys(batch):
                if key in lacking:
                    want[row:row + n] = 0
                row += n
            check(np.array_equal(emb.detach().numpy(), want), f"step {step}: forward rows")
            placed = synthetic.pattern(llm_keys(batch), HIDDEN, 0)
            row = 0
            for key, n in llm_keys(batch):
                if key in lacking:
                    placed[row:row + n] = 0
                row += n
            check(np.array_equal(emb.detach()[batch.image_embed_index].numpy(), placed),
                  f"step {step}: rows placed in input_ids order")
            grad = torch.from_numpy(synthetic.pattern(llm_keys(batch), HIDDEN, 5))
            if step % 2 == 0:
                g = torch.zeros_like(emb)
                g[batch.image_embed_index] = grad
                emb.backward(g)
            else:
                r0 = 0
                for mb in batch.micro_batches:
                    base = torch.zeros(1, mb.num_tokens, HIDDEN, requires_grad=True)
                    out = mb.scatter_image_embeds(base, emb)
                    pos = mb.image_token_positions
                    r1 = r0 + len(pos)
                    check(np.array_equal(out[0, pos].detach().numpy(), placed[r0:r1]),
                          f"step {step}: placed rows")
                    weight = torch.zeros(1, mb.num_tokens, HIDDEN)
                    weight[0, pos] = grad[r0:r1]
                    (out * weight).sum().backward()
                    r0 = r1
            backward_msgs = list(transport.messages_sent_to)
            check(backward_msgs == one_per_peer(t.recv_rows, rank),
                  f"step {step}: {backward_msgs} messages sent backward to each rank, rows "
                  f"{t.recv_rows}")
            want_g = synthetic.pattern(encoder_keys(batch), HIDDEN, 5)
            check(x.grad is not None or want_g.size == 0, f"step {step}: no gradient")
            if want_g.size:
                check(np.array_equal(x.grad.numpy(), want_g), f"step {step}: backward rows")
            bytes_checked += 4 * (want.size + want_g.size)
            # Outputs a trainer keeps past their step keep their rows: the next exchanges
            # never write into memory a tensor still uses.
            for kept, rows, what in held:
                check(np.array_equal(kept.numpy(), rows), f"step {step}: the previous step's "
                                                          f"{what}, kept, was overwritten")
            held = [(emb.detach(), emb.detach().numpy().copy(), "embeddings")]
            if x.grad is not None:
                held.append((x.grad, x.grad.numpy().copy(), "gradient"))
            if emb.numel():
                reused += emb.data_ptr() in seen
                seen.add(emb.data_ptr())
            messages += sum(forward_msgs) + sum(backward_msgs)
            ex = batch._layout.plan["exchange"]
            items += sum(len(tr["items"]) for tr in ex["sends"] + ex["recvs"]
                         if int(tr["peer"]) != rank)
        finally:
            batch.release()
            seg.close()
    check(messages < items, f"{messages} messages sent for {items} items: pairs of several "
                            "items should move as one message")
    if args.steps >= 20:  # freed outputs' host memory serves later steps
        check(reused > 0, f"no step's embeddings reused the memory of an earlier, freed one")
    print(f"OK rank {rank}: {args.steps} random steps, {bytes_checked} bytes checked, "
          f"{messages} messages sent for {items} items, {reused} outputs in reused memory",
          flush=True)


def run_bad(args, transport, rank, world):
    for step in range(3):
        batch, seg = step_batch(args, transport, rank, world, step)
        x = torch.from_numpy(synthetic.pattern(encoder_keys(batch), HIDDEN, 0))
        culprit = step == 1 and rank == 1
        try:
            if culprit and args.case == "skip":
                continue  # this rank goes on to the next step's exchange
            if culprit and args.case == "shape":
                x = torch.zeros(x.shape[0] + 1, HIDDEN)
            if culprit and args.case == "dtype":
                x = x.double()
            if culprit and args.case == "device":
                x = x.to("meta")
            if culprit and args.case == "corrupt":
                batch._layout.llm_images = [(1, 0)]  # a layout this rank cannot read
            if culprit and args.case in ("mismatch", "old"):
                # mismatch: this rank's plan lists two of its items to a peer in the other
                # order (their sizes differ), its encoder output likewise: a plan of its own,
                # consistent with its buffers, that the peer's plan contradicts. old: the
                # plan says it is plan_version 3.
                import copy

                L = batch._layout
                plan = copy.deepcopy(L.plan)
                if args.case == "old":
                    plan["plan_version"] = 3
                else:
                    t = next(t for t in plan["exchange"]["sends"] if int(t["peer"]) != rank and
                             len({int(it["bytes"]) for it in t["items"]}) >= 2)
                    a = next(k for k, it in enumerate(t["items"])
                             if int(it["bytes"]) != int(t["items"][0]["bytes"]))
                    keys = [(int(t["items"][k]["sample_id"]), int(t["items"][k]["index"]))
                            for k in (0, a)]
                    t["items"][0], t["items"][a] = t["items"][a], t["items"][0]
                    rows = plan["encoders"][0]["images"]
                    at = [next(j for j, ip in enumerate(rows)
                               if (int(ip["sample_id"]), int(ip["image_index"])) == k) for k in keys]
                    rows[at[0]], rows[at[1]] = rows[at[1]], rows[at[0]]
                L.plan, L.plan_bytes = plan, tutti.plan_bytes(plan)
                batch._layout_tables = None
            if culprit and args.case == "released":
                batch.release()
            if culprit and args.case == "absent":
                time.sleep(args.timeout + 20)  # stuck elsewhere past every deadline
                print("RESULT absent culprit", flush=True)
                return
            if step == 1 and args.case == "noncontiguous":
                x = x.t().contiguous().t()  # same values, other strides: accepted
            t0 = time.time()
            emb = tutti.torch.exchange(x, batch)
            if step == 1 and args.case == "noncontiguous":
                want = synthetic.pattern(recv_keys(batch), HIDDEN, 0)
                check(np.array_equal(emb.detach().numpy(), want), "non-contiguous x: rows")
        except tutti.Error as e:
            msg = str(e).replace("\n", " ")
            print(f"RESULT {args.case} {type(e).__name__} {time.time() - t0:.1f}s {msg}", flush=True)
            return
        finally:
            batch.release()
            seg.close()
    print(f"RESULT {args.case} none", flush=True)


def run_skipped(args, transport, rank, world):
    masked = 0
    for step in range(args.steps):
        rng = np.random.default_rng(2000 + step)
        images, llm_of = synthetic.random_step(world, step, rng)
        bad = {s for s in llm_of if rng.random() < 0.3}  # samples whose image fails to decode
        mine = sorted({im[0] for im in images if im[4] == rank and im[0] in bad})
        batch, seg = synthetic.batch(world, rank, step, images, llm_of, HIDDEN, transport,
                                     skipped=mine)
        try:
            tutti.torch.share_skipped_images(batch)
            want = sorted((im[0], im[1]) for im in images
                          if im[0] in bad and im[5] == rank and im[4] != rank)
            check(batch.skipped_images == want, f"step {step}: skipped_images "
                                                f"{batch.skipped_images} != {want}")
            with_images = {im[0] for im in images}
            for mb in batch.micro_batches:
                b = mb.cu_seqlens.tolist()
                for k, sid in enumerate(mb.doc_sample_ids.tolist()):
                    lab = mb.labels[0, b[k]:b[k + 1]]
                    all_masked = bool((lab == -100).all())
                    should = sid in bad and sid in with_images
                    check(all_masked == should, f"step {step}: document of sample {sid} "
                                                f"masked {all_masked}, expected {should}")
                    masked += should
        finally:
            batch.release()
            seg.close()
    print(f"OK rank {rank}: {args.steps} steps with skipped images, {masked} documents masked",
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["random", "bad", "skipped"])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--case", default="")
    ap.add_argument("--transport", default="torch")
    ap.add_argument("--timeout", type=float, default=30)
    args = ap.parse_args()
    env = tutti.torch.init_process_group()
    if args.transport == "torch":
        transport = _transports.TorchTransport(None, args.timeout)
    else:
        transport = _transports.MpiTransport(args.timeout)
    run = {"random": run_random, "bad": run_bad, "skipped": run_skipped}[args.mode]
    run(args, transport, env.rank, env.world_size)


if __name__ == "__main__":
    main()
