"""Exchanges between real ranks from Python: run under mpirun (ctest
client_python_mpi). Every rank builds the same random, consistent plan for the
whole job, fills numpy send buffers with per-item patterns, and checks every
byte it receives, forward and backward. Exits non-zero on any wrong byte."""
import sys

import numpy as np

import tutti


def plans(world, seed, max_bytes):
    rng = np.random.default_rng(seed)
    items = {}  # (src, dst) -> [(sample_id, bytes)]
    sid = seed * 100000
    for src in range(world):
        for dst in range(world):
            if rng.random() < 0.25:
                continue
            its = []
            for _ in range(int(rng.integers(1, 4))):
                its.append((sid, int(rng.integers(0, max_bytes + 1))))
                sid += 1
            items[src, dst] = its

    def transfer(peer, its):
        return {"peer": peer, "bytes": sum(b for _, b in its),
                "items": [{"sample_id": s, "bytes": b} for s, b in its]}

    out = []
    for r in range(world):
        sends = [transfer(p, items[r, p]) for p in range(world) if (r, p) in items]
        recvs = [transfer(p, items[p, r]) for p in range(world) if (p, r) in items]
        out.append({"rank": r, "plan_version": 4,
                    "exchange": {"sends": sends, "recvs": recvs,
                                 "send_bytes": sum(t["bytes"] for t in sends),
                                 "recv_bytes": sum(t["bytes"] for t in recvs)}})
    return out


def fill(transfers, salt):
    parts = [((s["sample_id"] * 31 + salt + np.arange(s["bytes"])) % 251).astype(np.uint8)
             for t in transfers for s in t["items"]]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def main():
    failures = 0
    for max_count in (None, 100):  # 100: the derived-datatype path for large counts
        t = tutti.MpiTransport(join_timeout=30, max_count=max_count)
        for seed in range(1, 9):
            plan = plans(t.world_size, seed, 3000)[t.rank]
            ex = plan["exchange"]
            plan = tutti.plan_bytes(plan) if seed % 2 else plan  # bytes or a dict
            recv = np.zeros(ex["recv_bytes"], np.uint8)
            t.exchange(plan, fill(ex["sends"], 0), recv, step=seed, world_size=t.world_size)
            failures += not np.array_equal(recv, fill(ex["recvs"], 0))
            # One message to each peer the plan gives bytes.
            want = [0] * t.world_size
            for tr in ex["sends"]:
                want[tr["peer"]] = int(tr["bytes"] > 0 and tr["peer"] != t.rank)
            if max_count is None:
                failures += list(t.messages_sent_to) != want
            back = np.zeros(ex["send_bytes"], np.uint8)
            t.exchange_backward(plan, fill(ex["recvs"], 7), back, step=seed)
            failures += not np.array_equal(back, fill(ex["sends"], 7))
        if max_count is not None and t.large_exchanges == 0:
            failures += 1
    if failures:
        print(f"rank {t.rank}: {failures} exchanges delivered wrong bytes", file=sys.stderr)
    elif t.rank == 0:
        print(f"{t.world_size} ranks: 32 exchanges from Python, every byte verified")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
