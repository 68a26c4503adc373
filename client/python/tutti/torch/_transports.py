"""How tutti.torch.exchange moves rows between ranks: the trainer's own torch.distributed
group (gloo: batch_isend_irecv, NCCL: all_to_all_single), tutti's MPI transport, tutti's
NCCL transport (mpirun), or none (one rank).

Every transport moves contiguous buffers, one message (one all_to_all_single split) per
peer and direction: from plan_version 4 on a pair's rows are one run at both ends
(plan.proto Exchange), so the encoder output is the send buffer as it stands and the rows
arrive grouped by source straight into the exchange's output."""
import datetime
import math
import sys
import threading

import numpy as np
import torch
import torch.distributed as dist

import tutti
from tutti.torch._agree import _DIRECTIONS, Agreement, _error
from tutti.torch._agree import mix64 as _mix64


def _tag(pair, nbytes):
    """A message's tag (31 bits): its pair's hash (which holds the exchange number, step and
    direction) and its size."""
    return _mix64(pair ^ nbytes) & 0x7FFFFFFF


class _HostPool:
    """Host memory for the exchange's outputs, reused from step to step.

    An autograd function returns a new tensor per call; on the CPU each one would be fresh
    pages from the kernel (glibc gives large blocks back when they are freed), a page fault
    per 4 KiB written while the messages arrive, which on a loaded host costs more than
    the copy. Here an output is a view of a block this pool keeps: a block is handed out
    again only once no tensor uses it (the tensor's storage holds a reference to the
    block, so its reference count says so), and at most `keep` idle blocks are kept."""

    def __init__(self, keep=4):
        self.keep = keep
        self.blocks = []
        self.lock = threading.Lock()  # a block is idle until its view exists: one at a time

    def empty(self, shape, dtype, zero=False):
        with self.lock:
            t = self._take(shape, dtype)
        return t.zero_() if zero else t

    def _take(self, shape, dtype):
        nbytes = math.prod(int(d) for d in shape) * torch.empty(0, dtype=dtype).element_size()
        block = None
        idle = [b for b in self.blocks if sys.getrefcount(b) <= 3]  # the list, b, the call
        for b in idle:  # the smallest idle block that holds it
            if b.nbytes >= nbytes and (block is None or b.nbytes < block.nbytes):
                block = b
        if block is None:
            idle.sort(key=lambda b: b.nbytes)
            while len(idle) >= self.keep:  # make room: drop the smallest idle block
                drop = idle.pop(0)
                self.blocks = [b for b in self.blocks if b is not drop]
            block = np.empty(max(nbytes, 1), np.uint8)
            self.blocks.append(block)
        return torch.from_numpy(block[:nbytes]).view(dtype).view(tuple(shape))


class _Transport:
    """Moves one exchange's rows, one contiguous run per peer; subclasses say how (`move`)."""

    rank = 0
    world = 1

    def check_device(self, x, where):
        if x.device.type != "cpu":
            return "INVALID_ARGUMENT", (f"{where}: x is on {x.device} but this transport moves "
                                        "host memory (CPU tensors)")
        return None

    def _empty(self, like, shape, zero=False):
        """An output like `like` (its dtype and device): on the CPU from the host pool."""
        if like.device.type != "cpu":
            return (like.new_zeros if zero else like.new_empty)(shape)
        pool = self.__dict__.get("_pool")
        if pool is None:
            pool = self._pool = _HostPool()
        return pool.empty(shape, like.dtype, zero)

    def forward(self, state, x):
        """x's rows to their LLM ranks; returns the rows this rank receives, grouped by
        source (the exchange's output). x is the send buffer as it stands (the plan groups
        the encoder output by destination); only rows of images this rank's batch lacks (a
        sample its stager dropped) make a send buffer of their own, zeros in their place."""
        t = state.tables
        if t.send_identity:
            send = x.contiguous()
        else:
            send = self._empty(x, (t.send_total, x.shape[1]), zero=True)
            send[t.send_valid.to(x.device)] = x.index_select(0, t.send_index.to(x.device))
        out = self._empty(x, (t.recv_total, x.shape[1]))
        self.move(state.batch, "forward", send, out, t.send_rows, t.recv_rows)
        return out

    def backward(self, state, grad_out):
        """The inverse: gradients of the received rows back to the rows of x."""
        t = state.tables
        grad_out = grad_out.contiguous()
        if t.send_identity:
            grad_x = self._empty(grad_out, state.x_shape)
            self.move(state.batch, "backward", grad_out, grad_x, t.recv_rows, t.send_rows)
            return grad_x
        g_send = self._empty(grad_out, (t.send_total, grad_out.shape[1]))
        self.move(state.batch, "backward", grad_out, g_send, t.recv_rows, t.send_rows)
        grad_x = self._empty(g_send, state.x_shape, zero=True)
        grad_x.index_copy_(0, t.send_index.to(g_send.device),
                           g_send[t.send_valid.to(g_send.device)])
        return grad_x

    def share_flags(self, batch, flags, recv_counts, move):
        """move None: whether any rank has a flag set (collective). move True: peer p's
        flags for this rank, given this rank's flags[p] for p (uint8 arrays)."""
        if move is None:
            return True  # no cheap "any" here: always move
        return self._move_flags(batch, flags, recv_counts)

    def _move_flags(self, batch, flags, recv_counts):
        raise NotImplementedError


class LocalTransport(_Transport):
    """A world of one rank: every row stays here."""

    def refuse(self, batch, refusal):
        raise _error(refusal[0], refusal[1])

    def move(self, batch, direction, send, recv, send_rows, recv_rows):
        recv.copy_(send)


class TorchTransport(_Transport):
    """The trainer's torch.distributed group: gloo (CPU tensors, batch_isend_irecv; gloo's
    all_to_all_single takes equal splits only) or NCCL (CUDA tensors, all_to_all_single).
    The agreement runs over a gloo group of the same ranks with `timeout_s`."""

    def __init__(self, group=None, timeout_s=600.0):
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        self.backend = str(dist.get_backend(self.group))
        self.timeout_s = timeout_s
        ranks = list(range(dist.get_world_size()))
        control = dist.new_group(ranks=ranks, backend="gloo",
                                 timeout=datetime.timedelta(seconds=timeout_s))
        try:
            store = dist.distributed_c10d._get_default_store()
        except (AttributeError, RuntimeError):
            store = None
        self.agreement = Agreement(control, self.rank, self.world, timeout_s, store)
        self._abandoned = []  # messages of exchanges that failed, kept with their memory
        # Messages this rank sent to each rank in its latest exchange.
        self.messages_sent_to = [0] * self.world
        if self.backend == "nccl":
            warm = torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(warm, group=self.group)  # NCCL's communicator, made by every rank

    def check_device(self, x, where):
        want = "cuda" if self.backend == "nccl" else "cpu"
        if x.device.type != want:
            return "INVALID_ARGUMENT", (f"{where}: x is on {x.device} but the process group's "
                                        f"backend ({self.backend}) moves {want} tensors")
        return None

    def refuse(self, batch, refusal):
        self.agreement.agree(batch.step, "forward", [0] * self.world, [0] * self.world, refusal)

    def move(self, batch, direction, send, recv, send_rows, recv_rows):
        """One message per peer, straight from `send`'s rows into `recv`'s. NCCL: the
        agreement, then one uneven all_to_all_single (NCCL cannot withdraw a message).
        gloo: the agreement's all-reduce is started first and the messages are posted behind
        it, waited for only once it holds, so that it overlaps the transfer instead of
        preceding it and is not held up behind the bytes. Each message's tag hashes the
        exchange number, step, direction, the pair and the message's size: a message of
        another exchange, or one the two ends size differently, matches nothing (no wrong
        rows, no size error) and stays pending, while the agreement fails every rank with
        the reason. `recv` is a fresh output: written before the verdict, read after it."""
        rb = send.shape[1] * send.element_size() if send.dim() == 2 else 0
        t = batch._tables()
        counts = ([n * rb for n in send_rows], [n * rb for n in recv_rows])
        hashes = (t.item_hashes(direction, "send"), t.item_hashes(direction, "recv"))
        if self.backend == "nccl":
            self.agreement.agree(batch.step, direction, *counts, send_items=hashes[0],
                                 recv_items=hashes[1])
            dist.all_to_all_single(recv, send, output_split_sizes=list(recv_rows),
                                   input_split_sizes=list(send_rows), group=self.group)
            self.messages_sent_to = [int(n > 0 and p != self.rank)
                                     for p, n in enumerate(send_rows)]
            return
        finish = self.agreement.begin(batch.step, direction, *counts, send_items=hashes[0],
                                      recv_items=hashes[1])
        base = _mix64(_mix64(self.agreement.seq) ^ _mix64(batch.step) ^ _DIRECTIONS[direction])
        s_off = np.concatenate([[0], np.cumsum(send_rows)]).astype(np.int64)
        r_off = np.concatenate([[0], np.cumsum(recv_rows)]).astype(np.int64)
        me, ops = self.rank, []
        for k in range(1, self.world):  # receives first, each rank from a different peer
            p = (me - k) % self.world
            if recv_rows[p]:
                pair = _mix64(base ^ (p << 32 | me))
                ops.append(dist.P2POp(dist.irecv, recv[r_off[p]:r_off[p + 1]], p, self.group,
                                      _tag(pair, int(recv_rows[p]) * rb)))
        sent = [0] * self.world
        for k in range(1, self.world):
            p = (me + k) % self.world
            if send_rows[p]:
                pair = _mix64(base ^ (me << 32 | p))
                ops.append(dist.P2POp(dist.isend, send[s_off[p]:s_off[p + 1]], p, self.group,
                                      _tag(pair, int(send_rows[p]) * rb)))
                sent[p] = 1
        works = dist.batch_isend_irecv(ops) if ops else []
        self.messages_sent_to = sent
        if send_rows[me]:
            recv[r_off[me]:r_off[me + 1]].copy_(send[s_off[me]:s_off[me + 1]])
        try:
            finish()
        except tutti.Error:
            # Messages with a rank that refused or disagrees never complete; their memory is
            # kept (a late peer could still read or write it), their tags are never reused.
            self._abandoned.append((works, send, recv))
            raise
        self._wait_works(batch, direction, works)

    def _wait(self, batch, direction, ops):
        self._wait_works(batch, direction, dist.batch_isend_irecv(ops) if ops else [])

    def _wait_works(self, batch, direction, works):
        try:
            for work in works:
                work.wait(datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as e:
            self.agreement.broken = ("an earlier exchange timed out while moving data; this "
                                     "transport refuses further exchanges: stop the job")
            raise _error("DEADLINE_EXCEEDED", (
                f"{self.agreement.where(batch.step, direction)}: the other ranks did not complete "
                f"the exchange within {self.timeout_s:g} s (a rank crashed or arrived too late); "
                "the received rows are incomplete; stop the job")) from e

    def share_flags(self, batch, flags, recv_counts, move):
        if move is None:  # one small all-reduce when (as usual) no rank skipped an image
            return self.agreement.any(batch.step, "skipped-images",
                                      any(f.any() for f in flags.values()))
        send_counts = [len(flags.get(p, ())) for p in range(self.world)]
        recv = {p: torch.zeros(n, dtype=torch.uint8) for p, n in recv_counts.items() if n}
        self.agreement.agree(batch.step, "skipped-images", send_counts,
                             [recv_counts.get(p, 0) for p in range(self.world)])
        group = self.agreement.group  # gloo, CPU tensors, whatever the data's backend
        ops = [dist.P2POp(dist.irecv, t, p, group) for p, t in recv.items()]
        ops += [dist.P2POp(dist.isend, torch.from_numpy(f), p, group)
                for p, f in flags.items() if len(f)]
        self._wait(batch, "skipped-images", ops)
        return {p: recv[p].numpy() if p in recv else np.zeros(0, np.uint8) for p in recv_counts}


class MpiTransport(_Transport):
    """tutti's MPI transport (mpirun): the C++ client's agreement and byte checks, the plan
    handed over as the bytes the stager sent, the vision encoder's items."""

    def __init__(self, timeout_s=600.0, device=None):
        self.impl = tutti.MpiTransport(join_timeout=timeout_s)
        self.rank, self.world = self.impl.rank, self.impl.world_size
        self._abandoned = []  # memory of exchanges that timed out (a late peer may use it)

    @property
    def messages_sent_to(self):
        return list(self.impl.messages_sent_to)

    def refuse(self, batch, refusal):
        empty = self._host(np.zeros(0, np.uint8))
        self.impl.exchange(batch._layout.plan_bytes, self._bytes(empty), self._bytes(empty),
                           step=batch.step, world_size=batch.world_size, refusal=refusal[1],
                           refusal_code=refusal[0], encoder="vision")

    @staticmethod
    def _bytes(t):
        return t.detach().view(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)

    @staticmethod
    def _host(a):
        return torch.from_numpy(a)

    def _move_flags(self, batch, flags, recv_counts):
        # An exchange of its own: one item per peer, the flags' bytes.
        send_counts = [len(flags.get(p, ())) for p in range(self.world)]
        recv_list = [recv_counts.get(p, 0) for p in range(self.world)]
        plan = tutti.counts_plan(batch.rank, send_counts, recv_list)
        send = [flags[p] for p in range(self.world) if send_counts[p]]
        send = self._host(np.concatenate(send) if send else np.zeros(0, np.uint8))
        recv = self._host(np.zeros(sum(recv_list), np.uint8))
        self.impl.exchange(plan, self._bytes(send), self._bytes(recv), step=batch.step,
                           world_size=batch.world_size)
        got, at = {}, 0
        recv = recv.cpu().numpy()
        for p, n in sorted(recv_counts.items()):
            got[p] = recv[at:at + n]
            at += n
        return got

    def _kept(self, run, *tensors):
        """Runs an exchange whose receive memory is scratch; after a timeout a late peer may
        still read or write `tensors`, so they are kept for the rest of the process."""
        try:
            run()
        except tutti.DeadlineExceededError:
            self._abandoned.append(tensors)
            raise

    def move(self, batch, direction, send, recv, send_rows, recv_rows):
        # `recv` is a fresh output, read only when the exchange succeeds (scratch): the
        # receives are posted with the sends, so that the data moves while the ranks agree.
        f = self.impl.exchange if direction == "forward" else self.impl.exchange_backward
        self._kept(lambda: f(batch._layout.plan_bytes, self._bytes(send), self._bytes(recv),
                             step=batch.step, world_size=batch.world_size, scratch_recv=True,
                             encoder="vision"), send, recv)


class NcclTransport(MpiTransport):
    """tutti's NCCL transport on CUDA tensors (mpirun; one rank per GPU): one ncclSend and
    one ncclRecv per peer."""

    def __init__(self, timeout_s=600.0, device=0):
        if not tutti.HAVE_NCCL:
            raise tutti.FailedPreconditionError(
                "transport='nccl' needs tutti built with CUDA and NCCL (cmake -DTUTTI_WITH_CUDA=ON)"
                "; or use the trainer's NCCL process group (transport='torch')")
        self.impl = tutti.NcclTransport(device=device, join_timeout=timeout_s)
        self.rank, self.world = self.impl.rank, self.impl.world_size
        self._abandoned = []

    @property
    def messages_sent_to(self):
        return list(self.impl.messages_sent_to)

    def check_device(self, x, where):
        if x.device.type != "cuda":
            return "INVALID_ARGUMENT", f"{where}: x is on {x.device}; the NCCL transport moves CUDA tensors"
        return None

    @staticmethod
    def _bytes(t):
        return t.detach().reshape(-1).view(torch.uint8)

    @staticmethod
    def _host(a):  # the NCCL transport moves device memory only
        return torch.from_numpy(a).cuda()
