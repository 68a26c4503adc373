"""One rank of the interleaved end-to-end test, under torchrun: trains the tiny model
(model.py) on tutti's batches with plain SGD and saves what the test checks against the raw
records: per document its tokens, labels, M-RoPE ids, image positions, the embeddings
placed there and its sample's source and meta; per encoded image its pixels and encoder rows; rank 0 every step's loss and
all-reduced gradients."""
import argparse
import os
import sys

import torch
import torch.distributed as dist

import tutti.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    env = tutti.torch.init_process_group()
    loader = tutti.torch.Loader(transport="torch", max_steps=args.steps)
    vit, lm = model.build(args.vocab, args.hidden)
    params = model.parameters(vit, lm)
    opt = torch.optim.SGD(params, lr=args.lr)
    docs, encoded, steps, skipped = [], [], [], []
    for batch in loader:
        opt.zero_grad(set_to_none=True)
        skipped += [dict(s) for s in batch.skipped]
        keys = {int(s["sample_id"]): s["key"] for s in batch.samples}
        x = vit(batch.pixel_values, batch.vit_cu_seqlens)
        emb = tutti.torch.exchange(x, batch)
        # What this rank encodes: each image's pixels and encoder rows, by (sample, index).
        grid = batch.image_grid_thw.tolist()
        p0 = r0 = 0
        for sid, index, (t, h, w) in zip(batch.image_sample_ids.tolist(),
                                         batch.image_indices.tolist(), grid):
            p1, r1 = p0 + t * h * w, r0 + t * h * w // 4
            encoded.append(dict(step=batch.step, key=keys[sid], index=index, grid=(t, h, w),
                                pixels=batch.pixel_values[p0:p1].clone(),
                                rows=x[r0:r1].detach().clone()))
            p0, r0 = p1, r1
        tokens = torch.tensor(float(batch.num_label_tokens))
        dist.all_reduce(tokens)
        loss_sum = torch.zeros(())
        for mb in batch.micro_batches:
            h = mb.scatter_image_embeds(lm.embed(mb.input_ids.long()), emb)
            logits = lm(h, mb.mrope_position_ids, mb.cu_seqlens)
            loss = model.summed_loss(logits, mb.labels) / tokens
            loss.backward()
            loss_sum += loss.detach()
            cu = mb.cu_seqlens.tolist()
            pos = mb.image_token_positions
            grids = mb.image_grid_thw.tolist()
            g = 0
            sources, metas = mb.doc_sample_sources, mb.doc_sample_meta
            for k, sid in enumerate(mb.doc_sample_ids.tolist()):
                a, b = cu[k], cu[k + 1]
                mine = pos[(pos >= a) & (pos < b)]
                doc_grids, n = [], 0
                while n < len(mine):
                    t, hh, ww = grids[g]
                    doc_grids.append((t, hh, ww))
                    n += t * hh * ww // 4
                    g += 1
                docs.append(dict(step=batch.step, rank=env.rank, micro_batch=mb.index,
                                 key=keys[sid], input_ids=mb.input_ids[0, a:b].long().clone(),
                                 labels=mb.labels[0, a:b].clone(),
                                 mrope=mb.mrope_position_ids[:, 0, a:b].clone(),
                                 positions=mine - a, grids=doc_grids,
                                 rows=h[0, mine].detach().clone(), source=sources[k],
                                 meta=metas[k]))
        flat = model.flat_grads(params)
        dist.all_reduce(flat)
        dist.all_reduce(loss_sum)
        at = 0
        for p in params:
            p.grad = flat[at:at + p.numel()].view_as(p).clone()
            at += p.numel()
        opt.step()
        steps.append(dict(step=batch.step, loss=loss_sum.item(), tokens=int(tokens.item()),
                          batch_sources=batch.doc_sample_sources, batch_meta=batch.doc_sample_meta,
                          batch_docs=batch.doc_sample_ids.tolist(), keys=keys,
                          grad=flat.clone(),
                          micro_batches=[mb.num_tokens for mb in batch.micro_batches]))
    torch.save(dict(rank=env.rank, docs=docs, encoded=encoded, steps=steps, skipped=skipped),
               os.path.join(args.out, f"rank{env.rank}.pt"))
    dist.barrier()
    print(f"OK rank {env.rank}: {len(steps)} steps, {len(docs)} documents, "
          f"{len(encoded)} images encoded", flush=True)


if __name__ == "__main__":
    main()
