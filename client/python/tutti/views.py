"""Typed, read-only views of the job (tutti.v1.JobInfo with its JobConfig) and of a rank's
plan (tutti.v1.RankPlan), made from the dicts the binding gives (`Client.job`, `Batch.plan`).
A field the dict leaves out, or holds as proto3's zero, takes the default the proto documents
(the vision and audio marker ids, merge_size 2, hidden_size 4096, ...), as the daemons read it.

    job = tutti.views.JobInfo.from_dict(client.job)
    job.vision.image_pad_id, job.post_balancing.hidden_size, job.source_names
    plan = tutti.views.RankPlan.from_dict(batch.plan)
    for mb in plan.micro_batches: for doc in mb.docs: doc.sample_id, doc.images

Pure Python: it imports without the compiled extension."""
import dataclasses
from typing import Optional, Tuple


def _int(d, key, default=0):
    v = d.get(key) if d else None
    return int(v) if v else default


def _msg(d, key):
    return (d.get(key) if d else None) or {}


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """JobConfig.vision: the patching and the ids the stager writes for an image's run."""
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch: int = 2
    vision_start_id: int = 151652
    image_pad_id: int = 151655
    vision_end_id: int = 151653

    @classmethod
    def from_dict(cls, d):
        return cls(**{f.name: _int(d, f.name, f.default) for f in dataclasses.fields(cls)})

    @property
    def markers(self) -> Tuple[int, int, int]:
        return (self.vision_start_id, self.image_pad_id, self.vision_end_id)


@dataclasses.dataclass(frozen=True)
class AudioConfig:
    """JobConfig.audio: the clips' sampling and the ids of an audio run."""
    sample_rate: int = 16000
    frames_per_token: int = 4
    max_seconds: int = 30
    audio_start_id: int = 151647
    audio_pad_id: int = 151646
    audio_end_id: int = 151648

    @classmethod
    def from_dict(cls, d):
        return cls(**{f.name: _int(d, f.name, f.default) for f in dataclasses.fields(cls)})

    @property
    def markers(self) -> Tuple[int, int, int]:
        return (self.audio_start_id, self.audio_pad_id, self.audio_end_id)


@dataclasses.dataclass(frozen=True)
class PostBalancing:
    """JobConfig.post_balancing: whether images are encoded away from their documents, and
    the embedding rows the exchange carries."""
    enabled: bool = False
    hidden_size: int = 4096
    embedding_dtype: str = "DTYPE_BFLOAT16"

    @classmethod
    def from_dict(cls, d):
        return cls(enabled=bool(d.get("enabled")) if d else False,
                   hidden_size=_int(d, "hidden_size", 4096),
                   embedding_dtype=(d.get("embedding_dtype") if d else None) or "DTYPE_BFLOAT16")


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """What the packer says of the job (tutti.v1.JobInfo) and its config's fields that
    trainers read. `raw` is the dict it was made from."""
    job_id: str
    world_size: int
    seed: int
    epochs: int
    config_fingerprint: str
    samples: int
    dataset_bytes: int
    steps_per_epoch: int
    total_steps: int
    shards: Tuple[str, ...]
    text_samples_per_step: int
    vl_samples_per_step: int
    vision: VisionConfig
    audio: AudioConfig
    post_balancing: PostBalancing
    # The job's sources (JobInfo.sources): the mixture's, or "text" and "vl" without one.
    source_names: Tuple[str, ...]
    has_mixture: bool
    # (start_step, fingerprint) of each mixture stage in force so far.
    mixture_history: Tuple[Tuple[int, str], ...]
    raw: dict = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, job):
        cfg = _msg(job, "config")
        batch = _msg(cfg, "batch")
        names = tuple(s["name"] for s in (job.get("sources") or []))
        return cls(
            job_id=cfg.get("job_id") or "", world_size=_int(cfg, "world_size"),
            seed=_int(cfg, "seed"), epochs=_int(cfg, "epochs"),
            config_fingerprint=job.get("config_fingerprint") or "",
            samples=_int(job, "samples"), dataset_bytes=_int(job, "dataset_bytes"),
            steps_per_epoch=_int(job, "steps_per_epoch"), total_steps=_int(job, "total_steps"),
            shards=tuple(job.get("shards") or ()),
            text_samples_per_step=_int(batch, "text_samples_per_step"),
            vl_samples_per_step=_int(batch, "vl_samples_per_step"),
            vision=VisionConfig.from_dict(_msg(cfg, "vision")),
            audio=AudioConfig.from_dict(_msg(cfg, "audio")),
            post_balancing=PostBalancing.from_dict(_msg(cfg, "post_balancing")),
            source_names=names or ("text", "vl"), has_mixture=cfg.get("mixture") is not None,
            mixture_history=tuple((_int(h, "start_step"), h.get("fingerprint") or "")
                                  for h in (job.get("mixture_history") or [])),
            raw=job)


@dataclasses.dataclass(frozen=True)
class DocImage:
    """An image of a document (DocImage): its index within the sample, its grid in ViT
    patches and its LLM tokens at the step's stage."""
    image_index: int
    grid_thw: Tuple[int, int, int]
    llm_tokens: int


@dataclasses.dataclass(frozen=True)
class DocSlot:
    """A document (or a piece of one) in a packed sequence (DocSlot)."""
    sample_id: int
    offset: int
    length: int
    encoder_tokens: int
    images: Tuple[DocImage, ...]
    piece: int = 0  # 0: the whole document; else piece `piece` of `pieces`
    pieces: int = 0
    first_audio: int = 0  # a piece's audio clips [first_audio, first_audio + audio_count)
    audio_count: int = 0
    text_begin: int = 0
    truncated: bool = False

    @classmethod
    def from_dict(cls, d):
        images = tuple(DocImage(_int(im, "image_index"), (_int(im, "grid_t", 1), _int(im, "grid_h"),
                                                          _int(im, "grid_w")), _int(im, "llm_tokens"))
                       for im in (d.get("images") or []))
        return cls(sample_id=_int(d, "sample_id"), offset=_int(d, "offset"),
                   length=_int(d, "length"), encoder_tokens=_int(d, "encoder_tokens"),
                   images=images, piece=_int(d, "piece"), pieces=_int(d, "pieces"),
                   first_audio=_int(d, "first_audio"), audio_count=_int(d, "audio_count"),
                   text_begin=_int(d, "text_begin"), truncated=bool(d.get("truncated")))

    @property
    def audio_tokens(self) -> int:
        """Its encoder tokens that are not its images': its audio clips'."""
        return self.encoder_tokens - sum(im.llm_tokens for im in self.images)


@dataclasses.dataclass(frozen=True)
class MicroBatchPlan:
    """A micro-batch of the plan: its modality ("MODALITY_TEXT", "MODALITY_VL") and its
    sequences, each a tuple of DocSlot."""
    modality: str
    sequences: Tuple[Tuple[DocSlot, ...], ...]

    @property
    def docs(self):
        return [d for seq in self.sequences for d in seq]


@dataclasses.dataclass(frozen=True)
class EncoderImage:
    """An image this rank encodes (ImagePlan): whose, its grid, and the rank whose document
    holds it."""
    sample_id: int
    image_index: int
    grid_thw: Tuple[int, int, int]
    llm_rank: int


@dataclasses.dataclass(frozen=True)
class RankPlan:
    """A rank's part of a step plan (tutti.v1.RankPlan). `raw` is the dict it was made from
    (its `exchange` is what tutti's transports take)."""
    rank: int
    plan_version: int
    micro_batches: Tuple[MicroBatchPlan, ...]
    vision_images: Tuple[EncoderImage, ...]  # in pixel_values order
    raw: dict = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, plan):
        mbs = tuple(MicroBatchPlan(mb.get("modality") or "MODALITY_UNSPECIFIED",
                                   tuple(tuple(DocSlot.from_dict(d) for d in (seq.get("docs") or []))
                                         for seq in (mb.get("sequences") or [])))
                    for mb in (plan.get("micro_batches") or []))
        images = tuple(EncoderImage(_int(i, "sample_id"), _int(i, "image_index"),
                                    (_int(i, "grid_t", 1), _int(i, "grid_h"), _int(i, "grid_w")),
                                    _int(i, "llm_rank"))
                       for enc in (plan.get("encoders") or [])
                       if enc.get("encoder") == "ENCODER_VISION" for i in (enc.get("images") or []))
        return cls(rank=_int(plan, "rank"), plan_version=_int(plan, "plan_version"),
                   micro_batches=mbs, vision_images=images, raw=plan)

    def doc_slots(self) -> dict:
        """{sample_id: DocSlot} over every micro-batch."""
        return {d.sample_id: d for mb in self.micro_batches for d in mb.docs}

    def find_doc(self, sample_id) -> Optional[DocSlot]:
        return self.doc_slots().get(int(sample_id))
