"""One record -> one tutti sample (schema 2): k.json and its images in order of appearance.

The conversation is rendered with the chat template, each image as a unique mark at its
place; the text between the marks is tokenized and each mark becomes ONE placeholder id
(the stager writes vision_start, image_pad x n, vision_end there). The assistant's turns,
end-of-turn token included, become `trained` token spans; a placeholder is never in one.
"""
import json
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from . import images as image_io
from .records import ASSISTANT, Record, Skip, check_conversation
from .template import IMAGE_CLOSE, IMAGE_OPEN, RESERVED, RESERVED_UTF8_PREFIX, ChatTemplate
from .tokenizer import MARKER_TOKENS

SCHEMA = 2
_IMAGE_MARK = re.compile(IMAGE_OPEN + r"(\d+)" + IMAGE_CLOSE)
_GROUPS = {"vision": ("vision_start", "image_pad", "vision_end"),
           "audio": ("audio_start", "audio_pad", "audio_end")}


@dataclass
class Limits:
    max_tokens: int = 65536               # input_ids per sample, each image counted as one
    max_images: int = 64                  # images per sample (the index's default limit)
    max_sample_bytes: int = 64 << 20      # k.json and image members together
    max_meta_bytes: int = 64 << 10        # the "meta" object as JSON
    images: image_io.ImageLimits = field(default_factory=image_io.ImageLimits)


@dataclass
class Vocabulary:
    """The ids the manifest records: markers by name, placeholders by modality, and the
    vocabulary size they all lie under."""
    markers: Dict[str, int]
    placeholders: Dict[str, int]
    vocab_size: int

    @property
    def reserved(self) -> frozenset:
        return frozenset(self.markers.values()) | frozenset(self.placeholders.values())


def resolve_vocabulary(tokenizer, vision_ids: Optional[List[int]] = None,
                       audio_ids: Optional[List[int]] = None,
                       image_placeholder: Optional[int] = None) -> Vocabulary:
    """Markers from the flags, else the tokenizer's own tokens (<|vision_start|>, ...),
    else new ids after its vocabulary (and after any given); the image placeholder is
    image_pad unless given. ValueError when the markers are not six distinct ids."""
    groups = {}
    for group, given in (("vision", vision_ids), ("audio", audio_ids)):
        ids = list(given) if given else [tokenizer.token_id(MARKER_TOKENS[n]) for n in _GROUPS[group]]
        groups[group] = None if None in ids else ids
    known = [i for ids in groups.values() if ids for i in ids]
    next_id = max([tokenizer.vocab_size] + [i + 1 for i in known])
    markers = {}
    for group, ids in groups.items():
        if ids is None:
            ids, next_id = list(range(next_id, next_id + 3)), next_id + 3
        markers.update(zip(_GROUPS[group], ids))
    if len(set(markers.values())) != len(markers):
        raise ValueError(f"the marker ids must be distinct: {markers}")
    placeholders = {"image": markers["image_pad"] if image_placeholder is None else image_placeholder,
                    "audio": markers["audio_pad"]}
    top = max([*markers.values(), *placeholders.values()]) + 1
    return Vocabulary(markers, placeholders, max(next_id, top))


@dataclass
class Sample:
    key: str
    members: List[Tuple[str, bytes]]
    tokens: int
    trained_tokens: int
    images: int

    @property
    def size(self) -> int:
        return sum(len(data) for _, data in self.members)

    def stats(self) -> Tuple[int, int, int]:
        """(tokens, trained tokens, images), what the summary counts."""
        return self.tokens, self.trained_tokens, self.images


class SampleBuilder:
    def __init__(self, tokenizer, template: Optional[ChatTemplate], vocab: Vocabulary, limits: Limits):
        self.tokenizer, self.template, self.vocab, self.limits = tokenizer, template, vocab, limits
        self._placeholder = vocab.placeholders["image"]
        # Ids text must not encode to: the tokenizer's unknown token, and the reserved ids
        # it has tokens for (ids appended after its vocabulary it never gives).
        self._reserved = frozenset(i for i in vocab.reserved if i < tokenizer.vocab_size)
        self._refused = self._reserved | ({tokenizer.unk_id} if tokenizer.unk_id is not None else set())

    def build(self, key: str, record: Record) -> Sample:
        check_conversation(record)
        if len(record.images) > self.limits.max_images:
            raise Skip("too_many_images", f"{len(record.images)} images, over --max-images "
                       f"{self.limits.max_images}")
        for turn in record.turns:
            for part in turn.parts:
                if isinstance(part, str):
                    _check_text(part)
        ids, spans, order = self._plain(record) if record.plain else self._chat(record)
        if len(ids) > self.limits.max_tokens:
            raise Skip("too_many_tokens", f"{len(ids)} tokens, over --max-tokens {self.limits.max_tokens}")
        loaded = [image_io.load(record.images[i], self.limits.images) for i in order]
        meta = None
        if record.meta:
            try:
                meta = _dumps(record.meta)
            except (TypeError, ValueError) as e:
                raise Skip("bad_record", f"a --meta-fields value is not JSON: {e}") from None
            if len(meta) > self.limits.max_meta_bytes:
                raise Skip("too_large", f"meta is {len(meta)} bytes as JSON, over --max-meta-bytes "
                           f"{self.limits.max_meta_bytes}")
        members = [(f"{key}.json", sample_json(ids, spans, record.source, meta))]
        members += [(f"{key}.{n}.{im.ext}", im.data) for n, im in enumerate(loaded)]
        sample = Sample(key, members, len(ids), sum(e - b for b, e in spans), len(loaded))
        if sample.size > self.limits.max_sample_bytes:
            raise Skip("too_large", f"{sample.size} bytes, over --max-sample-bytes "
                       f"{self.limits.max_sample_bytes}")
        return sample

    def _plain(self, record: Record):
        """Caption layout: the images, the caption, EOS; the caption and EOS trained."""
        text = "".join(t.text() for t in record.turns if t.role == ASSISTANT)
        ids, _ = self._encode(text, [])
        eos = [] if self.tokenizer.eos_id is None else [self.tokenizer.eos_id]
        n = len(record.images)
        return [self._placeholder] * n + ids + eos, [(n, n + len(ids) + len(eos))], list(range(n))

    def _chat(self, record: Record):
        messages = [self.template.message(t.role, [p if isinstance(p, str) else
                                                   f"{IMAGE_OPEN}{p}{IMAGE_CLOSE}" for p in t.parts])
                    for t in record.turns]
        text, char_spans = self.template.render_with_spans(messages)
        marks = list(_IMAGE_MARK.finditer(text))
        order = [int(m.group(1)) for m in marks]
        if sorted(order) != list(range(len(record.images))):
            raise Skip("template_error", f"the chat template's text holds images {order} of "
                       f"{len(record.images)}: it dropped or repeated an image")
        ids: List[int] = []
        spans: List[Tuple[int, int]] = []
        bounds = [0] + [p for m in marks for p in m.span()] + [len(text)]
        for n, (begin, end) in enumerate(zip(bounds[::2], bounds[1::2])):
            if n:
                ids.append(self._placeholder)
            local = [(max(b, begin) - begin, min(e, end) - begin) for b, e in char_spans
                     if b < end and e > begin]
            piece_ids, piece_spans = self._encode(text[begin:end], local)
            spans += [(len(ids) + b, len(ids) + e) for b, e in piece_spans if e > b]
            ids += piece_ids
        return ids, _merge(spans), order

    def _encode(self, text: str, spans):
        ids, token_spans = self.tokenizer.encode(text, spans)
        if self._refused.isdisjoint(ids):
            return ids, token_spans
        unk = self.tokenizer.unk_id
        if unk is not None and unk in ids:
            chars = [c for c in sorted(set(text)) if unk in self.tokenizer.encode(c)[0]]
            shown = ", ".join(repr(c) for c in chars[:8]) or "a sequence of the text"
            raise Skip("unencodable", f"the tokenizer has no token for {shown}")
        found = sorted(self._reserved.intersection(ids))
        raise Skip("placeholder_in_text", f"the text holds reserved token ids {found} "
                   "(image/audio placeholders and markers)")


def _check_text(text: str) -> None:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Skip("unencodable", f"the text is not valid Unicode ({e.reason} at {e.start})") from None
    found = RESERVED_UTF8_PREFIX in data and RESERVED.search(text)
    if found:
        raise Skip("unencodable", f"the text holds U+{ord(found.group()):04X}, a noncharacter "
                   "reserved for internal use")


def _merge(spans: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    out: List[Tuple[int, int]] = []
    for b, e in sorted(spans):
        if out and b <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((b, e))
    return out


def _dumps(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sample_json(ids: List[int], spans, source: Optional[str], meta: Optional[bytes]) -> bytes:
    """k.json as _dumps writes it (keys sorted, no spaces). The id lists, most of its bytes,
    are written by repr, which is faster at them than the generic encoder."""
    out = [b'{"input_ids":', repr(ids).replace(" ", "").encode()]
    if meta is not None:
        out += [b',"meta":', meta]
    out.append(b',"schema":%d' % SCHEMA)
    if source is not None:
        out += [b',"source":', _dumps(source)]
    out += [b',"trained":', repr([list(s) for s in spans]).replace(" ", "").encode(), b"}"]
    return b"".join(out)
