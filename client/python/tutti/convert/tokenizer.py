"""Tokenizer adapters: a Hugging Face tokenizer (tokenizer.json, through the `tokenizers`
library that `transformers` is built on) when one is installed, a SentencePiece model
otherwise.

Both encode a text with the character spans that must be trained and return the ids and
those spans in tokens:
  hf             the whole text in one call, as apply_chat_template tokenizes it; a token
                 belongs to a span when its characters overlap it (transformers'
                 return_assistant_tokens_mask reads its char_to_token the same way)
  sentencepiece  the text cut at the spans' ends and at the model's control symbols
                 (<s>, </s>: their ids, as HF's SentencePiece tokenizers split out their
                 special tokens), each piece encoded on its own, so a span is whole tokens
"""
import bisect
import hashlib
import json
import os
import re
from typing import List, Optional, Sequence, Tuple

Spans = Sequence[Tuple[int, int]]

# Marker tokens by name, Qwen-family spelling (Qwen2-VL, Qwen2-Audio).
MARKER_TOKENS = {
    "vision_start": "<|vision_start|>", "image_pad": "<|image_pad|>", "vision_end": "<|vision_end|>",
    "audio_start": "<|audio_bos|>", "audio_pad": "<|AUDIO|>", "audio_end": "<|audio_eos|>",
}


class TokenizerSetupError(Exception):
    """The tokenizer cannot be loaded (missing files, library not installed)."""


def _sha256(paths: List[str]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(os.path.basename(p).encode() + b"\0")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


class SentencePieceTokenizer:
    kind = "sentencepiece"

    def __init__(self, model_path: str):
        import sentencepiece

        self.path = model_path
        self._sp = sentencepiece.SentencePieceProcessor()
        try:
            self._sp.Load(model_path)
        except (OSError, RuntimeError) as e:
            raise TokenizerSetupError(f"cannot load the SentencePiece model {model_path}: {e}")
        sp = self._sp
        self.vocab_size = sp.get_piece_size()
        self.sha256 = _sha256([model_path])
        self.unk_id = sp.unk_id() if sp.unk_id() >= 0 else None
        self.eos_id = sp.eos_id() if sp.eos_id() >= 0 else None
        self.special_tokens = {name: sp.id_to_piece(i) for name, i in (
            ("bos_token", sp.bos_id()), ("eos_token", sp.eos_id()), ("unk_token", sp.unk_id()),
            ("pad_token", sp.pad_id())) if i >= 0}
        self._control = {sp.id_to_piece(i): i for i in range(self.vocab_size) if sp.is_control(i)}
        names = sorted(self._control, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None
        self._control_starts = sorted({n[0] for n in names if n})  # a quick test before the split

    def token_id(self, token: str) -> Optional[int]:
        i = self._sp.piece_to_id(token)
        return None if self._sp.is_unknown(i) else i

    def encode_text(self, text: str) -> List[int]:
        """The library's own encode of a whole text (the benchmark's baseline)."""
        return self._sp.encode(text)

    def encode(self, text: str, spans: Spans = ()) -> Tuple[List[int], List[Tuple[int, int]]]:
        cuts = sorted({p for span in spans for p in span if 0 < p < len(text)})
        bounds = [0, *cuts, len(text)]
        ids: List[int] = []
        token_at = {0: 0}
        for begin, end in zip(bounds, bounds[1:]):
            token_at[begin] = len(ids)
            piece = text[begin:end]
            split = self._split and any(c in piece for c in self._control_starts)
            for chunk in self._split.split(piece) if split else (piece,):
                control = self._control.get(chunk)
                if control is not None:
                    ids.append(control)
                elif chunk:
                    ids += self._sp.encode(chunk)
        token_at[len(text)] = len(ids)
        return ids, [(token_at[b], token_at[e]) for b, e in spans]


class HfTokenizer:
    kind = "hf"

    def __init__(self, directory: str, backend, config: dict, files: List[str]):
        self.path = directory
        self._tk = backend
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self.sha256 = _sha256(files)
        self.special_tokens = {}
        for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = config.get(name)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                self.special_tokens[name] = value
        self.unk_id = self.token_id(self.special_tokens.get("unk_token", "\0"))
        self.eos_id = self.token_id(self.special_tokens.get("eos_token", "\0"))

    def token_id(self, token: str) -> Optional[int]:
        return self._tk.token_to_id(token)

    def encode_text(self, text: str) -> List[int]:
        """The library's own encode of a whole text (the benchmark's baseline)."""
        return self._tk.encode(text, add_special_tokens=False).ids

    def encode(self, text: str, spans: Spans = ()) -> Tuple[List[int], List[Tuple[int, int]]]:
        enc = self._tk.encode(text, add_special_tokens=False)
        return enc.ids, (token_spans(enc.offsets, spans) if spans else [])


def token_spans(offsets: Sequence[Tuple[int, int]], spans: Spans) -> List[Tuple[int, int]]:
    """Character spans as token spans, from each token's [begin, end) characters (in order):
    the tokens whose characters overlap the span."""
    begins = [b for b, _ in offsets]
    ends = [e for _, e in offsets]
    out = []
    for b, e in spans:
        first = bisect.bisect_right(ends, b)  # the first token ending after b
        out.append((first, max(first, bisect.bisect_left(begins, e))))  # up to one starting at e
    return out


def _load_hf(directory: str) -> Optional[HfTokenizer]:
    """A tokenizer directory through `tokenizers` (or `transformers`), None when neither
    is installed."""
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = {}
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
    files = [p for p in (os.path.join(directory, "tokenizer.json"), config_path) if os.path.exists(p)]
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    if os.path.exists(os.path.join(directory, "tokenizer.json")):
        return HfTokenizer(directory, Tokenizer.from_file(files[0]), config, files)
    try:  # no tokenizer.json: transformers converts a slow tokenizer to a fast one
        from transformers import AutoTokenizer
    except ImportError:
        return None
    tok = AutoTokenizer.from_pretrained(directory)
    if not getattr(tok, "is_fast", False):
        raise TokenizerSetupError(f"{directory}: transformers has no fast tokenizer for it")
    names = [n for n in os.listdir(directory) if n.startswith(("tokenizer", "vocab", "merges", "spiece"))]
    return HfTokenizer(directory, tok.backend_tokenizer, {**config, **tok.special_tokens_map},
                       sorted(os.path.join(directory, n) for n in names))


def load(path: str, kind: str = "auto"):
    """--tokenizer PATH: a Hugging Face tokenizer directory (tokenizer.json, used through
    `tokenizers`/`transformers` when installed) or a SentencePiece .model (or a directory
    holding tokenizer.model). kind: auto, hf or sentencepiece."""
    if not os.path.exists(path):
        raise TokenizerSetupError(f"--tokenizer {path}: no such file or directory")
    if os.path.isdir(path) and kind in ("auto", "hf"):
        has_hf = any(os.path.exists(os.path.join(path, n)) for n in ("tokenizer.json", "tokenizer_config.json"))
        hf = _load_hf(path) if has_hf else None
        if hf is not None:
            return hf
        if kind == "hf":
            raise TokenizerSetupError(
                f"{path}: a Hugging Face tokenizer needs `tokenizers` or `transformers` "
                "(pip install tokenizers) and tokenizer.json")
    if kind in ("auto", "sentencepiece"):
        model = os.path.join(path, "tokenizer.model") if os.path.isdir(path) else path
        if os.path.isfile(model):
            return SentencePieceTokenizer(model)
    raise TokenizerSetupError(
        f"--tokenizer {path}: found no tokenizer (a directory with tokenizer.json and "
        "`tokenizers` installed, or a SentencePiece .model)")
