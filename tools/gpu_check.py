"""GPU part of tools/gpu_check.sh (run under `mpirun -np 1`, PYTHONPATH=<build>/python):
tutti.NcclTransport with torch CUDA tensors (one ncclSend per peer, each encoder's exchange
straight from its output, a plan older than plan_version 4 refused), its errors, its
throughput, and a ViT forward timing fitted to the cost model. With --example (TUTTI_BUILD_DIR=<build>): the example
trainer under torchrun with NCCL, one rank per GPU, against daemons started here; the loss
must fall over 10 steps. Exits non-zero on any failed check."""
import argparse
import os
import sys
import time

import numpy as np

import tutti

failures = 0


def check(name, ok, detail=""):
    global failures
    print(("PASS " if ok else "FAIL ") + name + (f": {detail}" if detail else ""))
    failures += 0 if ok else 1


def self_plan(sizes, key="exchange", audio=()):
    """A world-of-one plan (plan_version 4) sending itself images of `sizes` bytes, then
    audio clips of `audio` bytes, its encoder phases in the order of the sends."""
    items = [{"sample_id": 100 + i, "encoder": "ENCODER_VISION", "index": i, "bytes": b}
             for i, b in enumerate(sizes)]
    items += [{"sample_id": 200 + i, "encoder": "ENCODER_AUDIO", "index": i, "bytes": b}
              for i, b in enumerate(audio)]
    total = sum(sizes) + sum(audio)
    return {"rank": 0, "plan_version": 4,
            "encoders": [{"encoder": "ENCODER_VISION",
                          "images": [{"sample_id": 100 + i, "image_index": i}
                                     for i in range(len(sizes))]},
                         {"encoder": "ENCODER_AUDIO",
                          "audio": [{"sample_id": 200 + i, "audio_index": i}
                                    for i in range(len(audio))]}],
            key: {"sends": [{"peer": 0, "bytes": total, "items": items}],
                  "recvs": [{"peer": 0, "bytes": total, "items": items}],
                  "send_bytes": total, "recv_bytes": total}}


def main():
    if not tutti.HAVE_NCCL:
        check("tutti built with NCCL", False, "tutti.HAVE_NCCL is False")
        return
    try:
        import torch
    except ImportError:
        print("SKIP PyTorch is not installed: no CUDA tensor checks")
        return
    if not torch.cuda.is_available():
        check("torch sees a GPU", False)
        return
    dev = torch.device("cuda", 0)
    t = tutti.NcclTransport(device=0, join_timeout=60)
    check("world of one", (t.rank, t.world_size) == (0, 1), f"{t.rank}/{t.world_size}")

    sizes = [1000, 1 << 20, 12345]
    n = sum(sizes)
    send = (torch.arange(n, device=dev) % 251).to(torch.uint8)
    recv = torch.zeros(n, dtype=torch.uint8, device=dev)
    t.exchange(self_plan(sizes), send, recv, step=1, world_size=1)
    check("forward: every byte", torch.equal(send, recv))
    grad = (torch.arange(n, device=dev) % 241).to(torch.uint8)
    back = torch.zeros(n, dtype=torch.uint8, device=dev)
    t.exchange_backward(self_plan(sizes), grad, back, step=1)
    check("backward: every byte", torch.equal(grad, back))
    check("one ncclSend per peer (its own part too)", list(t.messages_sent_to) == [1],
          str(list(t.messages_sent_to)))
    # Each encoder's exchange straight from its output (plan_version 4: the output is grouped
    # by destination), as bytes of the plan converted once.
    plan = tutti.plan_bytes(self_plan([3000, 5000], audio=[700]))
    vision = (torch.arange(8000, device=dev) % 239).to(torch.uint8)
    got = torch.zeros_like(vision)
    t.exchange(plan, vision, got, step=2, world_size=1, encoder="vision")
    audio = (torch.arange(700, device=dev) % 233).to(torch.uint8)
    got_audio = torch.zeros_like(audio)
    t.exchange_backward(plan, audio, got_audio, step=2, world_size=1, encoder="audio")
    check("each encoder's own output, forward and backward",
          torch.equal(vision, got) and torch.equal(audio, got_audio))
    old = self_plan(sizes)
    old["plan_version"] = 3
    try:
        t.exchange(old, send, recv)
        check("a plan_version 3 plan refused", False)
    except tutti.FailedPreconditionError as e:
        check("a plan_version 3 plan refused", "needs plan_version 4" in str(e), str(e)[:120])
    emb = torch.randn(n // 2, dtype=torch.bfloat16, device=dev)  # bf16 embeddings, bytes counted
    out = torch.empty_like(emb)
    t.exchange_load(self_plan([emb.numel() * emb.element_size()], "load_exchange"), emb, out)
    check("load exchange with bf16 tensors", torch.equal(emb, out))

    try:
        t.exchange(self_plan(sizes), send[:-1], recv)
        check("size mismatch refused", False)
    except tutti.InvalidArgumentError as e:
        check("size mismatch refused", "send buffer size mismatch" in str(e), str(e)[:120])
    try:
        t.exchange(self_plan(sizes), np.zeros(n, np.uint8), recv)
        check("host buffer refused by NCCL", False)
    except tutti.InvalidArgumentError as e:
        check("host buffer refused by NCCL", "host memory" in str(e), str(e)[:120])
    try:
        tutti.MpiTransport().exchange(self_plan(sizes), send, recv)
        check("CUDA tensor refused by MPI", False)
    except tutti.InvalidArgumentError as e:
        check("CUDA tensor refused by MPI", "NcclTransport" in str(e), str(e)[:120])

    # Throughput of a 256 MiB self exchange against a device copy.
    big = 256 << 20
    a = torch.empty(big, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    plan = self_plan([big // 4] * 4)
    for _ in range(2):
        t.exchange(plan, a, b)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        t.exchange(plan, a, b)
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    copies = []
    for _ in range(5):
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        copies.append(time.perf_counter() - t0)
    ex, cp = sorted(times)[2], sorted(copies)[2]
    print(f"256 MiB self exchange: {big / ex / 1e9:.1f} GB/s through NCCL (median {ex * 1e3:.2f} ms), "
          f"device copy {big / cp / 1e9:.1f} GB/s")

    # A ViT-like encoder forward (bf16, 4 layers, hidden 1280, 16 heads) on p patches:
    # fit time = a*p + b*p^2, the form of the ViT cost model (p_ref = a / b).
    layer = torch.nn.TransformerEncoderLayer(1280, 16, 5120, batch_first=True, dtype=torch.bfloat16,
                                             device=dev, norm_first=True)
    vit = torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).eval()
    ps, ts = [], []
    with torch.no_grad():
        for p in (256, 1024, 2048, 4096, 8192, 16384):
            x = torch.randn(1, p, 1280, dtype=torch.bfloat16, device=dev)
            vit(x)
            torch.cuda.synchronize()
            runs = []
            for _ in range(3):
                t0 = time.perf_counter()
                vit(x)
                torch.cuda.synchronize()
                runs.append(time.perf_counter() - t0)
            ps.append(p)
            ts.append(sorted(runs)[1])
    A = np.array([[p, p * p] for p in ps], dtype=float)
    (coef_a, coef_b), *_ = np.linalg.lstsq(A, np.array(ts), rcond=None)
    for p, s in zip(ps, ts):
        fit = coef_a * p + coef_b * p * p
        print(f"  ViT forward p={p:6d}: {s * 1e3:8.3f} ms (fit {fit * 1e3:8.3f} ms)")
    p_ref = coef_a / coef_b if coef_b > 0 else float("inf")
    print(f"ViT cost fit: {coef_a * 1e6:.3f} us/patch + {coef_b * 1e9:.4f} ns/patch^2 -> p_ref {p_ref:.0f}")
    check("ViT timing grows with patches", ts[-1] > ts[0])


def example(ranks):
    """The example trainer with NCCL against a packer and a stager started here."""
    here = os.path.dirname(os.path.abspath(__file__))
    tests = os.path.join(here, "..", "client", "python", "tests")
    sys.path.insert(0, tests)
    import cluster  # the torch tests' job on this machine

    with cluster.cluster(post=True, nodes=1, per_node=ranks) as c:
        rc, out = cluster.torchrun(c, os.path.join(cluster.EXAMPLES, "train_vlm.py"),
                                   ["--steps", "10"], timeout=100)
    losses = [float(x.split('"loss": ')[1].split(",")[0]) for x in out.splitlines() if '"loss": ' in x]
    print("\n".join(line for line in out.splitlines() if '"step"' in line))
    check("example trainer with NCCL ran 10 steps", rc == 0 and len(losses) == 10,
          out[-1500:] if rc else "")
    if len(losses) == 10:
        check("its loss falls", sum(losses[-3:]) / 3 < sum(losses[:3]) / 3,
              f"first {losses[0]:.4f}, last {losses[-1]:.4f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--example", action="store_true")
    ap.add_argument("--ranks", type=int, default=1)
    a = ap.parse_args()
    if a.example:
        example(a.ranks)
    else:
        main()
    sys.exit(1 if failures else 0)
