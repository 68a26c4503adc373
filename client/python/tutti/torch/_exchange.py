"""tutti.torch.exchange: the step plan's all-to-all as an autograd function.

Forward moves each encoder output row from the rank that encoded the image to the rank
whose LLM documents hold it; the backward pass runs the inverse exchange. Every pair of
ranks is one contiguous run at both ends (plan_version 4, plan.proto Exchange): the
encoder output, in pixel_values order, is grouped by destination and is the send buffer as
it stands, and the rows arrive grouped by source, one message per peer, straight into the
exchange's output, which is returned as it arrived. MicroBatch.scatter_image_embeds places
them through an index (Batch.image_embed_index: each image token's row), so nothing is
copied into input_ids order. The transports are in tutti.torch._transports."""
import numpy as np
import torch

import tutti
from tutti.torch._agree import _error


class _Tables:
    """One batch's exchange, read once: rows per peer in each direction, whether x is the
    send buffer as it stands (else which of its rows go where), and each image token's row
    in the output (the placement index). Byte counts, offsets and the agreement's per-pair
    hashes come from the C++ layout of the vision encoder's items, which refuses a plan
    older than the contiguous layout and one whose encoder output is not grouped by
    destination."""

    def __init__(self, batch):
        L = batch._layout
        ex = L.plan.get("exchange") or {}
        where = f"step {batch.step}, rank {batch.rank}"
        self.layouts = {d: tutti.exchange_layout(
            L.plan_bytes, d, batch.rank, L.world_size, step=batch.step,
            plan_world_size=L.world_size, encoder="vision") for d in ("forward", "backward")}
        rb = L.row_bytes

        def rows_of(item):
            if item.get("encoder") != "ENCODER_VISION":
                raise _error("FAILED_PRECONDITION", (
                    f"{where}: the plan exchanges {item.get('encoder')} encoder outputs; "
                    "tutti.torch.exchange carries image embeddings only (exchange the other "
                    "encoders' outputs with tutti.MpiTransport().exchange(plan, ..., "
                    "encoder='audio'))"))
            n = int(item["bytes"])
            if n % rb:
                raise _error("DATA_LOSS", f"{where}: an exchange item of {n} bytes is not a whole "
                                          f"number of {rb}-byte rows")
            return n // rb

        # Send side: the plan's items in order are x's rows in order (checked), unless the
        # batch lacks some image (its rows are then zeros sent in its place).
        send_index, self.send_rows = [], [0] * L.world_size
        for t in ex.get("sends") or []:
            for item in t["items"]:
                n = rows_of(item)
                key = (int(item["sample_id"]), int(item.get("index") or 0))
                at = L.enc_rows.get(key)
                if at is not None and at[1] != n:
                    raise _error("DATA_LOSS", f"{where}: image {key} has {at[1]} rows in the batch "
                                              f"but {n} in the plan's exchange")
                send_index.append(np.arange(at[0], at[0] + n) if at else np.full(n, -1))
                self.send_rows[int(t["peer"])] += n
        idx = np.concatenate(send_index) if send_index else np.zeros(0, np.int64)
        self.send_total = len(idx)
        self.enc_total = L.enc_total
        self.send_identity = len(idx) == L.enc_total and np.array_equal(idx, np.arange(len(idx)))
        valid = idx >= 0
        self.send_valid = torch.from_numpy(valid)
        self.send_index = torch.from_numpy(idx[valid].astype(np.int64))
        # Receive side: rows grouped by source, as they arrive; each image of this rank's
        # documents (input_ids order) finds its rows there.
        recv_at, self.recv_rows, offset = {}, [0] * L.world_size, 0
        for t in ex.get("recvs") or []:
            for item in t["items"]:
                n = rows_of(item)
                recv_at[(int(item["sample_id"]), int(item.get("index") or 0))] = (offset, n)
                offset += n
                self.recv_rows[int(t["peer"])] += n
        self.recv_total = offset
        placed = []
        for sid, index, _, _, n in L.llm_images:
            at = recv_at.get((sid, index))
            if at is None or at[1] != n:
                raise _error("DATA_LOSS", f"{where}: image {index} of sample {sid} is in this rank's "
                                          "documents but the plan's exchange does not bring it")
            placed.append(np.arange(at[0], at[0] + n))
        index = np.concatenate(placed) if placed else np.zeros(0, np.int64)
        self.embed_index = torch.from_numpy(index.astype(np.int64))
        for d, lay in self.layouts.items():
            fwd = d == "forward"
            rows = (self.send_rows, self.recv_rows) if fwd else (self.recv_rows, self.send_rows)
            if [n * rb for n in rows[0]] != list(lay["send_counts"]) or \
                    [n * rb for n in rows[1]] != list(lay["recv_counts"]):
                raise _error("DATA_LOSS", f"{where}: the plan's {d} exchange lists other rows "
                                          "than its layout")
        self.row_bytes = rb

    def item_hashes(self, direction, side):
        """Per peer, the hash of how the pair's bytes split into items, as every transport's
        agreement compares it (the C++ layout's)."""
        return list(self.layouts[direction][f"{side}_item_hashes"])


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
            (state.tables.recv_total, state.x_shape[1]), dtype=state.x_dtype,
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
    returns [batch.num_image_embeds, hidden]: the image embeddings this rank's documents
    need, grouped by the rank that encoded them (one message per peer lands each group);
    MicroBatch.scatter_image_embeds places them (batch.image_embed_index: each image
    token's row, in input_ids order). Every rank calls it for every batch (also with no
    images). The backward exchange runs by itself: once every micro-batch's gradient has
    arrived when the rows are placed with MicroBatch.scatter_image_embeds, else at the first
    backward pass."""
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
