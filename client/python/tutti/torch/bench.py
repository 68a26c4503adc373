"""`tutti bench torch`: tutti.torch's costs beside their baselines, in one run.

  python_path        per step: batch -> torch tensors -> every micro-batch's model inputs,
                     against Batch::Map (the C++ Next()'s work once the stager answered)
  exchange_gloo      tutti.torch.exchange forward + backward over a gloo group, against a
                     bare batch_isend_irecv of the same bytes (one message per peer)
  exchange_mpi       the same over tutti's MPI transport, against a bare MPI Alltoallv
                     (mpi4py) of the same bytes

Each exchange case also times a bare exchange of the same rows item by item (one message
per image, straight between the encoder output's rows and the output's, as tutti moves
them): bare_items_ms in the JSON, the share of the gap that is the message count; and
the same rows as one message per peer (bare_per_peer_ms; MPI: a derived datatype per
peer on each end, gloo: each peer's rows gathered into a staging tensor and scattered on
arrival), what tutti would gain by moving one message per pair instead of one per item.
--runs N repeats each exchange case in fresh processes and reports every run.

Ranks are started here (processes with torchrun's variables for gloo, mpirun for MPI), in
the allocator's default settings: an autograd function returns a new tensor per call, whose
host memory tutti.torch reuses from step to step; bare_fresh_ms shows the bare exchange into
a new tensor each time.
Synthetic batches (no daemons): random post-balanced plans, every image exchanged.
Prints a table, or one JSON object with --json."""
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
    """One rank of an exchange case; returns rank 0's medians."""
    import numpy as np
    import torch
    import torch.distributed as dist

    import tutti.torch
    from tutti.torch import _exchange

    env = tutti.torch.init_process_group()
    rank, world = env.rank, env.world_size
    transport = (_exchange.TorchTransport(None, 120) if kind == "gloo"
                 else _exchange.MpiTransport(120))
    if kind == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
    synthetic, images, llm = _step(world, 0, args.images)
    b, seg = synthetic.batch(world, rank, 0, images, llm, args.hidden, transport)
    t = b._tables()
    x = torch.randn(b.num_encoder_rows, args.hidden)
    rb = args.hidden * 4
    send = x.new_empty((t.send_total, args.hidden)).normal_()
    recv = x.new_empty((t.recv_total, args.hidden))
    s_off = np.concatenate([[0], np.cumsum(t.send_rows)])
    r_off = np.concatenate([[0], np.cumsum(t.recv_rows)])

    def bare(reverse=False, fresh=False):
        src, dst, so, ro, srows, rrows = send, recv, s_off, r_off, t.send_rows, t.recv_rows
        if reverse:
            src, dst, so, ro, srows, rrows = recv, send, r_off, s_off, t.recv_rows, t.send_rows
        if fresh:  # a new output each time, as an autograd function must return
            dst = dst.new_empty(dst.shape)
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

    out_rows = x.new_empty((t.out_total, args.hidden))
    grad_x = torch.empty_like(x)

    def bare_items():
        # tutti's messages without tutti: one per item, x rows <-> output rows, both ways.
        for src, dst, si, ri in ((x, out_rows, t.send_items, t.recv_items),
                                 (out_rows, grad_x, t.recv_items, t.send_items)):
            if kind == "gloo":
                ops = []
                for k in range(1, world):
                    p = (rank - k) % world
                    ops += [dist.P2POp(dist.irecv, dst[a:a + n], p) for a, n in ri[p]]
                for k in range(1, world):
                    p = (rank + k) % world
                    ops += [dist.P2POp(dist.isend, src[a:a + n], p) for a, n in si[p]]
                works = dist.batch_isend_irecv(ops) if ops else []
            else:
                sn, dn, reqs = src.numpy(), dst.numpy(), []
                for k in range(1, world):
                    p = (rank - k) % world
                    reqs += [comm.Irecv([dn[a:a + n], MPI.BYTE], p, 5) for a, n in ri[p]]
                for k in range(1, world):
                    p = (rank + k) % world
                    reqs += [comm.Isend([sn[a:a + n], MPI.BYTE], p, 5) for a, n in si[p]]
            for (sa, n), (da, _) in zip(si[rank], ri[rank]):
                dst[da:da + n].copy_(src[sa:sa + n])
            if kind == "gloo":
                for w in works:
                    w.wait()
            else:
                MPI.Request.Waitall(reqs)

    if kind == "mpi":
        def datatypes(items):
            # Per peer, one derived datatype over its items' bytes (hindexed), made once.
            types = []
            for p in range(world):
                its = [(a * rb, n * rb) for a, n in items[p] if a >= 0]
                types.append(MPI.BYTE.Create_hindexed([n for _, n in its],
                                                      [a for a, _ in its]).Commit()
                             if its and p != rank else None)
            return types

        x_types, out_types = datatypes(t.send_items), datatypes(t.recv_items)
    else:
        def rows_of(items):
            return [torch.cat([torch.arange(a, a + n) for a, n in items[p]])
                    if items[p] and p != rank else None for p in range(world)]

        x_rows, out_rows_of = rows_of(t.send_items), rows_of(t.recv_items)
        x_stage = [None if r is None else x.new_empty((len(r), args.hidden)) for r in x_rows]
        out_stage = [None if r is None else x.new_empty((len(r), args.hidden))
                     for r in out_rows_of]

    def bare_per_peer():
        # One message per peer over the same rows as tutti's (x rows <-> output rows, both
        # ways). MPI: a derived datatype per peer on each end, no copy; gloo (which has no
        # datatypes): each peer's rows gathered into a staging tensor, scattered on arrival.
        for src, dst, si, ri, fwd in ((x, out_rows, t.send_items, t.recv_items, True),
                                      (out_rows, grad_x, t.recv_items, t.send_items, False)):
            if kind == "mpi":
                st, rt = (x_types, out_types) if fwd else (out_types, x_types)
                sn, dn, reqs = src.numpy(), dst.numpy(), []
                for k in range(1, world):
                    p = (rank - k) % world
                    if rt[p] is not None:
                        reqs.append(comm.Irecv([dn, 1, rt[p]], p, 6))
                for k in range(1, world):
                    p = (rank + k) % world
                    if st[p] is not None:
                        reqs.append(comm.Isend([sn, 1, st[p]], p, 6))
            else:
                sr, rr = (x_rows, out_rows_of) if fwd else (out_rows_of, x_rows)
                ss, rs = (x_stage, out_stage) if fwd else (out_stage, x_stage)
                ops = []
                for k in range(1, world):
                    p = (rank - k) % world
                    if rr[p] is not None:
                        ops.append(dist.P2POp(dist.irecv, rs[p], p))
                for k in range(1, world):
                    p = (rank + k) % world
                    if sr[p] is not None:
                        torch.index_select(src, 0, sr[p], out=ss[p])
                        ops.append(dist.P2POp(dist.isend, ss[p], p))
                works = dist.batch_isend_irecv(ops) if ops else []
            for (sa, n), (da, _) in zip(si[rank], ri[rank]):
                dst[da:da + n].copy_(src[sa:sa + n])
            if kind == "mpi":
                MPI.Request.Waitall(reqs)
            else:
                for w in works:
                    w.wait()
                for p in range(world):
                    if rr[p] is not None:
                        dst.index_copy_(0, rr[p], rs[p])

    grad = torch.ones(b.num_image_embeds, args.hidden)

    def ours():
        xx = x.detach().requires_grad_()
        tutti.torch.exchange(xx, b).backward(grad)

    def barrier():
        if kind == "gloo":
            dist.barrier()
        else:
            comm.Barrier()

    times = {"bare": [], "tutti": [], "bare_fresh": [], "bare_items": [], "bare_per_peer": []}
    cases = (("bare", lambda: (bare(), bare(reverse=True))), ("tutti", ours),
             ("bare_fresh", lambda: (bare(fresh=True), bare(reverse=True, fresh=True))),
             ("bare_items", bare_items), ("bare_per_peer", bare_per_peer))
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
           "bytes_per_rank": moved,
           "bare_ms": statistics.median(times["bare"]) * 1e3,
           "bare_fresh_ms": statistics.median(times["bare_fresh"]) * 1e3,
           "bare_items_ms": statistics.median(times["bare_items"]) * 1e3,
           "bare_per_peer_ms": statistics.median(times["bare_per_peer"]) * 1e3,
           "tutti_ms": statistics.median(times["tutti"]) * 1e3,
           "repeats": args.repeats, "load_average": list(os.getloadavg())}
    out["tutti_vs_bare_throughput"] = out["bare_ms"] / out["tutti_ms"]
    gathered = [None] * world
    if kind == "gloo":
        dist.all_gather_object(gathered, out)
    else:
        gathered = comm.allgather(out)
    if rank == 0:
        # The slowest rank's medians: an exchange ends when every rank's has.
        worst = max(gathered, key=lambda o: o["tutti_ms"])
        worst_bare = max(o["bare_ms"] for o in gathered)
        worst["bare_ms"] = worst_bare
        worst["bare_fresh_ms"] = max(o["bare_fresh_ms"] for o in gathered)
        worst["bare_items_ms"] = max(o["bare_items_ms"] for o in gathered)
        worst["bare_per_peer_ms"] = max(o["bare_per_peer_ms"] for o in gathered)
        worst["tutti_vs_bare_throughput"] = worst_bare / worst["tutti_ms"]
        worst["tutti_vs_bare_items_throughput"] = worst["bare_items_ms"] / worst["tutti_ms"]
        # What one message per peer over the same rows would give, against bare.
        worst["per_peer_vs_bare_throughput"] = worst_bare / worst["bare_per_peer_ms"]
        print("BENCH " + json.dumps(worst), flush=True)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args, kind):
    me = [sys.executable, "-m", "tutti.torch.bench", "--rank-of", kind, "--images", str(args.images),
          "--hidden", str(args.hidden), "--repeats", str(args.repeats)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if kind == "gloo":
        port = _free_port()
        procs = [subprocess.Popen(me, env=dict(env, RANK=str(r), WORLD_SIZE=str(args.ranks),
                                               LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(args.ranks),
                                               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(args.ranks)]
    else:
        if shutil.which("mpirun") is None:
            return {"case": "exchange_mpi", "error": "mpirun not found"}
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        procs = [subprocess.Popen(["mpirun", "-np", str(args.ranks), "--oversubscribe", "-x",
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
    ap.add_argument("--ranks", type=int, default=4, help="ranks of the exchange cases (default 4)")
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
    results = []
    for case in args.cases.split(","):
        if case == "python_path":
            results.append(python_path(args))
        elif case in ("exchange_gloo", "exchange_mpi"):
            for run in range(args.runs):
                results.append(dict(_launch(args, case.split("_")[1]), run=run + 1))
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
            per_peer = "datatype" if r["case"] == "exchange_mpi" else "staging copy"
            print(f"{r['case']:<16} {r['tutti_ms']:>11.2f} ms {r['bare_ms']:>11.2f} ms "
                  f"{r['tutti_vs_bare_throughput']:>8.3f}  throughput vs bare, run {r['run']}, "
                  f"load {r['load_average'][0]:.1f}, {mb:.1f} MiB per rank fwd+bwd, {r['ranks']} "
                  f"ranks, medians of {r['repeats']}; bare item by item {r['bare_items_ms']:.2f} ms "
                  f"({r['tutti_vs_bare_items_throughput']:.3f}); bare one message per peer "
                  f"({per_peer}) {r['bare_per_peer_ms']:.2f} ms "
                  f"({r['per_peer_vs_bare_throughput']:.3f} of bare)")
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
