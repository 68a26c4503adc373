"""The cross-rank agreement before an exchange moves data over torch.distributed:
the same check the C++ transports run (every pair of ranks agrees on the
bytes between them, every rank is at the same exchange, step and direction,
no rank refused its input), over a gloo group with a deadline. A mismatch
fails every rank with the same message; a rank that never arrives is named."""
import datetime
import time

import numpy as np
import torch
import torch.distributed as dist

import tutti

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_DIRECTIONS = {"forward": 0, "backward": 1, "skipped-images": 2}
_REFUSED = np.uint64(0x5455545449524653)  # "TUTTIRFS"


def _mix(x):
    """splitmix64 over a uint64 array."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


_M64_INT = (1 << 64) - 1


def mix64(x):
    """splitmix64 of a Python int."""
    x = (x + 0x9E3779B97F4A7C15) & _M64_INT
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64_INT
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64_INT
    return x ^ (x >> 31)


def _pair_hashes(frm, to, nbytes, items, context):
    """Hash of "rank frm moves nbytes to rank to, split into items as `items` (the C++
    layout's item hash of the pair, tutti.exchange_layout) says, in this exchange"
    (arrays)."""
    h = _mix((frm.astype(np.uint64) << np.uint64(32)) | to.astype(np.uint64))
    h = _mix(h ^ nbytes.astype(np.uint64))
    h = _mix(h ^ items)
    for c in context:
        h = _mix(h ^ np.uint64(c & 0xFFFFFFFFFFFFFFFF))
    return h


def _error(code, message):
    cls = {
        "INVALID_ARGUMENT": tutti.InvalidArgumentError,
        "FAILED_PRECONDITION": tutti.FailedPreconditionError,
        "DEADLINE_EXCEEDED": tutti.DeadlineExceededError,
        "DATA_LOSS": tutti.DataLossError,
    }.get(code, tutti.Error)
    err = cls(message)
    err.code = code
    return err


def _ranks(rs):
    shown = ", ".join(str(r) for r in rs[:16])
    return shown + (f" and {len(rs) - 16} more" if len(rs) > 16 else "")


class Agreement:
    """Runs the agreement of every exchange of one transport (numbered from 1)."""

    def __init__(self, group, rank, world, timeout_s, store=None, name="tutti"):
        self.group, self.rank, self.world = group, rank, world
        self.timeout_s = timeout_s
        self.store = store
        self.name = name
        self.seq = 0
        self.broken = None

    def where(self, step, direction):
        return f"step {step}, {direction} exchange #{self.seq}"

    def agree(self, step, direction, send_counts, recv_counts, refusal=None, send_items=None,
              recv_items=None):
        """refusal: None or (code name, message). send_items / recv_items: per peer, the
        hash of the pair's split into items, as tutti.exchange_layout gives it (None: not
        compared). Raises tutti.Error on every rank alike."""
        self.begin(step, direction, send_counts, recv_counts, refusal, send_items,
                   recv_items)()

    def begin(self, step, direction, send_counts, recv_counts, refusal=None, send_items=None,
              recv_items=None):
        """agree() in two halves: starts the all-reduce of this rank's summary and returns
        the function that waits for it and raises as agree() does. What a rank does in
        between (posting its messages) overlaps the all-reduce instead of delaying it."""
        if self.broken is not None:
            raise _error("FAILED_PRECONDITION", self.broken)
        self.seq += 1
        peers = np.arange(self.world, dtype=np.uint64)
        me = np.full(self.world, self.rank, dtype=np.uint64)
        context = (self.seq, step, _DIRECTIONS[direction], self.world)
        send = np.asarray(send_counts, np.uint64)
        recv = np.asarray(recv_counts, np.uint64)
        send_items = [0] * self.world if send_items is None else list(send_items)
        recv_items = [0] * self.world if recv_items is None else list(recv_items)
        h = np.bitwise_xor.reduce(
            _pair_hashes(me, peers, send, np.asarray(send_items, np.uint64), context) ^
            _pair_hashes(peers, me, recv, np.asarray(recv_items, np.uint64), context))
        if refusal is not None:
            h ^= _mix(np.asarray([_REFUSED ^ np.uint64(self.rank)]))[0]
        summary = torch.tensor([int(h.astype(np.int64))], dtype=torch.int64)
        work = None
        if self.world > 1:
            try:
                work = dist.all_reduce(summary, op=dist.ReduceOp.BXOR, group=self.group,
                                       async_op=True)
            except RuntimeError as e:
                self._timed_out(step, direction, "join the exchange", e)

        def finish():
            if work is not None:
                try:
                    work.wait()
                except RuntimeError as e:
                    self._timed_out(step, direction, "join the exchange", e)
            if int(summary[0]) == 0:  # every rank sees the same sum: all agree, or none does
                if refusal is not None:
                    raise _error(refusal[0], f"{self.where(step, direction)}: {refusal[1]}")
                return
            self._detail(step, direction, send_counts, recv_counts, refusal, send_items,
                         recv_items)

        return finish

    def any(self, step, what, flag):
        """Whether any rank's flag is set (a MAX all-reduce within the deadline)."""
        value = torch.tensor([1 if flag else 0], dtype=torch.int64)
        if self.world > 1:
            if self.broken is not None:
                raise _error("FAILED_PRECONDITION", self.broken)
            try:
                dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.group)
            except RuntimeError as e:
                self.seq += 1  # the roll call's key: one no other exchange uses
                self._timed_out(step, what, "take the same step's batch", e)
        return bool(value[0])

    def _detail(self, step, direction, send_counts, recv_counts, refusal, send_items,
                recv_items):
        mine = {"rank": self.rank, "seq": self.seq, "step": step, "direction": direction,
                "world": self.world, "refusal": refusal, "send": list(map(int, send_counts)),
                "recv": list(map(int, recv_counts)), "send_items": send_items,
                "recv_items": recv_items}
        everyone = [None] * self.world
        if self.world > 1:
            try:
                dist.all_gather_object(everyone, mine, group=self.group)
            except RuntimeError as e:
                self._timed_out(step, direction, "confirm the exchange", e)
        else:
            everyone = [mine]
        code, message = verdict(everyone)
        if code is not None:
            raise _error(code, message)

    def _timed_out(self, step, direction, stage, cause):
        where = self.where(step, direction)
        missing = []
        if self.store is not None:
            # Roll call: every rank that gave up says so; the others are missing.
            prefix = f"{self.name}/gave-up/{self.seq}/"
            try:
                self.store.set(prefix + str(self.rank), "1")
                # The others gave up at about the same time (the same deadline): a grace
                # period, then whoever has not said so is missing.
                time.sleep(min(5.0, self.timeout_s / 4))
                for r in range(self.world):
                    try:
                        self.store.wait([prefix + str(r)], datetime.timedelta(milliseconds=20))
                    except RuntimeError:
                        missing.append(r)
            except RuntimeError:
                missing = []
        self.broken = (f"an earlier exchange ({where}) timed out; messages of it may still be in "
                       "flight, so this transport refuses further exchanges: stop the job")
        who = _ranks(missing) if missing else "?"
        raise _error("DEADLINE_EXCEEDED", (
            f"{where}: rank(s) {who} did not {stage} within {self.timeout_s:g} s (crashed, stuck, "
            f"or calling exchange a different number of times); stop the job")) from cause


def verdict(everyone):
    """(code, message) that every rank computes alike from all ranks' views,
    or (None, None) when they agree."""
    head = everyone[0]
    where = f"step {head['step']}, {head['direction']} exchange #{head['seq']}"
    refused = [v for v in everyone if v["refusal"] is not None]
    if refused:
        first = refused[0]
        others = f" (ranks {_ranks([v['rank'] for v in refused[1:]])} refused too)" if len(refused) > 1 else ""
        return first["refusal"][0], (f"{where}: rank {first['rank']} refused the exchange: "
                                     f"{first['refusal'][1]}{others}")
    for key, what in (("seq", "exchange #"), ("direction", ""), ("step", "step ")):
        values = sorted({v[key] for v in everyone}, key=str)
        if len(values) > 1:
            a = next(v for v in everyone if v[key] == values[0])
            b = next(v for v in everyone if v[key] == values[1])
            if key == "seq":
                why = ("the ranks called exchange a different number of times (did a rank skip "
                       "an exchange, or run one more?)")
            elif key == "direction":
                why = "the ranks run different directions"
            else:
                why = "the ranks exchange different steps' batches (a rank skipped a step?)"
            return "FAILED_PRECONDITION", (f"{where}: rank {a['rank']} is at {what}{a[key]} but "
                                           f"rank {b['rank']} at {what}{b[key]}: {why}")
    for v in everyone:
        for peer, n in enumerate(v["send"]):
            expect = everyone[peer]["recv"][v["rank"]]
            if n != expect:
                return "FAILED_PRECONDITION", (
                    f"{where}: rank {v['rank']} sends {n} bytes to rank {peer} but rank {peer}'s "
                    f"plan expects {expect} from it: the ranks' plans disagree (different steps or "
                    "jobs, or a corrupt plan)")
    for v in everyone:
        for peer, h in enumerate(v["send_items"]):
            if h != everyone[peer]["recv_items"][v["rank"]]:
                return "FAILED_PRECONDITION", (
                    f"{where}: rank {v['rank']} splits the {v['send'][peer]} bytes it sends to "
                    f"rank {peer} into other items than rank {peer}'s plan: the ranks' plans "
                    "disagree (different steps or jobs, or a corrupt plan)")
    return None, None
