"""Input files -> numbered raw records, in tasks a worker reads on its own.

  .jsonl     one record per line (blank lines are not records); a worker reads its byte
             range of the file
  .json      one JSON array of records (or one record), parsed whole here
  .tar       a WebDataset shard: the members sharing a key form a record (image members
             jpg/jpeg/png/webp, k.txt as the caption, k.json's object as the record's other
             fields); a worker reads its members by offset
  .parquet   rows (FineVision's form, images as {"bytes", "path"}), only when pyarrow is
             installed (it is not a Debian package); a worker reads its row group

Records are numbered in input order: files as given (a directory's files sorted by path),
then records in file order. A file that cannot be read is an error naming it, not a skip.
"""
import bisect
import json
import os
import tarfile
from array import array
from dataclasses import dataclass
from typing import Iterator, List, Tuple, Union

from .records import Skip

EXTENSIONS = (".jsonl", ".json", ".tar", ".parquet")
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")


class InputError(Exception):
    """An input file that cannot be read at all."""


def discover(paths: List[str], exclude: str = "") -> List[str]:
    """The input files: paths as given, directories' files sorted by path (leaving out
    those under `exclude`, the output directory)."""
    out = []
    skip = os.path.join(os.path.abspath(exclude), "") if exclude else None
    for p in paths:
        if os.path.isdir(p):
            found = sorted(os.path.join(d, n) for d, _, names in os.walk(p) for n in names
                           if n.endswith(EXTENSIONS) and not
                           (skip and os.path.abspath(os.path.join(d, n)).startswith(skip)))
            if not found:
                raise InputError(f"{p}: no {', '.join(EXTENSIONS)} files in it")
            out += found
        elif os.path.exists(p):
            if not p.endswith(EXTENSIONS):
                raise InputError(f"{p}: unknown input type (expected {', '.join(EXTENSIONS)})")
            out.append(p)
        else:
            raise InputError(f"{p}: no such file or directory")
    return out


# Tasks: picklable, each a run of `count` consecutive records of one file, the first of
# them record number `index` of the whole input.
@dataclass
class JsonlTask:
    path: str
    index: int
    count: int
    begin: int        # byte range of the lines
    end: int
    first_line: int   # 1-based line number of the first


@dataclass
class JsonTask:
    path: str
    index: int
    count: int
    first: int        # position in the file's array
    records: list


@dataclass
class TarTask:
    path: str
    index: int
    count: int
    samples: List[Tuple[str, List[Tuple[str, int, int]]]]  # key, [(ext, offset, size)]


@dataclass
class ParquetTask:
    path: str
    index: int
    count: int
    row_group: int
    first: int        # row within the group
    first_row: int    # row within the file


Task = Union[JsonlTask, JsonTask, TarTask, ParquetTask]
Raw = Union[dict, Skip]


class InputFile:
    """One scanned input: its record count and tasks over any run of its records."""

    def __init__(self, path: str):
        self.path = path
        self.kind = os.path.splitext(path)[1][1:]
        try:
            getattr(self, "_scan_" + self.kind)()
        except (OSError, ValueError, tarfile.TarError) as e:
            raise InputError(f"{path}: cannot read: {e}") from None

    def tasks(self, first: int, index: int, size: int) -> Iterator[Task]:
        """Tasks of about `size` records covering this file's records from `first` on,
        record `first` being number `index` of the whole input."""
        while first < self.count:
            n = min(size, self.count - first)
            if self.kind == "parquet":  # stay inside a row group
                group = bisect.bisect_right(self._group_starts, first) - 1
                n = min(n, self._group_starts[group + 1] - first)
                yield ParquetTask(self.path, index, n, group, first - self._group_starts[group], first)
            elif self.kind == "jsonl":
                stop = self._offsets[first + n] if first + n < self.count else self._end
                yield JsonlTask(self.path, index, n, self._offsets[first], stop, self._lines[first])
            elif self.kind == "json":
                yield JsonTask(self.path, index, n, first, self._records[first:first + n])
            else:
                yield TarTask(self.path, index, n, self._samples[first:first + n])
            first += n
            index += n

    def _scan_jsonl(self):
        self._offsets, self._lines = array("q"), array("q")
        pos = 0
        with open(self.path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.isspace():
                    self._offsets.append(pos)
                    self._lines.append(lineno)
                pos += len(line)
        self._end = pos
        self.count = len(self._offsets)

    def _scan_json(self):
        with open(self.path, "rb") as f:
            data = json.load(f)
        self._records = data if isinstance(data, list) else [data]
        self.count = len(self._records)

    def _scan_tar(self):
        self._samples = []
        with tarfile.open(self.path, "r:") as tf:
            for m in tf:
                if not m.isfile():
                    continue
                base = m.name.rsplit("/", 1)
                dot = base[-1].find(".")
                if dot <= 0:
                    continue
                key = m.name[:len(m.name) - len(base[-1]) + dot]
                ext = base[-1][dot + 1:].lower()
                if not self._samples or self._samples[-1][0] != key:
                    self._samples.append((key, []))
                self._samples[-1][1].append((ext, m.offset_data, m.size))
        self.count = len(self._samples)

    def _scan_parquet(self):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise InputError(f"{self.path}: reading Parquet needs pyarrow (pip install pyarrow), "
                             "or export the rows as JSONL") from None
        meta = pq.ParquetFile(self.path).metadata
        self._group_starts = [0]
        for g in range(meta.num_row_groups):
            self._group_starts.append(self._group_starts[-1] + meta.row_group(g).num_rows)
        self.count = self._group_starts[-1]


def read(task: Task) -> Iterator[Tuple[str, Raw]]:
    """(name, raw record or Skip) for each record of a task, in order; the name says
    where the record is (file:line, file[index], shard:key, file#row)."""
    if isinstance(task, JsonlTask):
        with open(task.path, "rb") as f:
            f.seek(task.begin)
            data = f.read(task.end - task.begin)
        lineno = task.first_line - 1
        for line in data.split(b"\n"):
            lineno += 1
            if not line or line.isspace():
                continue
            yield f"{task.path}:{lineno}", _json(line)
    elif isinstance(task, JsonTask):
        for i, rec in enumerate(task.records):
            yield f"{task.path}[{task.first + i}]", rec
    elif isinstance(task, TarTask):
        with open(task.path, "rb") as f:
            for key, members in task.samples:
                yield f"{task.path}:{key}", _wds_sample(f, members)
    else:
        import pyarrow.parquet as pq

        group = pq.ParquetFile(task.path).read_row_group(task.row_group)
        for i, row in enumerate(group.slice(task.first, task.count).to_pylist()):
            yield f"{task.path}#{task.first_row + i}", row


def _json(line: bytes) -> Raw:
    try:
        return json.loads(line)
    except ValueError as e:  # UnicodeDecodeError is one too
        return Skip("bad_record", f"not JSON: {e}")


def _wds_sample(f, members) -> Raw:
    def member(offset, size):
        f.seek(offset)
        return f.read(size)

    raw: dict = {}
    images = []
    for ext, offset, size in members:
        last = ext.rsplit(".", 1)[-1]
        if ext == "json":
            obj = _json(member(offset, size))
            if not isinstance(obj, dict):
                return obj if isinstance(obj, Skip) else Skip("bad_record", ".json is not an object")
            raw = {**obj, **raw}
        elif ext == "txt":
            try:
                raw["caption"] = member(offset, size).decode("utf-8")
            except UnicodeDecodeError as e:
                return Skip("bad_record", f".txt is not UTF-8: {e}")
        elif last in IMAGE_EXTS:
            images.append((_media_order(ext), member(offset, size)))
    if images:
        raw["images"] = [data for _, data in sorted(images)]
    return raw


def _media_order(ext: str):
    """jpg < 0.jpg < 1.png < 10.webp, as `tutti index` orders a sample's images."""
    head = ext.split(".", 1)[0]
    if "." not in ext:
        return (-1, ext)
    return (int(head), ext) if head.isdigit() else (1 << 62, ext)
