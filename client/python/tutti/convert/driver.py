"""The conversion: inputs scanned into numbered records, tasks of records converted by a
pool of worker processes, their results taken back in record order and cut into shards.

Output bytes depend only on the inputs and the options that shape samples: a sample's key
is its record's number, shards are cut in record order by one writer, so any --workers
gives the same shards. A rerun of the same conversion keeps the shards the log lists
(present, of their logged size), removes the rest and converts from the first record
after them, which gives the bytes an uninterrupted run writes.
"""
import hashlib
import json
import multiprocessing
import os
import re
import signal
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import datetime
from itertools import islice
from typing import Any, Dict, List, Optional

from . import formats, inputs, shards
from . import tokenizer as tokenizers
from .formats import FormatOptions
from .progress import Progress
from .records import Skip
from .sample import Limits, SampleBuilder, resolve_vocabulary
from .template import ChatTemplate, TemplateSetupError, load_source

OUTPUT_VERSION = 1  # bumped when the same inputs and options would give other bytes


class ConvertError(Exception):
    """The conversion cannot go on: the message says why and what to do."""


@dataclass
class ConvertOptions:
    inputs: List[str]
    out: str
    tokenizer: str
    tokenizer_kind: str = "auto"            # auto | hf | sentencepiece
    chat_template: Optional[str] = None     # None: the tokenizer's, else the default
    template_vars: Dict[str, Any] = field(default_factory=dict)  # more template variables
    template_date: str = "2024-01-01"       # what strftime_now formats
    formats: FormatOptions = field(default_factory=FormatOptions)
    limits: Limits = field(default_factory=Limits)
    vision_ids: Optional[List[int]] = None  # vision_start, image_pad, vision_end
    audio_ids: Optional[List[int]] = None   # audio_start, audio_pad, audio_end
    image_placeholder_id: Optional[int] = None  # None: image_pad
    shard_size: int = 1 << 30               # bytes per shard (a lone larger sample: its own)
    samples_per_shard: int = 0              # 0: no limit
    workers: int = 0                        # 0: the CPUs this process may use
    strict: bool = False                    # the first skipped record ends the run
    overwrite: bool = False                 # replace another conversion's output in --out
    examples: int = 5                       # skipped records named per reason
    progress: str = "auto"                  # auto | never
    task_records: int = 64                  # records per worker task (no effect on output)

    def fingerprint(self, context: "Context", files: List[str]) -> str:
        shaping = asdict(self)
        for name in ("inputs", "out", "tokenizer", "chat_template", "workers", "strict",
                     "overwrite", "progress", "task_records"):
            shaping.pop(name)
        if shaping["formats"]["image_root"]:
            shaping["formats"]["image_root"] = os.path.abspath(shaping["formats"]["image_root"])
        stats = [os.stat(p) for p in files]
        shaping.update(
            version=OUTPUT_VERSION, tokenizer_sha256=context.tokenizer.sha256,
            template_sha256=context.template_sha256,
            inputs=[[os.path.abspath(p), s.st_size, s.st_mtime_ns] for p, s in zip(files, stats)])
        return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()


class Context:
    """What converting a record needs, built once per process."""

    def __init__(self, o: ConvertOptions):
        try:
            date = datetime.fromisoformat(o.template_date)
        except ValueError as e:
            raise ConvertError(f"--template-date {o.template_date}: {e}") from None
        try:
            self.tokenizer = tokenizers.load(o.tokenizer, o.tokenizer_kind)
            tok_dir = o.tokenizer if os.path.isdir(o.tokenizer) else None
            source, self.template_origin = load_source(o.chat_template, tok_dir)
            self.template = ChatTemplate(source, {**self.tokenizer.special_tokens, **o.template_vars}, date)
        except (tokenizers.TokenizerSetupError, TemplateSetupError) as e:
            raise ConvertError(str(e)) from None
        self.template_sha256 = hashlib.sha256(source.encode("utf-8")).hexdigest()
        try:
            self.vocab = resolve_vocabulary(self.tokenizer, o.vision_ids, o.audio_ids,
                                            o.image_placeholder_id)
        except ValueError as e:
            raise ConvertError(f"--vision-ids / --audio-ids: {e}") from None
        self.builder = SampleBuilder(self.tokenizer, self.template, self.vocab, o.limits)
        self.formats = o.formats
        self.key_width = 9

    def convert(self, task) -> list:
        """("sample", its tar members' bytes, Sample.stats) or ("skip", reason, "where: why")
        per record of the task."""
        base = os.path.dirname(os.path.abspath(task.path))
        out = []
        for name, raw in inputs.read(task):
            try:
                if isinstance(raw, Skip):
                    raise raw
                record = formats.parse(raw, self.formats, base)
                key = f"{task.index + len(out):0{self.key_width}d}"
                sample = self.builder.build(key, record)
                out.append(("sample", shards.sample_bytes(sample), sample.stats()))
            except Skip as s:
                out.append(("skip", s.reason, f"{name}: {s.message}"))
            except Exception as e:  # a defect, not bad input: stop, naming the record
                raise RuntimeError(f"{name}: converting this record failed: {e!r}") from e
        return out


_WORKER: Optional[Context] = None


def _init_worker(options: ConvertOptions, key_width: int) -> None:
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool
    _WORKER = Context(options)
    _WORKER.key_width = key_width


def _convert_in_worker(task) -> list:
    return _WORKER.convert(task)


@dataclass
class Report:
    out: str
    records: int
    total: shards.Tally
    shards: List[str]
    kept_shards: int
    bytes: int
    seconds: float
    workers: int
    tokenizer: str
    template: str

    def to_json(self) -> dict:
        d = asdict(self)
        d["skipped"] = sum(self.total.skipped.values())
        return d


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


_OURS = re.compile(r"shard-\d{6}\.tar(\.partial)?$")


def _prepare_out(o: ConvertOptions, fingerprint: str) -> List[shards.ShardEntry]:
    """The finished shards a rerun keeps; removes everything else this conversion wrote."""
    out = o.out
    state_dir = os.path.join(out, shards.STATE_DIR)
    os.makedirs(state_dir, exist_ok=True)
    ours = sorted(n for n in os.listdir(out) if _OURS.match(n) or n == shards.MANIFEST)
    state = shards.read_state(out)
    if o.overwrite:
        for n in ours + [os.path.join(shards.STATE_DIR, n) for n in os.listdir(state_dir)]:
            os.remove(os.path.join(out, n))
        ours, state = [], None
    if state is None and ours:
        raise ConvertError(f"--out {out} holds shards this converter did not record writing; "
                           "choose another --out or pass --overwrite to replace them")
    if state is not None and state.get("fingerprint") != fingerprint:
        raise ConvertError(f"--out {out} holds a conversion of other inputs or options; rerun "
                           "that one, choose another --out, or pass --overwrite to replace it")
    if state is None:
        shards.write_json_atomic(os.path.join(state_dir, "state.json"),
                                 {"fingerprint": fingerprint, "version": OUTPUT_VERSION})
    log = shards.ShardLog(out)
    kept = log.read_valid(out)
    log.rewrite(kept)
    keep = {e.shard for e in kept}
    for n in ours:
        if n not in keep:
            os.remove(os.path.join(out, n))
    return kept


def run(o: ConvertOptions, stderr=None) -> Report:
    start = time.monotonic()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # workers are the parallelism
    context = Context(o)
    try:
        files = inputs.discover(o.inputs, exclude=o.out)
        scanned = [inputs.InputFile(p) for p in files]
    except inputs.InputError as e:
        raise ConvertError(str(e)) from None
    records = sum(f.count for f in scanned)
    context.key_width = max(9, len(str(max(records - 1, 0))))
    try:
        kept = _prepare_out(o, o.fingerprint(context, files))
    except OSError as e:
        raise ConvertError(f"--out {o.out}: {e}") from None
    first = kept[-1].end_record if kept else 0
    writer = shards.ShardWriter(o.out, shards.ShardLog(o.out), o.shard_size, o.samples_per_shard,
                                len(kept), first, o.examples)
    workers = o.workers or _cpu_count()
    progress = Progress(records, o.progress, stream=stderr)
    done, skipped = first, sum(sum(e.tally.skipped.values()) for e in kept)
    try:
        for task, results in _results(o, context, _tasks(scanned, first, o.task_records), workers,
                                      context.key_width):
            if len(results) != task.count:
                raise ConvertError(f"{task.path} changed while it was converted (expected "
                                   f"{task.count} records in a task, read {len(results)}); rerun")
            for offset, result in enumerate(results):
                if result[0] == "sample":
                    writer.add_sample(task.index + offset, result[1], result[2])
                    continue
                if o.strict:
                    raise ConvertError(f"{result[2]} [{result[1]}] (--strict: a skipped record "
                                       "ends the run; the shards before it are kept)")
                writer.add_skip(result[1], result[2])
                skipped += 1
            done += len(results)
            progress.update(done, skipped, writer.next_shard)
        tail = writer.finish(records)
    except OSError as e:  # a full disk, a lost mount, an input gone
        raise ConvertError(f"{e} (rerun the same command to resume)") from None
    finally:
        writer.abandon()
    progress.update(done, skipped, writer.next_shard, final=True)
    entries = kept + writer.written
    total = shards.Tally()
    for e in entries:
        total.merge(e.tally, o.examples)
    total.merge(tail, o.examples)
    names = [e.shard for e in entries]
    shards.write_json_atomic(os.path.join(o.out, shards.MANIFEST), shards.manifest(
        context.tokenizer, o.tokenizer, context.template_sha256, context.vocab, total.samples, names))
    return Report(o.out, records, total, names, len(kept), sum(e.bytes for e in entries),
                  time.monotonic() - start, workers, f"{context.tokenizer.kind} {o.tokenizer}",
                  context.template_origin)


def _tasks(scanned: List[inputs.InputFile], first: int, size: int):
    """Tasks over records [first, end) of the whole input."""
    base = 0
    for f in scanned:
        if base + f.count > first:
            begin = max(first - base, 0)
            yield from f.tasks(begin, base + begin, size)
        base += f.count


def _results(o: ConvertOptions, context: Context, tasks, workers: int, key_width: int):
    """(task, its results) in task order, converted here or by a pool of `workers`."""
    if workers <= 1:
        for task in tasks:
            yield task, context.convert(task)
        return
    pool = multiprocessing.get_context().Pool(workers, _init_worker, (o, key_width))
    try:
        window = deque()
        for task in islice(tasks, 4 * workers):
            window.append((task, pool.apply_async(_convert_in_worker, (task,))))
        while window:
            task, pending = window.popleft()
            results = pending.get()
            for more in islice(tasks, 1):
                window.append((more, pool.apply_async(_convert_in_worker, (more,))))
            yield task, results
        pool.close()
    finally:
        pool.terminate()
        pool.join()
