"""Shard files: deterministic tar members, shards written under a temporary name and
renamed when whole, the log of finished shards a rerun resumes from, the manifest.

Layout of --out:
  shard-000000.tar, ...       the samples, in record order
  tutti_dataset.json          the manifest (written last)
  .tutti-convert/state.json   what the conversion is (its fingerprint)
  .tutti-convert/shards.jsonl one line per finished shard: its size, the records it
                              covers and what they gave (samples, skips by reason)
A shard being written is shard-NNNNNN.tar.partial; `tutti index` reads only *.tar.
"""
import json
import os
import tarfile
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

from .sample import Sample

BLOCK = 512
END_OF_ARCHIVE = b"\0" * (2 * BLOCK)
MANIFEST = "tutti_dataset.json"
STATE_DIR = ".tutti-convert"


def shard_name(n: int) -> str:
    return f"shard-{n:06d}.tar"


def member_header(name: str, size: int) -> bytes:
    """A ustar header with fixed metadata: mode 0644, uid/gid 0, mtime 0, no owner names
    (what tarfile writes for such a TarInfo, without its per-member cost)."""
    raw = name.encode("utf-8")
    if len(raw) > 100:  # sample keys are record numbers: never reached
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode, info.uname, info.gname = size, 0, 0o644, "", ""
        return info.tobuf(format=tarfile.GNU_FORMAT, encoding="utf-8", errors="strict")
    h = bytearray(BLOCK)
    h[:len(raw)] = raw
    h[100:148] = b"0000644\0" b"0000000\0" b"0000000\0" + b"%011o\0" % size + b"00000000000\0"
    h[148:156] = b" " * 8
    h[156:157] = tarfile.REGTYPE
    h[257:265] = tarfile.POSIX_MAGIC
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def member_bytes(name: str, data: bytes) -> bytes:
    return member_header(name, len(data)) + data + b"\0" * (-len(data) % BLOCK)


def sample_bytes(sample: Sample) -> bytes:
    return b"".join(member_bytes(name, data) for name, data in sample.members)


@dataclass
class Tally:
    """What a run of records gave: samples written and records skipped, by reason, with
    the first few skipped records named per reason."""
    records: int = 0
    samples: int = 0
    images: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    sample_bytes: int = 0
    skipped: Dict[str, int] = field(default_factory=dict)
    examples: Dict[str, List[str]] = field(default_factory=dict)

    def add_sample(self, stats: Tuple[int, int, int], size: int) -> None:
        self.records += 1
        self.samples += 1
        self.tokens += stats[0]
        self.trained_tokens += stats[1]
        self.images += stats[2]
        self.sample_bytes += size

    def add_skip(self, reason: str, example: str, keep: int) -> None:
        self.records += 1
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        named = self.examples.setdefault(reason, [])
        if len(named) < keep:
            named.append(example)

    def merge(self, other: "Tally", keep: int) -> None:
        for name in ("records", "samples", "images", "tokens", "trained_tokens", "sample_bytes"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for reason, n in other.skipped.items():
            self.skipped[reason] = self.skipped.get(reason, 0) + n
            named = self.examples.setdefault(reason, [])
            named += other.examples.get(reason, [])[:max(0, keep - len(named))]


@dataclass
class ShardEntry:
    shard: str
    bytes: int
    first_record: int
    end_record: int
    tally: Tally


class ShardLog:
    """The finished shards, one JSON line each, appended and fsync'd after the rename."""

    def __init__(self, out_dir: str):
        self.path = os.path.join(out_dir, STATE_DIR, "shards.jsonl")

    def read_valid(self, out_dir: str) -> List[ShardEntry]:
        """The leading entries whose shard file is there with its logged size."""
        entries: List[ShardEntry] = []
        try:
            with open(self.path, encoding="utf-8") as f:
                lines = f.read().split("\n")
        except FileNotFoundError:
            return entries
        for line in lines:
            try:
                d = json.loads(line)
                entry = ShardEntry(d["shard"], d["bytes"], d["first_record"], d["end_record"],
                                   Tally(**d["tally"]))
            except (ValueError, KeyError, TypeError):
                break  # a torn last line
            path = os.path.join(out_dir, entry.shard)
            if (entry.shard != shard_name(len(entries)) or not os.path.isfile(path)
                    or os.path.getsize(path) != entry.bytes):
                break
            entries.append(entry)
        return entries

    def rewrite(self, entries: List[ShardEntry]) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for e in entries:
                f.write(_entry_line(e))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def append(self, entry: ShardEntry) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(_entry_line(entry))
            f.flush()
            os.fsync(f.fileno())


def _entry_line(e: ShardEntry) -> str:
    return json.dumps(asdict(e), sort_keys=True, separators=(",", ":")) + "\n"


class ShardWriter:
    """Cuts the record stream into shards: a shard closes before a sample that would take
    it over shard_size bytes (a lone larger sample gets a shard of its own) or past
    samples_per_shard (0: no limit), and at the end of the input."""

    def __init__(self, out_dir: str, log: ShardLog, shard_size: int, samples_per_shard: int,
                 first_shard: int, first_record: int, examples: int):
        self.out_dir, self.log = out_dir, log
        self.shard_size, self.samples_per_shard, self.keep = shard_size, samples_per_shard, examples
        self.next_shard, self.first_record = first_shard, first_record
        self.written: List[ShardEntry] = []
        self._file = None
        self._bytes = 0
        self._tally = Tally()

    def add_sample(self, index: int, data: bytes, stats: Tuple[int, int, int]) -> None:
        """Record `index`'s sample: its tar members' bytes and Sample.stats()."""
        if self._tally.samples and (
                self._bytes + len(data) + len(END_OF_ARCHIVE) > self.shard_size or
                (self.samples_per_shard and self._tally.samples >= self.samples_per_shard)):
            self._close(index)
        if self._file is None:
            self._file = open(self._partial(), "wb")
        self._file.write(data)
        self._bytes += len(data)
        self._tally.add_sample(stats, len(data))

    def add_skip(self, reason: str, example: str) -> None:
        self._tally.add_skip(reason, example, self.keep)

    def finish(self, end_record: int) -> Tally:
        """Closes the last shard; returns what the records after it gave (skips only)."""
        if self._tally.samples:
            self._close(end_record)
        return self._tally

    def abandon(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _partial(self) -> str:
        return os.path.join(self.out_dir, shard_name(self.next_shard) + ".partial")

    def _close(self, end_record: int) -> None:
        f, self._file = self._file, None
        f.write(END_OF_ARCHIVE)
        f.flush()
        os.fsync(f.fileno())
        f.close()
        name = shard_name(self.next_shard)
        os.replace(self._partial(), os.path.join(self.out_dir, name))
        fsync_dir(self.out_dir)
        entry = ShardEntry(name, self._bytes + len(END_OF_ARCHIVE), self.first_record, end_record,
                           self._tally)
        self.log.append(entry)
        self.written.append(entry)
        self.next_shard += 1
        self.first_record = end_record
        self._bytes = 0
        self._tally = Tally()


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, sort_keys=True, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def manifest(tokenizer, tokenizer_path: str, template_sha256: str, vocab, samples: int,
             shards: List[str]) -> dict:
    """tutti_dataset.json, as the sample schema defines it."""
    return {
        "format": "tutti-dataset",
        "schema": 2,
        "tokenizer": {"kind": tokenizer.kind, "path": tokenizer_path,
                      "vocab_size": vocab.vocab_size, "sha256": tokenizer.sha256},
        "chat_template_sha256": template_sha256,
        "placeholders": dict(vocab.placeholders),
        "markers": dict(vocab.markers),
        "samples": samples,
        "shards": shards,
    }


def read_state(out_dir: str) -> Optional[dict]:
    try:
        with open(os.path.join(out_dir, STATE_DIR, "state.json"), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except ValueError:
        return {}
