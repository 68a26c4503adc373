"""`tutti bench torch`: tutti.torch's costs beside their baselines, in one run.

  python_path        per step: batch -> torch tensors -> every micro-batch's model inputs,
                     against Batch::Map (the C++ Next()'s work once the stager answered)
  exchange_gloo      tutti.torch.exchange forward + backward over a gloo group, against a
                     bare batch_isend_irecv of the same bytes in one buffer per peer
  exchange_mpi       the same over tutti's MPI transport, against a bare MPI Alltoallv
                     (mpi4py) of the same bytes in one buffer per peer

Each exchange case runs both sides in the same rank processes, on the same plan,
interleaved, and reports the slowest rank's medians, their ratio (bare time / tutti time:
tutti's throughput against bare) and the data messages tutti sent per communicating pair
and direction (1: one message per pair, as the bare exchange sends). --ranks 4,8 runs each
case at both world sizes; --runs N repeats each in fresh processes and reports every run.

Ranks are started here (processes with torchrun's variables for gloo, mpirun for MPI), in
the allocator's default settings (tutti.torch reuses the host memory of its outputs).
Synthetic batches (no daemons): random post-balanced plans, every image sent to a random
rank. Prints a table, or one JSON object with --json."""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time



def _synthetic():
    from tutti.torch import _synthetic

    return _synthetic


def _step(world, step, images_per_rank, rng_seed=0):
    import numpy as np

    synthetic = _synthetic()
    rng = np.random.default_rng(rng_seed + step)
    images, llm = [], {}
    sid = step * 100000 + 1
    for r in range(world):
        for k in range(images_per_rank):
            images.append((sid, 0, 16, 16, r, int(rng.integers(0, world))))
            llm[sid] = images[-1][5]
            sid += 1
    for r in range(world):  # every rank holds documents
        llm[sid] = r
        sid += 1
    return synthetic, images, llm


def python_path(args):
    import tutti
    from tutti.torch._batch import Batch

    synthetic, images, llm = _step(1, 0, args.images)
    plan = synthetic.rank_plan(1, 0, images, llm, args.hidden)
    seg = synthetic.Segment(0, 0, plan, images)
    job = synthetic.job(1, args.hidden)
    base, full = [], []
    try:
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            raw = tutti.map_batch(seg.desc)
            _ = raw.arrays
            t1 = time.perf_counter()
            raw.release()
            t2 = time.perf_counter()
            raw = tutti.map_batch(seg.desc, copy_on_write=True)
            b = Batch(raw, job)
            _ = (b.pixel_values, b.image_grid_thw, b.vit_cu_seqlens)
            for mb in b.micro_batches:
                _ = (mb.input_ids, mb.labels, mb.position_ids, mb.mrope_position_ids,
                     mb.cu_seqlens, mb.image_token_positions)
            t3 = time.perf_counter()
            b.release()
            base.append(t1 - t0)
            full.append(t3 - t2)
    finally:
        seg.close()
    mc, mp = statistics.median(base), statistics.median(full)
    return {"case": "python_path", "images": args.images,
            "cpp_map_us": mc * 1e6, "python_path_us": mp * 1e6,
            "overhead_us": (mp - mc) * 1e6}


def _exchange_rank(args, kind):
    """One rank of an exchange case; rank 0 prints the slowest rank's medians."""
    import numpy as np
    import torch
    import torch.distributed as dist

    import tutti.torch
    from tutti.torch import _transports

    env = tutti.torch.init_process_group()
    rank, world = env.rank, env.world_size
    transport = (_transports.TorchTransport(None, 120) if kind == "gloo"
                 else _transports.MpiTransport(120))
    if kind == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    synthetic, images, llm = _step(world, 0, args.images)
    b, seg = synthetic.batch(world, rank, 0, images, llm, args.hidden, transport)
    t = b._tables()
    rb = args.hidden * 4
    x = torch.randn(b.num_encoder_rows, args.hidden)
    send = x.new_empty((t.send_total, args.hidden)).normal_()  # the encoder output
    recv = x.new_empty((t.recv_total, args.hidden))
    s_off = np.concatenate([[0], np.cumsum(t.send_rows)])
    r_off = np.concatenate([[0], np.cumsum(t.recv_rows)])

    def bare(reverse=False):
        # One buffer per peer: the rows for a peer back to back, as tutti's plans lay them.
        src, dst, so, ro, srows, rrows = send, recv, s_off, r_off, t.send_rows, t.recv_rows
        if reverse:
            src, dst, so, ro, srows, rrows = recv, send, r_off, s_off, t.recv_rows, t.send_rows
        if kind == "gloo":
            ops = []
            for k in range(1, world):
                p = (rank - k) % world
                if rrows[p]:
                    ops.append(dist.P2POp(dist.irecv, dst[ro[p]:ro[p + 1]], p))
            for k in range(1, world):
                p = (rank + k) % world
                if srows[p]:
                    ops.append(dist.P2POp(dist.isend, src[so[p]:so[p + 1]], p))
            dst[ro[rank]:ro[rank + 1]].copy_(src[so[rank]:so[rank + 1]])
            for w in dist.batch_isend_irecv(ops) if ops else []:
                w.wait()
        else:
            sc = [int(n) * rb for n in srows]
            rc = [int(n) * rb for n in rrows]
            comm.Alltoallv([src.numpy(), (sc, [int(o) * rb for o in so[:-1]]), MPI.BYTE],
                           [dst.numpy(), (rc, [int(o) * rb for o in ro[:-1]]), MPI.BYTE])

    grad = torch.ones(b.num_image_embeds, args.hidden)

    def ours():
        xx = x.detach().requires_grad_()
        tutti.torch.exchange(xx, b).backward(grad)

    # tutti's messages, forward then backward, per communicating pair.
    xx = x.detach().requires_grad_()
    out = tutti.torch.exchange(xx, b)
    messages = sum(transport.messages_sent_to)
    out.backward(grad)
    messages += sum(transport.messages_sent_to)
    pairs = sum(1 for p in range(world) if p != rank and t.send_rows[p]) + \
        sum(1 for p in range(world) if p != rank and t.recv_rows[p])
    del out, xx

    def barrier():
        if kind == "gloo":
            dist.barrier()
        else:
            comm.Barrier()

    times = {"bare": [], "tutti": []}
    cases = (("bare", lambda: (bare(), bare(reverse=True))), ("tutti", ours))
    for i in range(args.repeats + 2):
        for name, fn in cases[::1 if i % 2 else -1]:
            barrier()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if i >= 2:
                times[name].append(dt)
    b.release()
    seg.close()
    moved = (t.send_total + t.recv_total) * rb  # forward + backward bytes this rank sends
    out = {"case": f"exchange_{kind}", "ranks": world, "hidden": args.hidden,
           "images_per_rank": args.images, "bytes_per_rank": moved,
           "bare_ms": statistics.median(times["bare"]) * 1e3,
           "tutti_ms": statistics.median(times["tutti"]) * 1e3,
           "messages": messages, "pairs": pairs,
           "repeats": args.repeats, "load_average": list(os.getloadavg())}
    gathered = [None] * world
    if kind == "gloo":
        dist.all_gather_object(gathered, out)
    else:
        gathered = comm.allgather(out)
    if rank == 0:
        # The slowest rank's medians: an exchange ends when every rank's has.
        worst = max(gathered, key=lambda o: o["tutti_ms"])
        worst["bare_ms"] = max(o["bare_ms"] for o in gathered)
        worst["tutti_vs_bare_throughput"] = worst["bare_ms"] / worst["tutti_ms"]
        worst["bytes_per_rank"] = max(o["bytes_per_rank"] for o in gathered)
        total_pairs = sum(o["pairs"] for o in gathered)
        worst["messages_per_pair"] = (sum(o["messages"] for o in gathered) / total_pairs
                                      if total_pairs else 0.0)
        worst["items_per_pair"] = (2 * len(images) - sum(
            1 for im in images if im[4] == im[5]) * 2) / total_pairs if total_pairs else 0.0
        del worst["messages"], worst["pairs"]
        print("BENCH " + json.dumps(worst), flush=True)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args, kind, ranks):
    me = [sys.executable, "-m", "tutti.torch.bench", "--rank-of", kind, "--images", str(args.images),
          "--hidden", str(args.hidden), "--repeats", str(args.repeats)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if kind == "gloo":
        port = _free_port()
        procs = [subprocess.Popen(me, env=dict(env, RANK=str(r), WORLD_SIZE=str(ranks),
                                               LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(ranks),
                                               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(ranks)]
    else:
        if shutil.which("mpirun") is None:
            return {"case": "exchange_mpi", "error": "mpirun not found"}
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        procs = [subprocess.Popen(["mpirun", "-np", str(ranks), "--oversubscribe", "-x",
                                   "PYTHONPATH", *me], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    out = "".join(p.communicate(timeout=900)[0] for p in procs)
    for line in out.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])
    return {"case": f"exchange_{kind}", "error": out[-2000:]}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tutti bench torch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="python_path,exchange_gloo,exchange_mpi",
                    help="comma-separated cases (default: all)")
    ap.add_argument("--ranks", default="4",
                    help="comma-separated world sizes of the exchange cases (default 4)")
    ap.add_argument("--images", type=int, default=32,
                    help="images each rank encodes, 16x16 patches = 64 tokens each (default 32)")
    ap.add_argument("--hidden", type=int, default=4096, help="embedding width, fp32 (default 4096)")
    ap.add_argument("--repeats", type=int, default=15, help="timed repetitions (default 15)")
    ap.add_argument("--runs", type=int, default=1,
                    help="runs of each exchange case, each with fresh rank processes; every "
                         "run's ratio and load average is reported (default 1)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    ap.add_argument("--rank-of", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank_of:
        return _exchange_rank(args, args.rank_of)
    try:
        worlds = [int(w) for w in args.ranks.split(",") if w]
    except ValueError:
        worlds = []
    if not worlds or min(worlds) < 2:
        ap.error(f"--ranks {args.ranks!r}: comma-separated world sizes of at least 2")
    results = []
    for case in args.cases.split(","):
        if case == "python_path":
            results.append(python_path(args))
        elif case in ("exchange_gloo", "exchange_mpi"):
            for ranks in worlds:
                for run in range(args.runs):
                    results.append(dict(_launch(args, case.split("_")[1], ranks), run=run + 1))
        else:
            ap.error(f"unknown case {case!r}")
    load = list(os.getloadavg())
    if args.json:
        print(json.dumps({"cases": results, "load_average": load,
                          "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
        return 0
    print(f"{'case':<16} {'tutti':>14} {'baseline':>14} {'ratio':>8}  notes")
    for r in results:
        if "error" in r:
            print(f"{r['case']:<16} failed: {r['error'][-300:]}")
        elif r["case"] == "python_path":
            print(f"{r['case']:<16} {r['python_path_us']:>11.0f} us {r['cpp_map_us']:>11.0f} us "
                  f"{r['python_path_us'] / r['cpp_map_us']:>8.2f}  +{r['overhead_us']:.0f} us per step "
                  f"over Batch::Map, {r['images']} images")
        else:
            mb = r["bytes_per_rank"] / 2**20
            print(f"{r['case']:<16} {r['tutti_ms']:>11.2f} ms {r['bare_ms']:>11.2f} ms "
                  f"{r['tutti_vs_bare_throughput']:>8.3f}  throughput vs bare, {r['ranks']} ranks, "
                  f"run {r['run']}, load {r['load_average'][0]:.1f}, {mb:.1f} MiB per rank "
                  f"fwd+bwd, {r['messages_per_pair']:.2f} messages per pair and direction "
                  f"({r['items_per_pair']:.1f} images), medians of {r['repeats']}")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
