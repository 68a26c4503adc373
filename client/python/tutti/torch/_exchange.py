"""tutti.torch.exchange: the step plan's all-to-all as an autograd function.

Forward moves each encoder output row from the rank that encoded the image
to the rank whose LLM documents hold it, and returns the rows in the order
the image tokens appear in that rank's input_ids (so HF-style code can
masked_scatter them, or MicroBatch.scatter_image_embeds places them); the
backward pass runs the inverse exchange. Transports: the trainer's own
torch.distributed group (gloo: batch_isend_irecv, NCCL: all_to_all_single),
tutti's MPI transport, tutti's NCCL transport (mpirun), or none (one rank)."""
import datetime
import math
import sys
import threading

import numpy as np
import torch
import torch.distributed as dist

import tutti
from tutti.torch._agree import _DIRECTIONS, Agreement, _error, item_sizes_hash
from tutti.torch._agree import mix64 as _mix64


def _tag(pair, index, nbytes):
    """A message's tag (31 bits): 19 of its pair's hash and its size, then its place in the
    pair's list (12 bits; beyond 4096 items, equal tags are matched in posting order)."""
    return (_mix64(pair ^ nbytes) & 0x7FFFF) << 12 | (index & 0xFFF)


class _Tables:
    """Row maps of one batch's exchange: send-buffer row -> x row (-1: a dropped
    image, zeros), receive-buffer row -> output row, rows per peer."""

    def __init__(self, batch):
        L = batch._layout
        ex = L.plan.get("exchange") or {}
        where = f"step {batch.step}, rank {batch.rank}"
        self.layout = tutti.exchange_layout(L.plan, "forward", batch.rank, L.world_size,
                                            step=batch.step, plan_world_size=L.world_size)
        rb = L.row_bytes

        def rows_of(item):
            if item.get("encoder") != "ENCODER_VISION":
                raise _error("FAILED_PRECONDITION", (
                    f"{where}: the plan exchanges {item.get('encoder')} encoder outputs; "
                    "tutti.torch.exchange carries image embeddings only (use tutti.MpiTransport "
                    "with the plan for other encoders)"))
            n = int(item["bytes"])
            if n % rb:
                raise _error("DATA_LOSS", f"{where}: an exchange item of {n} bytes is not a whole "
                                          f"number of {rb}-byte rows")
            return n // rb

        def runs_of(t, what):
            runs = [int(n) for n in t.get("runs") or ()]
            if runs and (min(runs) < 1 or sum(runs) != len(t["items"])):
                raise _error("DATA_LOSS", (
                    f"{where}: the plan's {what} to/from peer {t['peer']} has "
                    f"{len(t['items'])} items but runs {runs} (a corrupt plan)"))
            return runs

        send_index, self.send_rows = [], [0] * L.world_size
        # Per peer, each item's rows: (first row in x or in the output, rows); -1 = none here.
        self.send_items = [[] for _ in range(L.world_size)]
        self.recv_items = [[] for _ in range(L.world_size)]
        # Per peer, how many consecutive items move as one message (plan.proto Transfer.runs).
        self.send_runs = [[] for _ in range(L.world_size)]
        self.recv_runs = [[] for _ in range(L.world_size)]
        for t in ex.get("sends") or []:
            self.send_runs[int(t["peer"])] = runs_of(t, "sends")
            for item in t["items"]:
                n = rows_of(item)
                key = (int(item["sample_id"]), int(item.get("index") or 0))
                at = L.enc_rows.get(key)
                if at is not None and at[1] != n:
                    raise _error("DATA_LOSS", f"{where}: image {key} has {at[1]} rows in the batch "
                                              f"but {n} in the plan's exchange")
                send_index.append(np.arange(at[0], at[0] + n) if at else np.full(n, -1))
                self.send_rows[int(t["peer"])] += n
                self.send_items[int(t["peer"])].append((at[0] if at else -1, n))
        recv_at, self.recv_rows, offset = {}, [0] * L.world_size, 0
        for t in ex.get("recvs") or []:
            self.recv_runs[int(t["peer"])] = runs_of(t, "receives")
            for item in t["items"]:
                n = rows_of(item)
                recv_at[(int(item["sample_id"]), int(item.get("index") or 0))] = (offset, n)
                offset += n
                self.recv_rows[int(t["peer"])] += n
                self.recv_items[int(t["peer"])].append(
                    (int(item["sample_id"]), int(item.get("index") or 0), n))
        self.recv_total = offset
        out, out_at, row = [], {}, 0
        for sid, index, _, _, n in L.llm_images:
            out_at[(sid, index)] = row
            row += n
            at = recv_at.get((sid, index))
            if at is None or at[1] != n:
                raise _error("DATA_LOSS", f"{where}: image {index} of sample {sid} is in this rank's "
                                          "documents but the plan's exchange does not bring it")
            out.append(np.arange(at[0], at[0] + n))
        self.recv_items = [[(out_at.get((sid, index), -1), n) for sid, index, n in items]
                           for items in self.recv_items]
        self.out_total = row
        self.send_covers_x = sorted(a for items in self.send_items for a, n in items
                                    if a >= 0) == sorted(a for a, _ in L.enc_rows.values()) and \
            all(a >= 0 for items in self.send_items for a, _ in items)
        idx = np.concatenate(send_index) if send_index else np.zeros(0, np.int64)
        self.send_total = len(idx)
        self.send_identity = len(idx) == L.enc_total and np.array_equal(idx, np.arange(len(idx)))
        self.send_valid = idx >= 0
        self.send_all_valid = bool(self.send_valid.all())
        self.send_index = torch.from_numpy(idx.astype(np.int64))
        oi = np.concatenate(out) if out else np.zeros(0, np.int64)
        self.out_identity = len(oi) == offset and np.array_equal(oi, np.arange(offset))
        self.out_index = torch.from_numpy(oi.astype(np.int64))
        self.enc_total = L.enc_total
        self.row_bytes = rb
        self._cached = {}  # byte_offsets and item_hashes, by direction and row size

    def byte_offsets(self, direction, row_bytes):
        """Every item's byte offset in the direction's source and destination (-1: no rows
        here), in the plan's order; computed once per batch and direction."""
        key = (direction, row_bytes)
        got = self._cached.get(key)
        if got is None:
            send, recv = self.send_items, self.recv_items
            if direction == "backward":
                send, recv = recv, send
            got = self._cached[key] = tuple(
                [a * row_bytes if a >= 0 else -1 for per_peer in items for a, _ in per_peer]
                for items in (send, recv))
        return got

    def item_hashes(self, direction, row_bytes, side):
        """Per peer, the item_sizes_hash of what this rank sends (side "send") or receives
        in the direction, as the agreement compares it; computed once per batch."""
        key = (direction, row_bytes, side)
        got = self._cached.get(key)
        if got is None:
            forward_send = (side == "send") == (direction == "forward")
            items, runs = ((self.send_items, self.send_runs) if forward_send
                           else (self.recv_items, self.recv_runs))
            got = self._cached[key] = [
                item_sizes_hash((n * row_bytes for _, n in its), r) for its, r in zip(items, runs)]
        return got


class _State:
    """One forward exchange of one batch and the gradients flowing back to it."""

    def __init__(self, batch, transport, tables, x):
        self.batch, self.transport, self.tables = batch, transport, tables
        self.step = batch.step
        self.micro_batches = len(batch.micro_batches)
        self.scattered = set()  # micro-batches that placed rows through scatter_image_embeds
        self.delivered = set()
        self.grad = None
        self.done = False
        self.x_shape, self.x_dtype, self.x_device = x.shape, x.dtype, x.device
        self.x = None  # the encoder output with a graph behind it, entered by the last backward

    def complete(self):
        return not self.scattered or len(self.delivered) >= self.micro_batches


def _check_input(x, batch, tables, transport):
    """(code, message) when this rank cannot exchange x, else None."""
    L = batch._layout
    where = f"step {batch.step}, rank {batch.rank}"
    if not isinstance(x, torch.Tensor):
        return "INVALID_ARGUMENT", f"{where}: x is a {type(x).__name__}, not a torch.Tensor"
    if x.dim() != 2 or x.shape[0] != tables.enc_total or x.shape[1] != L.hidden_size:
        return "INVALID_ARGUMENT", (
            f"{where}: x has shape {list(x.shape)} but this rank's encoder output is "
            f"[{tables.enc_total}, {L.hidden_size}]: one row per image token after the merge "
            f"(batch.num_encoder_rows) of post_balancing.hidden_size {L.hidden_size} (the job "
            "config's, which must be the model's)")
    if x.dtype != L.embed_dtype:
        return "INVALID_ARGUMENT", (
            f"{where}: x is {x.dtype} but the job plans encoder outputs as {L.embed_dtype} "
            "(post_balancing.embedding_dtype): pass x.to(that dtype) or change the job config")
    return transport.check_device(x, where)


class _ExchangeFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, state):
        ctx.state = state
        return state.transport.forward(state, x)

    @staticmethod
    def backward(ctx, grad_out):
        # The encoder's graph hangs off a detached leaf: a micro-batch's backward that is
        # not the last stops here (it would otherwise free the encoder's graph), and the
        # last one continues into the encoder with the whole gradient.
        state = ctx.state
        if state.done:
            raise _error("FAILED_PRECONDITION", (
                f"step {state.step}: a backward pass reached the exchange after its backward "
                "exchange ran (retain_graph across steps, or one micro-batch's loss backward twice)"))
        if grad_out is not None:
            state.grad = grad_out if state.grad is None else state.grad + grad_out
        if not state.complete():
            return None, None
        state.done = True
        grad = state.grad if state.grad is not None else torch.zeros(
            (state.tables.out_index.numel(), state.x_shape[1]), dtype=state.x_dtype,
            device=state.x_device)
        state.grad = None
        if state.x is None:  # x itself went in (a leaf, or no gradient wanted)
            return state.transport.backward(state, grad), None
        x, state.x = state.x, None
        torch.autograd.backward(x, state.transport.backward(state, grad))
        return None, None


def exchange(x, batch):
    """Moves this rank's encoder outputs `x` ([batch.num_encoder_rows, hidden] rows of the
    images in batch.pixel_values, in order) to the ranks whose documents hold them, and
    returns [batch.num_image_embeds, hidden]: the image embeddings of this rank's documents
    in input_ids order. Every rank calls it for every batch (also with no images). The
    backward exchange runs by itself: once every micro-batch's gradient has arrived when the
    rows are placed with MicroBatch.scatter_image_embeds, else at the first backward pass."""
    transport = getattr(batch, "_transport", None)
    if transport is None:
        raise tutti.FailedPreconditionError("exchange(x, batch) takes a batch from a "
                                            "tutti.torch.Loader")
    refusal = None
    tables = None
    try:
        if batch.released:
            refusal = ("FAILED_PRECONDITION",
                       f"step {batch.step}, rank {batch.rank}: exchange of a released batch "
                       "(exchange before taking the next batch from the loader)")
        else:
            tables = batch._tables()
            refusal = _check_input(x, batch, tables, transport)
    except tutti.Error as e:
        refusal = (getattr(e, "code", "INVALID_ARGUMENT"), str(e))
    except Exception as e:  # noqa: BLE001 - whatever stops this rank, the others learn it
        refusal = ("DATA_LOSS", f"step {batch.step}, rank {batch.rank}: this rank cannot lay "
                                f"out the exchange ({type(e).__name__}: {e})")
    if refusal is not None:
        transport.refuse(batch, refusal)  # fails on every rank, raises
    state = _State(batch, transport, tables, x)
    if x.requires_grad and x.grad_fn is None:
        leaf = x  # nothing behind it to keep for the last micro-batch's backward
    else:
        # Every rank runs the backward exchange, also one whose encoder output needs no
        # gradient; a graph behind x is entered once, by the last backward (see below).
        leaf = x.detach().requires_grad_(torch.is_grad_enabled())
        state.x = x if x.requires_grad and torch.is_grad_enabled() else None
    batch._states.append(state)
    return _ExchangeFn.apply(leaf, state)


def share_skipped_images(batch):
    """Tells every LLM rank which images it receives stand in for a skipped one.

    Under post-balancing an image is often encoded on another rank than the one whose
    documents hold it; when that rank's stager skipped its sample (a placeholder of the
    planned shape stands in for it), only that rank's batch says so. Every rank sends
    each peer one byte per exchange item it sends it (1: skipped), so that the LLM rank masks
    those documents' labels as the encoding rank would (LabelOptions.mask_skipped): the same
    labels with post-balancing on as off. Collective: every rank calls it for every batch
    (tutti.torch.Loader does, before yielding it). A no-op without post-balancing."""
    transport = batch._transport
    L = batch._layout
    if transport is None or L.world_size == 1 or not L.post_balancing:
        return
    me = batch.rank
    ex = L.plan.get("exchange") or {}

    def by_peer(transfers):
        out = {}
        for t in transfers or []:
            p = int(t["peer"])
            if p != me:
                out.setdefault(p, []).extend(t["items"])
        return out

    sends, recvs = by_peer(ex.get("sends")), by_peer(ex.get("recvs"))

    def skipped(item):
        key = (int(item["sample_id"]), int(item.get("index") or 0))
        return key[0] in L.skipped_samples or (
            item.get("encoder") == "ENCODER_VISION" and key not in L.enc_rows)

    flags = {p: np.array([skipped(it) for it in items], np.uint8) for p, items in sends.items()}
    if not transport.share_flags(batch, flags, {p: len(v) for p, v in recvs.items()}, None):
        return
    arrived = transport.share_flags(batch, flags, {p: len(v) for p, v in recvs.items()}, True)
    for p, items in recvs.items():
        for item, flag in zip(items, arrived[p]):
            if flag:
                L.skipped_elsewhere.add((int(item["sample_id"]), int(item.get("index") or 0)))


# ---- transports -------------------------------------------------------------

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
    """Moves rows per peer; subclasses say how."""

    rank = 0
    world = 1

    def check_device(self, x, where):
        if x.device.type != "cpu":
            return "INVALID_ARGUMENT", (f"{where}: x is on {x.device} but this transport moves "
                                        "host memory (CPU tensors)")
        return None

    def _buffers(self, state, x):
        t = state.tables
        if t.send_identity:
            send = x.contiguous()
        elif t.send_all_valid:
            send = x.index_select(0, t.send_index.to(x.device))
        else:
            send = self._empty(x, (t.send_total, x.shape[1]), zero=True)
            valid = torch.from_numpy(t.send_valid).to(x.device)
            send[valid] = x.index_select(0, t.send_index[t.send_valid].to(x.device))
        recv = self._empty(x, (t.recv_total, x.shape[1]))
        return send, recv

    def _empty(self, like, shape, zero=False):
        """An output like `like` (its dtype and device): on the CPU from the host pool."""
        if like.device.type != "cpu":
            return (like.new_zeros if zero else like.new_empty)(shape)
        pool = self.__dict__.get("_pool")
        if pool is None:
            pool = self._pool = _HostPool()
        return pool.empty(shape, like.dtype, zero)

    def items_forward(self, state, x):
        """Item by item, straight between x's rows and the output's: no staging copies."""
        t = state.tables
        x = x.contiguous()
        out = self._empty(x, (t.out_total, x.shape[1]))
        rb = x.shape[1] * x.element_size()
        self.move_items(state.batch, "forward", x, out, t.send_items, t.recv_items,
                        [n * rb for n in t.send_rows], [n * rb for n in t.recv_rows],
                        t.send_runs, t.recv_runs)
        return out

    def items_backward(self, state, grad_out):
        t = state.tables
        grad_out = grad_out.contiguous()
        grad_x = self._empty(grad_out, state.x_shape, zero=not t.send_covers_x)
        rb = grad_out.shape[1] * grad_out.element_size()
        self.move_items(state.batch, "backward", grad_out, grad_x, t.recv_items, t.send_items,
                        [n * rb for n in t.recv_rows], [n * rb for n in t.send_rows],
                        t.recv_runs, t.send_runs)
        return grad_x

    def forward(self, state, x):
        t = state.tables
        send, recv = self._buffers(state, x)
        self.move(state.batch, "forward", send, recv, t.send_rows, t.recv_rows)
        if t.out_identity:
            return recv
        return torch.index_select(recv, 0, t.out_index.to(recv.device),
                                  out=self._empty(recv, (t.out_index.numel(), recv.shape[1])))

    def backward(self, state, grad_out):
        t = state.tables
        grad_out = grad_out.contiguous()
        if t.out_identity:
            g_recv = grad_out
        else:
            g_recv = self._empty(grad_out, (t.recv_total, grad_out.shape[1]), zero=True)
            g_recv.index_copy_(0, t.out_index.to(grad_out.device), grad_out)
        g_send = self._empty(grad_out, (t.send_total, grad_out.shape[1]))
        self.move(state.batch, "backward", g_recv, g_send, t.recv_rows, t.send_rows)
        if t.send_identity:
            return g_send
        grad_x = self._empty(g_send, state.x_shape, zero=True)
        valid = torch.from_numpy(t.send_valid).to(g_send.device)
        grad_x.index_add_(0, t.send_index[t.send_valid].to(g_send.device), g_send[valid])
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
    The agreement runs first over a gloo group of the same ranks with `timeout_s`."""

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
        # Messages this rank sent in the last item-wise forward exchange and the backward
        # exchanges since (one per run of a pair's items).
        self.messages_posted = 0
        if self.backend == "nccl":
            warm = torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(warm, group=self.group)  # NCCL's communicator, made by every rank

    def forward(self, state, x):  # NCCL: one contiguous buffer per peer
        return (super().forward if self.backend == "nccl" else self.items_forward)(state, x)

    def backward(self, state, grad_out):
        return (super().backward if self.backend == "nccl" else self.items_backward)(
            state, grad_out)

    def move_items(self, batch, direction, src, dst, send_items, recv_items, send_bytes,
                   recv_bytes, send_runs, recv_runs):
        """One message per run of a pair's items (plan.proto Transfer.runs; per item without
        runs), straight from `src` rows into `dst` rows: a run is adjacent at both ends, so
        no staging copy, except for a run that is not adjacent on this rank's side (an image
        this rank's batch lacks: zeros are sent, or its rows dropped), which is gathered or
        scattered here. Both ends list a pair's items and runs in the same order. The
        agreement's all-reduce is started first, the messages are posted behind it and
        waited for only once it holds: the agreement overlaps the transfer instead of
        preceding it, and is not held up behind the bytes. Each message's tag
        hashes the exchange number, step, direction, the pair, the message's place in the
        pair's list and its size: a message of another exchange, or one the two ends size
        differently, matches nothing (no wrong rows, no size error) and stays pending, while
        the agreement fails every rank with the reason."""
        width = src.shape[1]
        row_bytes = width * src.element_size()
        scratch = {}
        scatters = []  # (staged receive, its items) for runs not adjacent here

        def rows(t, at, n, zero):
            if at >= 0:
                return t[at:at + n]
            if n not in scratch:
                scratch[n] = src.new_zeros((n, width))
            return scratch[n] if zero else src.new_empty((n, width))

        def messages(items, runs):
            k = 0
            for n in runs or [1] * len(items):
                yield items[k:k + n]
                k += n

        def message(t, run, send):
            """The run's rows as one tensor: a view when adjacent here, else staged."""
            at = run[0][0]
            total = sum(n for _, n in run)
            adjacent = at >= 0 and all(b == a + m for (a, m), (b, _) in zip(run, run[1:]))
            if adjacent:
                return t[at:at + total], total
            if send:
                return torch.cat([rows(t, a, m, True) for a, m in run]), total
            staged = src.new_empty((total, width))
            scatters.append((staged, run))
            return staged, total

        # The agreement's all-reduce goes first: posted behind this rank's messages it
        # would wait for their bytes on a loaded machine (an isend writes what the socket
        # takes before it returns), and every rank's agreement for every other's.
        t = batch._tables()
        finish = self.agreement.begin(batch.step, direction, send_bytes, recv_bytes,
                                      send_items=t.item_hashes(direction, row_bytes, "send"),
                                      recv_items=t.item_hashes(direction, row_bytes, "recv"))
        seq = self.agreement.seq  # this exchange's number
        base = _mix64(_mix64(seq) ^ _mix64(batch.step) ^ _DIRECTIONS[direction])
        me = self.rank
        ops = []
        for k in range(1, self.world):
            p = (me - k) % self.world
            pair = _mix64(base ^ (p << 32 | me))
            for i, run in enumerate(messages(recv_items[p], recv_runs[p])):
                buf, n = message(dst, run, False)
                ops.append(dist.P2POp(dist.irecv, buf, p, self.group, _tag(pair, i, n * row_bytes)))
        for k in range(1, self.world):
            p = (me + k) % self.world
            pair = _mix64(base ^ (me << 32 | p))
            for i, run in enumerate(messages(send_items[p], send_runs[p])):
                buf, n = message(src, run, True)
                ops.append(dist.P2POp(dist.isend, buf, p, self.group, _tag(pair, i, n * row_bytes)))
        works = dist.batch_isend_irecv(ops) if ops else []
        sends = sum(op.op is dist.isend for op in ops)
        self.messages_posted = sends if direction == "forward" else self.messages_posted + sends
        for (sa, n), (da, _) in zip(send_items[me], recv_items[me]):
            if da >= 0:  # `dst` is a fresh output: written before the verdict, read after it
                dst[da:da + n].copy_(rows(src, sa, n, True))
        try:
            finish()
        except tutti.Error:
            # Messages with a rank that refused or disagrees never complete; their memory is
            # kept (a late peer could still read or write it), their tags are never reused.
            self._abandoned.append((works, src, dst, scratch, scatters))
            raise
        self._wait_works(batch, direction, works)
        for staged, run in scatters:
            off = 0
            for at, n in run:
                if at >= 0:
                    dst[at:at + n].copy_(staged[off:off + n])
                off += n

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

    def check_device(self, x, where):
        want = "cuda" if self.backend == "nccl" else "cpu"
        if x.device.type != want:
            return "INVALID_ARGUMENT", (f"{where}: x is on {x.device} but the process group's "
                                        f"backend ({self.backend}) moves {want} tensors")
        return None

    def refuse(self, batch, refusal):
        self.agreement.agree(batch.step, "forward", [0] * self.world, [0] * self.world, refusal)

    def move(self, batch, direction, send, recv, send_rows, recv_rows):
        rb = send.shape[1] * send.element_size() if send.dim() == 2 else 0
        self.agreement.agree(batch.step, direction, [n * rb for n in send_rows],
                             [n * rb for n in recv_rows])
        if self.backend == "nccl":
            dist.all_to_all_single(recv, send, output_split_sizes=list(recv_rows),
                                   input_split_sizes=list(send_rows), group=self.group)
            return
        s_off = np.concatenate([[0], np.cumsum(send_rows)])
        r_off = np.concatenate([[0], np.cumsum(recv_rows)])
        ops = []
        for k in range(1, self.world):  # receives first, each rank from a different peer
            p = (self.rank - k) % self.world
            if recv_rows[p]:
                ops.append(dist.P2POp(dist.irecv, recv[r_off[p]:r_off[p + 1]], p, self.group))
        for k in range(1, self.world):
            p = (self.rank + k) % self.world
            if send_rows[p]:
                ops.append(dist.P2POp(dist.isend, send[s_off[p]:s_off[p + 1]], p, self.group))
        me = self.rank
        if send_rows[me]:
            recv[r_off[me]:r_off[me + 1]].copy_(send[s_off[me]:s_off[me + 1]])
        self._wait(batch, direction, ops)


class MpiTransport(_Transport):
    """tutti's MPI transport (mpirun): the C++ client's agreement and byte checks."""

    def __init__(self, timeout_s=600.0, device=None):
        self.impl = tutti.MpiTransport(join_timeout=timeout_s)
        self.rank, self.world = self.impl.rank, self.impl.world_size
        self._abandoned = []  # memory of exchanges that timed out (a late peer may use it)

    def refuse(self, batch, refusal):
        empty = np.zeros(0, np.uint8)
        self.impl.exchange(batch._layout.plan, empty, empty, step=batch.step,
                           world_size=batch.world_size, refusal=refusal[1], refusal_code=refusal[0])

    @staticmethod
    def _bytes(t):
        return t.detach().view(-1).view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)

    def forward(self, state, x):
        return self.items_forward(state, x)

    def backward(self, state, grad_out):
        return self.items_backward(state, grad_out)

    def _move_flags(self, batch, flags, recv_counts):
        # An exchange of its own: a plan of one item per peer, the flags' bytes.
        def transfers(counts):
            return [{"peer": p, "bytes": n, "items": [{"sample_id": 0, "bytes": n}]}
                    for p, n in sorted(counts.items()) if n]

        sends = transfers({p: len(f) for p, f in flags.items()})
        recvs = transfers(recv_counts)
        plan = {"rank": batch.rank, "exchange": {
            "sends": sends, "recvs": recvs, "send_bytes": sum(t["bytes"] for t in sends),
            "recv_bytes": sum(t["bytes"] for t in recvs)}}
        send = [flags[t["peer"]] for t in sends]
        send = self._host(np.concatenate(send) if send else np.zeros(0, np.uint8))
        recv = self._host(np.zeros(plan["exchange"]["recv_bytes"], np.uint8))
        self.impl.exchange(plan, self._bytes(send), self._bytes(recv), step=batch.step,
                           world_size=batch.world_size)
        got, at = {}, 0
        recv = recv.cpu().numpy()
        for p, n in sorted(recv_counts.items()):
            got[p] = recv[at:at + n]
            at += n
        return got

    @staticmethod
    def _host(a):
        return torch.from_numpy(a)

    def move_items(self, batch, direction, src, dst, send_items, recv_items, send_bytes,
                   recv_bytes, send_runs, recv_runs):
        # The C++ transport reads and writes every item in place, a run of a pair's items as
        # one message (it reads the runs from the plan, as its own agreement, which runs
        # while the sends are under way).
        # `dst` is a fresh output, read only when the exchange succeeds (scratch): the
        # receives are posted with the sends, so that the data moves while the ranks agree.
        send_offsets, recv_offsets = batch._tables().byte_offsets(
            direction, src.shape[1] * src.element_size())
        self._kept(lambda: self.impl.exchange_items(
            batch._layout.plan_bytes, direction, self._bytes(src), send_offsets,
            self._bytes(dst), recv_offsets, step=batch.step, world_size=batch.world_size,
            scratch_recv=True), src, dst)

    def _kept(self, run, *tensors):
        """Runs an exchange whose receive memory is scratch; after a timeout a late peer may
        still read or write `tensors`, so they are kept for the rest of the process."""
        try:
            run()
        except tutti.DeadlineExceededError:
            self._abandoned.append(tensors)
            raise

    def move(self, batch, direction, send, recv, send_rows, recv_rows):
        f = self.impl.exchange if direction == "forward" else self.impl.exchange_backward
        self._kept(lambda: f(batch._layout.plan_bytes, self._bytes(send), self._bytes(recv),
                             step=batch.step, world_size=batch.world_size, scratch_recv=True),
                   send, recv)


class NcclTransport(MpiTransport):
    """tutti's NCCL transport on CUDA tensors (mpirun; one rank per GPU)."""

    def __init__(self, timeout_s=600.0, device=0):
        if not tutti.HAVE_NCCL:
            raise tutti.FailedPreconditionError(
                "transport='nccl' needs tutti built with CUDA and NCCL (cmake -DTUTTI_WITH_CUDA=ON)"
                "; or use the trainer's NCCL process group (transport='torch')")
        self.impl = tutti.NcclTransport(device=device, join_timeout=timeout_s)
        self.rank, self.world = self.impl.rank, self.impl.world_size
        self._abandoned = []

    def check_device(self, x, where):
        if x.device.type != "cuda":
            return "INVALID_ARGUMENT", f"{where}: x is on {x.device}; the NCCL transport moves CUDA tensors"
        return None

    # Contiguous buffers: NCCL moves one per peer.
    forward = _Transport.forward
    backward = _Transport.backward

    def refuse(self, batch, refusal):
        empty = torch.zeros(0, dtype=torch.uint8, device="cuda")
        self.impl.exchange(batch._layout.plan, empty, empty, step=batch.step,
                           world_size=batch.world_size, refusal=refusal[1], refusal_code=refusal[0])

    @staticmethod
    def _bytes(t):
        return t.detach().reshape(-1).view(torch.uint8)

    @staticmethod
    def _host(a):  # the NCCL transport moves device memory only
        return torch.from_numpy(a).cuda()
