"""The converter's view of one input record, whatever format it came in.

A `Record` is a conversation: turns of (role, parts), each part a text string or the
index of an image in `Record.images`. Readers of every input format produce one; the
sample builder turns it into a tutti sample. A record that cannot become a correct
sample raises `Skip` with a reason from `REASONS`, counted and named in the summary.
"""
from dataclasses import dataclass, field
from typing import List, Optional, Union

# Why a record is skipped (the summary's keys), in the order the builder checks them.
REASONS = {
    "bad_record": "not a record of a known format (malformed JSON, missing or mistyped fields)",
    "image_count_mismatch": "the number of <image> places differs from the number of images",
    "empty_conversation": "no turns, or no text and no image in any turn",
    "one_sided_conversation": "no user turn or no assistant turn with content",
    "too_many_images": "more images than --max-images",
    "template_error": "the chat template refused the conversation or lost an image",
    "unencodable": "text the tokenizer cannot encode (unknown token, invalid Unicode)",
    "placeholder_in_text": "the text itself holds an image/audio placeholder or marker token",
    "too_many_tokens": "more tokens than --max-tokens",
    "missing_image": "an image file that does not exist or cannot be read",
    "bad_image": "an image that is not a readable JPEG, PNG or WebP",
    "image_too_large": "an image over --max-image-side or --max-image-pixels",
    "aspect_ratio": "an image with an aspect ratio over --max-aspect-ratio",
    "too_large": "a sample over --max-sample-bytes, or metadata over --max-meta-bytes",
}

USER, ASSISTANT, SYSTEM, TOOL = "user", "assistant", "system", "tool"

# Role names the formats use, mapped to the chat-template roles.
ROLE_NAMES = {
    "human": USER, "user": USER,
    "gpt": ASSISTANT, "assistant": ASSISTANT, "model": ASSISTANT, "bot": ASSISTANT,
    "system": SYSTEM,
    "tool": TOOL, "observation": TOOL,
}

Part = Union[str, int]  # text, or the index of an image in Record.images


class Skip(Exception):
    """A record that cannot become a correct sample: `reason` is a key of REASONS,
    the message says what was wrong in this record."""

    def __init__(self, reason: str, message: str):
        assert reason in REASONS, reason
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class ImageRef:
    """Where an image's bytes are: a file path (resolved against --image-root), inline
    bytes, or a URL (only data: URLs are read; others are reported, never fetched)."""
    path: Optional[str] = None
    data: Optional[bytes] = None
    url: Optional[str] = None

    def describe(self) -> str:
        if self.path is not None:
            return self.path
        if self.url is not None:
            return self.url if len(self.url) < 80 else self.url[:77] + "..."
        return f"<{len(self.data or b'')} inline bytes>"


@dataclass
class Turn:
    role: str
    parts: List[Part] = field(default_factory=list)

    def text(self) -> str:
        return "".join(p for p in self.parts if isinstance(p, str))

    def has_content(self) -> bool:
        return any(isinstance(p, int) or p.strip() for p in self.parts)


@dataclass
class Record:
    """One conversation. `plain` marks a caption sample laid out without a chat
    template: its images, then the text of its single assistant turn, then EOS."""
    turns: List[Turn]
    images: List[ImageRef] = field(default_factory=list)
    source: Optional[str] = None
    meta: dict = field(default_factory=dict)
    plain: bool = False

    def image_places(self) -> List[int]:
        return [p for t in self.turns for p in t.parts if isinstance(p, int)]


def check_conversation(record: Record) -> None:
    """Refuses empty and one-sided conversations and images placed twice or never."""
    if not record.turns or not any(t.has_content() for t in record.turns):
        raise Skip("empty_conversation", "no text and no image in any turn")
    if not any(t.role == ASSISTANT and t.text().strip() for t in record.turns):
        raise Skip("one_sided_conversation", "no assistant turn with text: nothing to train on")
    if not record.plain and not any(t.role == USER and t.has_content() for t in record.turns):
        raise Skip("one_sided_conversation", "no user turn with content")
    places = record.image_places()
    if sorted(places) != list(range(len(record.images))):
        raise Skip("image_count_mismatch",
                   f"{len(places)} image places for {len(record.images)} images")
