"""Input record formats -> `Record`.

  llava       {"image": "a.jpg" | ["a.jpg", ...], "images": [...], "conversations":
               [{"from": "human" | "gpt" | "system", "value": "<image>\\nWhat is it?"}, ...]}
               (ShareGPT's "conversations" too)
  messages    {"messages": [{"role": "user", "content": "text" | [{"type": "image"},
               {"type": "text", "text": "..."}, ...]}, ...], "images": [...]}: OpenAI / HF
               chat form; an image part names its image ("image", "path", "url",
               "image_url": {"url"}) or takes the next of "images"; string content places
               "images" at its <image> tags
  finevision  {"images": [...], "texts": [{"user": "...", "assistant": "..."}, ...]}: the
               images go where <image> tags are, or at the start of the first user turn
               when the texts have none
  caption     {"image" | "images": ..., "caption" | "txt" | "text": "..."}, also a
               WebDataset sample's image members and its .txt/.json member

An image is a path (relative to --image-root), a data: URL, inline bytes, or an HF
`datasets` Image value ({"bytes": ..., "path": ...}; bytes as base64 text in JSON).
"""
import base64
import binascii
import os
from dataclasses import dataclass, field
from typing import List, Optional

from .records import ASSISTANT, ROLE_NAMES, USER, ImageRef, Record, Skip, Turn

IMAGE_TAG = "<image>"
FORMATS = ("auto", "llava", "messages", "finevision", "caption")


@dataclass
class FormatOptions:
    """How raw records are read (the CLI's options of the same names)."""
    format: str = "auto"                 # one of FORMATS; auto: by the record's fields
    image_root: Optional[str] = None     # base of relative image paths; None: the input's dir
    source: Optional[str] = None         # the samples' "source"; None: the record's "source"
    meta_fields: List[str] = field(default_factory=lambda: ["id"])  # copied into "meta"
    caption_style: str = "chat"          # chat: a user turn of the images, the caption as
                                         # the answer; plain: images, caption, EOS
    caption_prompt: str = ""             # the user text beside the images (chat style)


def detect(raw: dict) -> str:
    if "conversations" in raw:
        return "llava"
    if "messages" in raw:
        return "messages"
    if "texts" in raw:
        return "finevision"
    if any(k in raw for k in ("caption", "txt", "text")):
        return "caption"
    raise Skip("bad_record", "no 'conversations', 'messages', 'texts' or caption field")


def parse(raw, opts: FormatOptions, base_dir: str) -> Record:
    """One raw record (a dict from JSON, a Parquet row or a WebDataset sample) as a Record."""
    if not isinstance(raw, dict):
        raise Skip("bad_record", f"a record must be a JSON object, not {type(raw).__name__}")
    fmt = detect(raw) if opts.format == "auto" else opts.format
    reader = _Reader(raw, opts, opts.image_root or base_dir)
    record = {"llava": reader.llava, "messages": reader.messages,
              "finevision": reader.finevision, "caption": reader.caption}[fmt]()
    source = opts.source if opts.source is not None else raw.get("source")
    if source is not None and not isinstance(source, str):
        raise Skip("bad_record", "'source' is not a string")
    record.source = source
    record.meta = {k: raw[k] for k in opts.meta_fields if k in raw}
    return record


class _Reader:
    def __init__(self, raw: dict, opts: FormatOptions, root: str):
        self.raw, self.opts, self.root = raw, opts, root
        self.images: List[ImageRef] = []  # in order of appearance
        self.listed: List[ImageRef] = []  # the record's image list, taken by places in order
        self.taken = 0

    # Formats.
    def llava(self) -> Record:
        self.listed = self._image_list("image", "images")
        turns = []
        for i, c in enumerate(self._list("conversations")):
            if not isinstance(c, dict):
                raise Skip("bad_record", f"conversations[{i}] is not an object")
            role = self._role(c.get("from", c.get("role")), f"conversations[{i}]")
            turns.append(Turn(role, self._tagged(c.get("value", c.get("content")),
                                                 f"conversations[{i}].value")))
        return self._finish(turns)

    def messages(self) -> Record:
        self.listed = self._image_list("images")
        turns = []
        for i, m in enumerate(self._list("messages")):
            if not isinstance(m, dict):
                raise Skip("bad_record", f"messages[{i}] is not an object")
            role = self._role(m.get("role"), f"messages[{i}]")
            content = m.get("content")
            if content is None or isinstance(content, str):
                parts = self._tagged(content or "", f"messages[{i}].content")
            elif isinstance(content, list):
                parts = [self._part(p, f"messages[{i}].content[{j}]") for j, p in enumerate(content)]
            else:
                raise Skip("bad_record", f"messages[{i}].content is neither text nor a list of parts")
            turns.append(Turn(role, parts))
        return self._finish(turns)

    def finevision(self) -> Record:
        self.listed = self._image_list("images")
        texts = self._list("texts")
        tags = 0
        turns = []
        for i, t in enumerate(texts):
            if not isinstance(t, dict):
                raise Skip("bad_record", f"texts[{i}] is not an object")
            for key, role in (("user", USER), ("assistant", ASSISTANT)):
                value = t.get(key)
                if not isinstance(value, str):
                    raise Skip("bad_record", f"texts[{i}].{key} is not a string")
                tags += value.count(IMAGE_TAG)
                turns.append(Turn(role, self._tagged(value, f"texts[{i}].{key}")))
        if tags == 0 and self.listed and turns:
            # No tags: FineVision's convention, the images open the first user turn.
            turns[0].parts[:0] = [self._take() for _ in range(len(self.listed))]
        return self._finish(turns)

    def caption(self) -> Record:
        self.listed = self._image_list("image", "images")
        text = next((self.raw[k] for k in ("caption", "txt", "text") if k in self.raw), None)
        if not isinstance(text, str):
            raise Skip("bad_record", "the caption is not a string")
        images = [self._take() for _ in range(len(self.listed))]
        plain = self.opts.caption_style == "plain"
        prompt = [] if plain or not self.opts.caption_prompt else [self.opts.caption_prompt]
        record = self._finish([Turn(USER, images + prompt), Turn(ASSISTANT, [text])])
        record.plain = plain
        return record

    # Pieces.
    def _finish(self, turns: List[Turn]) -> Record:
        if self.taken != len(self.listed):
            raise Skip("image_count_mismatch",
                       f"{self.taken} image places (<image> tags or image parts) for "
                       f"{len(self.listed)} listed images")
        return Record(turns=turns, images=self.images)

    def _list(self, key: str) -> list:
        value = self.raw.get(key)
        if not isinstance(value, list):
            raise Skip("bad_record", f"'{key}' is not a list")
        return value

    def _role(self, name, where: str) -> str:
        role = ROLE_NAMES.get(name) if isinstance(name, str) else None
        if role is None:
            raise Skip("bad_record", f"{where}: unknown role {name!r} (known: "
                       f"{', '.join(sorted(ROLE_NAMES))})")
        return role

    def _image_list(self, *keys: str) -> List[ImageRef]:
        out = []
        for key in keys:
            value = self.raw.get(key)
            if value is None:
                continue
            values = value if isinstance(value, list) else [value]
            out += [self._ref(v, f"{key}") for v in values]
        return out

    def _take(self) -> int:
        """The next listed image, placed here."""
        if self.taken >= len(self.listed):
            self.taken += 1  # counted for the mismatch message
            return -1
        self.images.append(self.listed[self.taken])
        self.taken += 1
        return len(self.images) - 1

    def _tagged(self, text, where: str) -> list:
        """Text with <image> tags: the text pieces and, at each tag, the next listed image."""
        if not isinstance(text, str):
            raise Skip("bad_record", f"{where} is not a string")
        pieces = text.split(IMAGE_TAG)
        parts: list = [pieces[0]] if pieces[0] else []
        for piece in pieces[1:]:
            parts.append(self._take())
            if piece:
                parts.append(piece)
        return parts

    def _part(self, part, where: str):
        if isinstance(part, str):
            return part
        if not isinstance(part, dict):
            raise Skip("bad_record", f"{where} is not a content part")
        kind = part.get("type")
        if kind == "text" or (kind is None and "text" in part):
            if not isinstance(part.get("text"), str):
                raise Skip("bad_record", f"{where}.text is not a string")
            return part["text"]
        if kind in ("image", "image_url") or (kind is None and ("image" in part or "image_url" in part)):
            inline = next((part[k] for k in ("image", "path", "url", "image_url") if part.get(k)), None)
            if inline is None:
                return self._take()
            self.images.append(self._ref(inline, where))
            return len(self.images) - 1
        raise Skip("bad_record", f"{where}: content part of type {kind!r} is not supported "
                   "(text and image are)")

    def _ref(self, value, where: str) -> ImageRef:
        if isinstance(value, (bytes, bytearray)):
            return ImageRef(data=bytes(value))
        if isinstance(value, dict):
            if value.get("bytes") is not None:  # HF datasets Image (base64 text in JSON)
                data = value["bytes"]
                return ImageRef(data=bytes(data) if isinstance(data, (bytes, bytearray))
                                else _b64(data, where))
            for key in ("path", "url", "image_url", "image"):
                if value.get(key):
                    return self._ref(value[key], where)
            raise Skip("bad_record", f"{where}: an image object without bytes, path or url")
        if not isinstance(value, str) or not value:
            raise Skip("bad_record", f"{where}: an image must be a path, a URL or bytes")
        if value.startswith("data:"):
            head, _, body = value.partition(",")
            if ";base64" not in head:
                raise Skip("bad_record", f"{where}: a data: URL that is not base64")
            return ImageRef(data=_b64(body, where), url=value)
        if "://" in value:
            return ImageRef(url=value)
        return ImageRef(path=os.path.join(self.root, value))


def _b64(text, where: str) -> bytes:
    if not isinstance(text, str):
        raise Skip("bad_record", f"{where}: image bytes must be base64 text in JSON")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise Skip("bad_record", f"{where}: image bytes are not valid base64 ({e})") from None

