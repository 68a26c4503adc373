"""One step's batch as torch tensors, and its micro-batches' model inputs."""
import dataclasses
import json
import warnings

import numpy as np
import torch

import tutti
from tutti import views
from tutti.torch import _rope

_TORCH_DTYPE = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
}
_PROTO_DTYPE = {"DTYPE_FLOAT32": torch.float32, "DTYPE_BFLOAT16": torch.bfloat16,
                "DTYPE_FLOAT16": torch.float16}
_warned_pin = False


def _tensor(array, dtype_name):
    """A torch tensor over a numpy view, no copy (bfloat16 arrays are uint16 in numpy)."""
    if dtype_name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


@dataclasses.dataclass(frozen=True)
class LabelOptions:
    """How `labels` are masked (every masked position holds `ignore_index`).

    ignore_token_ids: token ids never predicted; None: the job's vision and
        audio markers and pads (vision_start, image_pad, vision_end, ...).
    mask_document_start: the first token of every document, so that after the
        model's shift no document is predicted from the one packed before it.
    mask_skipped: every token of a document whose sample this rank's stager
        skipped (a placeholder of the same shape stands in for it), or one of
        whose images the rank that encodes it skipped (post-balancing:
        Batch.skipped_images).
    mask_untrained: every token outside its document's trained spans (k.json "trained",
        schema 2: the assistant's turns), as the stager's loss_mask says.
    """

    ignore_index: int = -100
    ignore_token_ids: tuple = None
    mask_document_start: bool = True
    mask_skipped: bool = True
    mask_untrained: bool = True


class _Layout:
    """What the plan and the arrays say, host side (numpy), computed once."""

    def __init__(self, raw, job, arrays):
        """job: a views.JobInfo."""
        vision = job.vision
        self.merge = vision.merge_size
        self.step, self.rank = raw.step, raw.rank
        plan = raw.plan
        self.plan = plan
        self.rank_plan = views.RankPlan.from_dict(plan)
        # The plan as the stager sent it: what tutti's transports take per exchange
        # (parsing it is ~200x cheaper than converting the dict).
        self.plan_bytes = raw.plan_bytes
        self.world_size = job.world_size
        post = job.post_balancing
        self.hidden_size = post.hidden_size
        self.embed_dtype = _PROTO_DTYPE.get(post.embedding_dtype, torch.bfloat16)
        self.row_bytes = self.hidden_size * torch.empty(0, dtype=self.embed_dtype).element_size()
        self.special = {"vision_start_id": vision.vision_start_id,
                        "image_pad_id": vision.image_pad_id, "vision_end_id": vision.vision_end_id}
        self.audio_special = list(job.audio.markers)
        self.skipped_samples = {int(s["sample_id"]) for s in raw.skipped}
        # (sample_id, image_index) of images in this rank's documents whose encoding rank
        # skipped them (filled by share_skipped_images before the batch is handed out).
        self.skipped_elsewhere = set()
        self.post_balancing = post.enabled

        # Encoder side: the images this rank encodes, as the batch holds them.
        grid = arrays["image_grid_thw"].astype(np.int64).reshape(-1, 3)
        ids = arrays["image_sample_ids"].astype(np.int64)
        self.grid = grid
        planned = [(i.sample_id, i.image_index) for i in self.rank_plan.vision_images]
        keys, j = [], 0
        for sid in ids.tolist():  # dropped samples leave whole: a subsequence of the plan's
            while j < len(planned) and planned[j][0] != sid:
                j += 1
            if j == len(planned):
                raise tutti.DataLossError(f"step {self.step}, rank {self.rank}: image of sample "
                                          f"{sid} in the batch is not in its plan")
            keys.append(planned[j])
            j += 1
        tokens = (grid.prod(axis=1) // (self.merge * self.merge)) if len(grid) else np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(tokens)]).astype(np.int64)
        self.enc_keys = keys  # (sample_id, image_index) of each image, in pixel_values order
        self.enc_rows = {k: (int(offsets[i]), int(tokens[i])) for i, k in enumerate(keys)}
        self.enc_total = int(offsets[-1])
        patches = grid[:, 1] * grid[:, 2]
        self.vit_cu = np.concatenate([[0], np.cumsum(np.repeat(patches, grid[:, 0]))]).astype(np.int32)

        # LLM side: documents in input_ids order and their images.
        slots = self.rank_plan.doc_slots()
        self.input_ids = arrays["input_ids"]
        self.cu = arrays["cu_seqlens"].astype(np.int64)
        self.doc_ids = arrays["doc_sample_ids"].astype(np.int64)
        self.seq_off = arrays["seq_offsets"].astype(np.int64)
        self.mb_off = arrays["micro_batch_offsets"].astype(np.int64)
        self.mb_modality = [mb.modality for mb in self.rank_plan.micro_batches]
        version = self.rank_plan.plan_version
        self.llm_images = []  # (sample_id, image_index, (t, h, w), absolute token position)
        self.doc_images = []  # per doc: [(position within the doc, grid)]
        # Where each document's image runs start (their first image_pad, in the document);
        # a batch without the array has them first (vision_start, pads, vision_end each).
        starts = arrays["doc_image_starts"].astype(np.int64) if "doc_image_starts" in arrays else None
        # 0 on tokens outside the documents' trained spans (k.json "trained").
        self.loss_mask = arrays["loss_mask"] if "loss_mask" in arrays else None
        pad_positions = []
        next_start = 0
        for k, sid in enumerate(self.doc_ids.tolist()):
            slot = slots.get(sid)
            if slot is None:
                raise tutti.DataLossError(f"step {self.step}, rank {self.rank}: document of sample "
                                          f"{sid} is in the batch but not in its plan")
            images = slot.images
            if version < 2 and slot.encoder_tokens > 0:
                raise tutti.FailedPreconditionError(
                    f"step {self.step}, rank {self.rank}: the plan (plan_version {version}) does "
                    "not say the image grids of its documents; tutti.torch needs plan_version 2 "
                    "or later: upgrade tutti-packerd")
            at, doc = 1, []
            start = int(self.cu[k])
            if starts is not None and next_start + len(images) > len(starts):
                raise tutti.DataLossError(
                    f"step {self.step}, rank {self.rank}: doc_image_starts holds {len(starts)} "
                    "entries, fewer than the images of the batch's documents")
            for im in images:
                g, n = im.grid_thw, im.llm_tokens
                if starts is not None:
                    at = int(starts[next_start])
                    next_start += 1
                doc.append((at, g))
                self.llm_images.append((sid, im.image_index, g, start + at, n))
                pad_positions.append(np.arange(start + at, start + at + n))
                at += n + 2
            self.doc_images.append(doc)
        self.image_token_positions = (np.concatenate(pad_positions) if pad_positions
                                      else np.zeros(0, np.int64))
        if len(self.image_token_positions) and not np.all(
                self.input_ids[self.image_token_positions] == self.special["image_pad_id"]):
            raise tutti.DataLossError(
                f"step {self.step}, rank {self.rank}: input_ids do not hold image_pad tokens where "
                "the plan puts its documents' images; the stager and the packer disagree on the "
                "vision config")
        self.llm_total = len(self.image_token_positions)
        self._audio_runs(slots)
        self._raw_samples = raw
        self._mixture = job.has_mixture
        self._doc_sources = None
        self._doc_text = None

    def _audio_runs(self, slots):
        """The audio clips of the documents, in input_ids order: each clip's run (audio_start,
        audio_pad x n, audio_end) where the stager wrote it (its placeholder's place in a
        schema-2 document, else after the image runs), the k-th run of a document being its
        k-th planned clip. Sets llm_audio [(sample_id, audio_index, position of the first
        audio_pad, n)] and audio_token_positions."""
        self.llm_audio = []
        start_id, pad_id, end_id = self.audio_special
        ids, where = self.input_ids, f"step {self.step}, rank {self.rank}"
        pads = np.flatnonzero(ids == pad_id) if pad_id != self.special["image_pad_id"] else []
        self.audio_token_positions = np.asarray(pads, np.int64)
        # Per document: the audio tokens the plan gives it (its encoder tokens less its images').
        want = {}
        for k, sid in enumerate(self.doc_ids.tolist()):
            n = slots[sid].audio_tokens
            if n > 0:
                want[k] = n
        if not len(pads) and not want:
            return
        cut = np.flatnonzero(np.diff(pads) != 1) + 1
        firsts = pads[np.concatenate([[0], cut])] if len(pads) else np.zeros(0, np.int64)
        lengths = np.diff(np.concatenate([[0], cut, [len(pads)]])) if len(pads) else firsts
        docs = np.searchsorted(self.cu, firsts, side="right") - 1
        got, clip = {}, {}
        for at, n, k in zip(firsts.tolist(), lengths.tolist(), docs.tolist()):
            if (at == 0 or ids[at - 1] != start_id or at + n >= len(ids) or ids[at + n] != end_id
                    or at + n >= self.cu[k + 1]):
                raise tutti.DataLossError(
                    f"{where}: input_ids hold audio_pad tokens at {at}..{at + n - 1} that are no "
                    "audio run (audio_start, audio_pad..., audio_end) inside one document; the "
                    "stager and the packer disagree on the audio config")
            sid = int(self.doc_ids[k])
            slot = slots[sid]
            first = slot.first_audio if slot.pieces else 0
            index = first + clip.get(k, 0)
            clip[k] = clip.get(k, 0) + 1
            got[k] = got.get(k, 0) + n
            self.llm_audio.append((sid, index, at, n))
        for k in sorted(set(want) | set(got)):
            if want.get(k, 0) != got.get(k, 0):
                raise tutti.DataLossError(
                    f"{where}: the document of sample {int(self.doc_ids[k])} holds "
                    f"{got.get(k, 0)} audio tokens in input_ids but its plan gives it "
                    f"{want.get(k, 0)}; the stager and the packer disagree on the audio config")

    def doc_text(self):
        """Per document in doc_ids order: its sample's k.json (source string, meta dict) as the
        stager read them (SampleInfo.sample_source / sample_meta; "" and {} when absent)."""
        if self._doc_text is None:
            by_sample = {}
            for s in self._raw_samples.samples:
                meta = s.get("sample_meta") or ""
                by_sample[int(s["sample_id"])] = (s.get("sample_source") or "",
                                                  json.loads(meta) if meta else {})
            self._doc_text = [by_sample.get(int(x), ("", {})) for x in self.doc_ids.tolist()]
        return self._doc_text

    def doc_sources(self):
        """The source (an index into JobInfo.sources) of each document, in doc_ids order:
        SampleInfo.source; without a mixture the two streams, 0 "text" and 1 "vl"."""
        if self._doc_sources is None:
            source = {}
            for s in self._raw_samples.samples:
                if self._mixture:
                    source[int(s["sample_id"])] = int(s.get("source") or 0)
                else:
                    source[int(s["sample_id"])] = 1 if s.get("modality") == "MODALITY_VL" else 0
            self._doc_sources = np.array([source.get(int(x), -1) for x in self.doc_ids.tolist()],
                                         np.int64)
        return self._doc_sources


class MicroBatch:
    """One micro-batch's model inputs in the Hugging Face convention, packed
    into one row: every sequence of the micro-batch back to back, documents
    separated by `cu_seqlens` for varlen attention. Built on first access."""

    def __init__(self, batch, index):
        self._batch = batch
        self.index = index
        L = batch._layout
        self.modality = {"MODALITY_TEXT": "text", "MODALITY_VL": "vl"}.get(
            L.mb_modality[index], "unspecified")
        s0, s1 = int(L.mb_off[index]), int(L.mb_off[index + 1])
        self._t0, self._t1 = int(L.seq_off[s0]), int(L.seq_off[s1])
        d0 = int(np.searchsorted(L.cu, self._t0, side="left"))
        d1 = int(np.searchsorted(L.cu, self._t1, side="left"))
        self._docs = (d0, d1)
        self._seqs = (s0, s1)
        self._cache = {}
        img = L.image_token_positions
        self._rows = (int(np.searchsorted(img, self._t0)), int(np.searchsorted(img, self._t1)))

    def _get(self, name, build):
        self._batch._check(name)
        if name not in self._cache:
            self._cache[name] = self._batch._convert(build())
        return self._cache[name]

    @property
    def num_tokens(self):
        return self._t1 - self._t0

    @property
    def input_ids(self):
        """[1, T] int32: token ids (a view of the batch's shared memory)."""
        return self._get("input_ids", lambda: self._batch._flat("input_ids")[self._t0:self._t1]
                         .view(1, -1))

    def _doc_bounds(self):
        L = self._batch._layout
        d0, d1 = self._docs
        return L.cu[d0:d1 + 1] - self._t0

    @property
    def cu_seqlens(self):
        """[D + 1] int32: document boundaries within the micro-batch (varlen attention)."""
        return self._get("cu_seqlens", lambda: torch.from_numpy(self._doc_bounds().astype(np.int32)))

    @property
    def max_seqlen(self):
        """The longest document's length (an int)."""
        b = self._doc_bounds()
        return int(np.diff(b).max()) if len(b) > 1 else 0

    @property
    def seq_offsets(self):
        """[S + 1] int32: packed-sequence boundaries within the micro-batch."""
        L = self._batch._layout
        s0, s1 = self._seqs
        return self._get("seq_offsets", lambda: torch.from_numpy(
            (L.seq_off[s0:s1 + 1] - self._t0).astype(np.int32)))

    @property
    def doc_sample_ids(self):
        """[D] int64: the sample of each document."""
        L = self._batch._layout
        d0, d1 = self._docs
        return self._get("doc_sample_ids", lambda: torch.from_numpy(L.doc_ids[d0:d1].copy()))

    @property
    def doc_sources(self):
        """[D] int64: the source of each document, an index into Batch.source_names (the mixture
        source it was drawn from). A per-source loss: the documents' token losses summed over
        cu_seqlens, then grouped by doc_sources."""
        L = self._batch._layout
        d0, d1 = self._docs
        return self._get("doc_sources", lambda: torch.from_numpy(L.doc_sources()[d0:d1].copy()))

    @property
    def doc_sample_sources(self):
        """[D] str: each document's k.json "source" (sample schema 2; "" when it has none)."""
        self._batch._check("doc_sample_sources")
        d0, d1 = self._docs
        return [src for src, _ in self._batch._layout.doc_text()[d0:d1]]

    @property
    def doc_sample_meta(self):
        """[D] dict: each document's k.json "meta" object, as the sample holds it ({} when it
        has none)."""
        self._batch._check("doc_sample_meta")
        d0, d1 = self._docs
        return [meta for _, meta in self._batch._layout.doc_text()[d0:d1]]

    @property
    def position_ids(self):
        """[1, T] int64: position of each token within its document."""
        def build():
            b = self._doc_bounds()
            return torch.from_numpy(_rope.document_positions(b[:-1], np.diff(b), self.num_tokens)
                                    ).view(1, -1)
        return self._get("position_ids", build)

    @property
    def mrope_position_ids(self):
        """[3, 1, T] int64: Qwen2-VL M-RoPE (temporal, height, width) ids, per document."""
        def build():
            L = self._batch._layout
            b = self._doc_bounds()
            out = np.empty((3, self.num_tokens), np.int64)
            d0 = self._docs[0]
            for k in range(len(b) - 1):
                out[:, b[k]:b[k + 1]] = _rope.mrope_positions(int(b[k + 1] - b[k]),
                                                              L.doc_images[d0 + k], L.merge)
            return torch.from_numpy(out).view(3, 1, -1)
        return self._get("mrope_position_ids", build)

    @property
    def labels(self):
        """[1, T] int64: input_ids with masked positions set to ignore_index (see LabelOptions);
        not shifted: logits[:, :-1] predict labels[:, 1:]."""
        def build():
            L = self._batch._layout
            opts = self._batch._labels
            ids = L.input_ids[self._t0:self._t1].astype(np.int64)
            ignore = opts.ignore_token_ids
            if ignore is None:
                ignore = tuple(L.special.values()) + tuple(L.audio_special)
            out = ids.copy()
            out[np.isin(ids, np.asarray(ignore, np.int64))] = opts.ignore_index
            b = self._doc_bounds()
            if opts.mask_document_start and len(b) > 1:
                out[b[:-1]] = opts.ignore_index
            if opts.mask_untrained and L.loss_mask is not None:
                out[L.loss_mask[self._t0:self._t1] == 0] = opts.ignore_index
            skipped = L.skipped_samples | {sid for sid, _ in L.skipped_elsewhere}
            if opts.mask_skipped and skipped:
                d0 = self._docs[0]
                for k in range(len(b) - 1):
                    if int(L.doc_ids[d0 + k]) in skipped:
                        out[b[k]:b[k + 1]] = opts.ignore_index
            return torch.from_numpy(out).view(1, -1)
        return self._get("labels", build)

    @property
    def num_label_tokens(self):
        """Positions whose label is not ignored (what a token-mean loss divides by)."""
        return int((self.labels[0, 1:] != self._batch._labels.ignore_index).sum())

    @property
    def image_grid_thw(self):
        """[n, 3] int64: grids of the images in this micro-batch's documents."""
        L = self._batch._layout
        r0, r1 = self._image_range()
        return self._get("image_grid_thw", lambda: torch.tensor(
            [im[2] for im in L.llm_images[r0:r1]], dtype=torch.int64).view(-1, 3))

    def _image_range(self):
        L = self._batch._layout
        starts = [im[3] for im in L.llm_images]
        return (int(np.searchsorted(starts, self._t0)), int(np.searchsorted(starts, self._t1)))

    @property
    def image_token_positions(self):
        """[R] int64: positions (in input_ids[0]) of this micro-batch's image tokens, in order."""
        L = self._batch._layout
        r0, r1 = self._rows
        return self._get("image_token_positions", lambda: torch.from_numpy(
            L.image_token_positions[r0:r1] - self._t0))

    @property
    def audio_token_positions(self):
        """[A] int64: positions (in input_ids[0]) of this micro-batch's audio tokens (audio_pad),
        in order: a schema-2 document's clip where its placeholder was, else after the image
        runs."""
        L = self._batch._layout
        pos = L.audio_token_positions
        a0, a1 = np.searchsorted(pos, self._t0), np.searchsorted(pos, self._t1)
        return self._get("audio_token_positions", lambda: torch.from_numpy(pos[a0:a1] - self._t0))

    @property
    def audio_clips(self):
        """[n, 3] int64: (sample_id, audio_index, tokens) of this micro-batch's audio clips in
        input_ids order; clip i's tokens are the next `tokens` of audio_token_positions."""
        L = self._batch._layout
        rows = [(s, i, n) for s, i, at, n in L.llm_audio if self._t0 <= at < self._t1]
        return self._get("audio_clips", lambda: torch.tensor(rows, dtype=torch.int64).view(-1, 3))

    @property
    def image_embed_index(self):
        """[R] int64: the row of the exchange's output each of this micro-batch's image tokens
        takes, in order (`emb[mb.image_embed_index]` are its image embeddings in input_ids
        order)."""
        r0, r1 = self._rows
        return self._batch._tables().embed_index[r0:r1]

    def scatter_image_embeds(self, inputs_embeds, image_embeds):
        """inputs_embeds ([1, T, H] or [T, H]) with every image token replaced by its row of
        `image_embeds` (the output of tutti.torch.exchange for this batch), placed through
        image_embed_index. Autograd-aware; call it for every micro-batch, text ones too, so
        that the backward exchange runs once all micro-batches' gradients are in."""
        batch = self._batch
        batch._check("scatter_image_embeds")
        if image_embeds.shape[0] != batch.num_image_embeds:
            raise tutti.InvalidArgumentError(
                f"step {batch.step}, rank {batch.rank}: image_embeds has {image_embeds.shape[0]} "
                f"rows but this rank's exchange brings {batch.num_image_embeds} (pass the output "
                "of tutti.torch.exchange(x, batch))")
        squeeze = inputs_embeds.dim() == 2
        x = inputs_embeds.unsqueeze(0) if squeeze else inputs_embeds
        if x.shape[0] != 1 or x.shape[1] != self.num_tokens:
            raise tutti.InvalidArgumentError(
                f"step {batch.step}, rank {batch.rank}, micro-batch {self.index}: inputs_embeds "
                f"has shape {tuple(inputs_embeds.shape)}, expected [1, {self.num_tokens}, H]")
        pos = self.image_token_positions.to(x.device)
        rows = self.image_embed_index.to(image_embeds.device)
        state = batch._exchange_state()
        if state is not None:
            state.scattered.add(self.index)
        out = _Scatter.apply(x, image_embeds, pos, rows, state, self.index)
        return out.squeeze(0) if squeeze else out


class _Scatter(torch.autograd.Function):
    """inputs_embeds[0, positions] = rows_src[rows]: each image token's embedding from its
    row of the exchange's output (rows grouped by source, not in input_ids order)."""

    @staticmethod
    def forward(ctx, x, rows_src, positions, rows, state, index):
        ctx.positions, ctx.rows, ctx.state, ctx.index = positions, rows, state, index
        ctx.src_shape = rows_src.shape
        out = x.clone()
        out[0, positions] = rows_src.index_select(0, rows).to(out.dtype)
        return out

    @staticmethod
    def backward(ctx, grad):
        g = grad.clone()
        g[0, ctx.positions] = 0
        g_src = grad.new_zeros(ctx.src_shape)
        g_src.index_copy_(0, ctx.rows, grad[0, ctx.positions])
        if ctx.state is not None:
            ctx.state.delivered.add(ctx.index)
        return g, g_src, None, None, None, None


class Batch:
    """One step's batch as torch tensors over the stager's shared memory (no copy; writable:
    the mapping is copy-on-write, writes stay in this process). Valid until release() (the
    loader releases it when the next batch is taken): after that every field raises, while
    tensors taken before keep their memory and contents."""

    def __init__(self, raw, job, labels=None, convert=None, layout=None, tensors=None):
        """job: the job as tutti.Client.job gives it (a dict) or a tutti.views.JobInfo."""
        self._raw = raw
        job = job if isinstance(job, views.JobInfo) else views.JobInfo.from_dict(job)
        self._job = job
        self._labels = labels or LabelOptions()
        self._convert = convert or (lambda t: t)
        if tensors is None:
            arrays = raw.writable_arrays
            dtypes = raw.dtypes
            tensors = {k: _tensor(a, dtypes[k]) for k, a in arrays.items()}
            layout = _Layout(raw, job, arrays)
        self._tensors = tensors
        self._layout = layout
        self.step = raw.step
        self.rank = raw.rank
        self.world_size = layout.world_size
        spe = job.steps_per_epoch
        self.epoch = self.step // spe if spe else 0
        self._released = False
        self._states = []
        self._layout_tables = None
        self._transport = None
        self.micro_batches = [MicroBatch(self, m) for m in range(len(layout.mb_off) - 1)]

    # ---- lifetime ----
    def _check(self, what):
        if self._released or self._raw.released:
            raise tutti.FailedPreconditionError(
                f"step {self.step}, rank {self.rank}: {what} of a released batch (the loader "
                "releases a batch when the next one is taken; tensors taken before stay valid)")

    @property
    def released(self):
        return self._released or self._raw.released

    def release(self):
        """Hands the batch back to the stager (once). Tensors taken before stay valid."""
        if not self._released:
            self._released = True
            if not self._raw.released:
                self._raw.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        return (f"<tutti.torch.Batch step={self.step} rank={self.rank} "
                f"micro_batches={len(self.micro_batches)}{' released' if self.released else ''}>")

    # ---- device placement ----
    def _with(self, convert):
        out = Batch.__new__(Batch)
        out.__dict__.update(self.__dict__)
        out._convert = convert
        out._states = self._states
        out.micro_batches = [MicroBatch(out, m) for m in range(len(self.micro_batches))]
        return out

    def to(self, device, non_blocking=False):
        """The same batch with every tensor field on `device` (copies, made on access)."""
        base = self._convert
        return self._with(lambda t: base(t).to(device, non_blocking=non_blocking))

    def pin_memory(self):
        """The same batch with tensor fields in page-locked memory (copies), for fast
        .to("cuda", non_blocking=True); without CUDA, the batch itself (one warning)."""
        global _warned_pin
        if not torch.cuda.is_available():
            if not _warned_pin:
                warnings.warn("pin_memory: CUDA is not available, tensors stay in pageable memory")
                _warned_pin = True
            return self
        base = self._convert
        return self._with(lambda t: base(t).pin_memory())

    # ---- fields ----
    def _flat(self, name):
        return self._tensors[name]

    def _field(self, name):
        self._check(name)
        return self._convert(self._tensors[name])

    @property
    def pixel_values(self):
        """[patches, C*temporal_patch*patch*patch] float32 or bfloat16: this rank's encoder
        images, each 2x2 merge group of patches contiguous (Qwen2-VL order)."""
        return self._field("pixel_values")

    @property
    def image_grid_thw(self):
        """[images, 3] int64: (t, h, w) in patches of each image in pixel_values."""
        self._check("image_grid_thw")
        return self._convert(torch.from_numpy(self._layout.grid))

    @property
    def image_sample_ids(self):
        """[images] int64: the sample of each image in pixel_values."""
        return self._field("image_sample_ids")

    @property
    def image_indices(self):
        """[images] int64: the index of each image in pixel_values within its sample (its order
        of appearance in the sample's text, k.N.*), beside image_sample_ids."""
        self._check("image_indices")
        return self._convert(torch.tensor([i for _, i in self._layout.enc_keys],
                                          dtype=torch.int64))

    @property
    def vit_cu_seqlens(self):
        """[frames + 1] int32: patch boundaries of each image (frame) for varlen ViT attention."""
        self._check("vit_cu_seqlens")
        return self._convert(torch.from_numpy(self._layout.vit_cu))

    @property
    def vit_max_seqlen(self):
        """Patches of the largest image (an int)."""
        cu = self._layout.vit_cu
        return int(np.diff(cu).max()) if len(cu) > 1 else 0

    @property
    def num_encoder_rows(self):
        """Rows the encoder output x of exchange(x, batch) has: image tokens after the merge."""
        return self._layout.enc_total

    @property
    def num_image_embeds(self):
        """Rows exchange(x, batch) returns: the image tokens of this rank's documents, grouped
        by the rank that encodes them."""
        return self._tables().recv_total

    @property
    def image_embed_index(self):
        """[image tokens] int64: the row of exchange(x, batch)'s output each image token of
        this rank's documents takes, in input_ids order (`emb[batch.image_embed_index]`:
        the image embeddings in input_ids order)."""
        self._check("image_embed_index")
        return self._tables().embed_index

    @property
    def llm_image_grid_thw(self):
        """[n, 3] int64: grids of the images in this rank's documents, in input_ids order."""
        self._check("llm_image_grid_thw")
        return self._convert(torch.tensor([im[2] for im in self._layout.llm_images],
                                          dtype=torch.int64).view(-1, 3))

    @property
    def audio_token_positions(self):
        """[A] int64: positions in input_ids of the audio tokens of this rank's documents, in
        order (see MicroBatch.audio_token_positions)."""
        self._check("audio_token_positions")
        return self._convert(torch.from_numpy(self._layout.audio_token_positions.copy()))

    @property
    def audio_clips(self):
        """[n, 3] int64: (sample_id, audio_index, tokens) of the audio clips of this rank's
        documents, in input_ids order."""
        self._check("audio_clips")
        return self._convert(torch.tensor([(s, i, n) for s, i, _, n in self._layout.llm_audio],
                                          dtype=torch.int64).view(-1, 3))

    @property
    def input_ids(self):
        """[tokens] int32: every sequence of the rank, micro-batch then sequence order."""
        return self._field("input_ids")

    @property
    def cu_seqlens(self):
        """[docs + 1] int32: document boundaries in input_ids."""
        return self._field("cu_seqlens")

    @property
    def doc_sample_ids(self):
        return self._field("doc_sample_ids")

    @property
    def doc_sources(self):
        """[docs] int64: the source of each document of doc_sample_ids, an index into
        source_names."""
        self._check("doc_sources")
        return self._convert(torch.from_numpy(self._layout.doc_sources().copy()))

    @property
    def doc_sample_sources(self):
        """[docs] str: each document's k.json "source" (sample schema 2; "" when it has
        none), in doc_sample_ids order."""
        self._check("doc_sample_sources")
        return [src for src, _ in self._layout.doc_text()]

    @property
    def doc_sample_meta(self):
        """[docs] dict: each document's k.json "meta" object ({} when it has none), in
        doc_sample_ids order."""
        self._check("doc_sample_meta")
        return [meta for _, meta in self._layout.doc_text()]

    @property
    def source_names(self):
        """The job's sources (JobInfo.sources): the mixture's, or ["text", "vl"]."""
        return list(self._job.source_names)

    @property
    def job_info(self):
        """The job (tutti.views.JobInfo): its config's vision, audio and post-balancing
        fields, sources, steps per epoch, ..."""
        return self._job

    @property
    def rank_plan(self):
        """This rank's plan as a tutti.views.RankPlan (typed; `plan` is the same as a dict)."""
        self._check("rank_plan")
        return self._layout.rank_plan

    @property
    def num_label_tokens(self):
        """Label positions (after the shift) over all micro-batches of this rank."""
        return sum(mb.num_label_tokens for mb in self.micro_batches)

    @property
    def plan(self):
        """This rank's plan (tutti.v1.RankPlan) as a dict."""
        self._check("plan")
        return self._layout.plan

    @property
    def samples(self):
        self._check("samples")
        return self._raw.samples

    @property
    def skipped(self):
        self._check("skipped")
        return self._raw.skipped

    @property
    def skipped_images(self):
        """[(sample_id, image_index)]: images in this rank's documents that the rank encoding
        them skipped (post-balancing; a placeholder stands in for each). Their
        documents' labels are masked like those of the samples in `skipped`."""
        self._check("skipped_images")
        return sorted(self._layout.skipped_elsewhere)

    def _exchange_state(self):
        return self._states[-1] if self._states else None

    def _tables(self):
        if self._layout_tables is None:
            from tutti.torch._exchange import _Tables

            self._layout_tables = _Tables(self)
        return self._layout_tables

    def _pending_backward(self):
        """Why a backward exchange of this batch never ran, or None."""
        for st in self._states:
            if not st.done and st.grad is not None:
                missing = sorted(set(range(len(self.micro_batches))) - st.delivered)
                return (f"step {self.step}, rank {self.rank}: the backward exchange never ran: "
                        f"gradients arrived from micro-batches {sorted(st.delivered)} but not from "
                        f"{missing}; call mb.scatter_image_embeds for every micro-batch (text ones "
                        "too) and backward each micro-batch's loss")
        return None
