"""What the tutti.convert tests build on, written apart from the converter: a SentencePiece
model trained here on generated text, small images made with PIL, records in each input
format, and an independent reconstruction of the sample a record must give (the ChatML
text written out by hand, its tokenization, the assistant spans, the images in order).
"""
import io
import json
import os
import random
import tarfile

import sentencepiece
from PIL import Image

WORDS = ("the a cat dog sits on mat what is in this image picture color red blue green "
         "answer question yes no there are two one three left right small big house tree "
         "sky describe it shows and of with near").split()
# What the default template writes around turns, so the model has tokens for it.
TEMPLATE_TEXT = ["You are a helpful assistant.", "system user assistant", "[INST] [/INST]"]
CHATML = ["<|im_start|>", "<|im_end|>"]
VISION = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]
SYSTEM_DEFAULT = "You are a helpful assistant."
IMAGE = "<image>"


def sentence(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def train_sentencepiece(path_prefix, symbols=CHATML, vocab=160, seed=0):
    """A small unigram model over generated text (every character of WORDS and the
    template covered, nothing else); returns the .model path."""
    rng = random.Random(seed)
    corpus = [sentence(rng, rng.randint(4, 16)).capitalize() + rng.choice(".?!,") for _ in range(3000)]
    corpus += TEMPLATE_TEXT * 50
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_prefix=path_prefix, vocab_size=vocab,
        user_defined_symbols=list(symbols), character_coverage=1.0, hard_vocab_limit=False,
        minloglevel=2, num_threads=1)
    return path_prefix + ".model"


def make_image(path, width, height, fmt, seed=0):
    rng = random.Random(seed)
    im = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    for _ in range(8):
        x, y = rng.randrange(width), rng.randrange(height)
        im.putpixel((x, y), tuple(rng.randrange(256) for _ in range(3)))
    im.save(path, fmt)
    with open(path, "rb") as f:
        return f.read()


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def write_wds(path, samples):
    """samples: [(key, {ext: bytes})] as a WebDataset tar."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def read_shards(out_dir):
    """{key: {ext: bytes}} over every shard of a conversion, and the shard names."""
    with open(os.path.join(out_dir, "tutti_dataset.json")) as f:
        manifest = json.load(f)
    samples = {}
    for name in manifest["shards"]:
        with tarfile.open(os.path.join(out_dir, name)) as tf:
            for m in tf:
                key, ext = m.name.split(".", 1)
                samples.setdefault(key, {})[ext] = tf.extractfile(m).read()
    return manifest, samples


def shard_bytes(out_dir):
    names = sorted(n for n in os.listdir(out_dir) if n.endswith(".tar") or n == "tutti_dataset.json")
    out = {}
    for n in names:
        with open(os.path.join(out_dir, n), "rb") as f:
            out[n] = f.read()
    return out


class Reference:
    """The sample a conversation must give under the default template and a SentencePiece
    model: turns are [(role, [text | ("image", path)])]; images in order of appearance."""

    def __init__(self, sp_path, placeholder):
        self.sp = sentencepiece.SentencePieceProcessor(model_file=sp_path)
        self.placeholder = placeholder

    def render(self, turns):
        """The ChatML text (images as None pieces) and the assistant spans: the content
        and its <|im_end|>."""
        pieces, spans, pos = [], [], 0

        def put(x):  # adjacent text is one piece: it is tokenized in one call
            nonlocal pos
            if x is not None and pieces and pieces[-1] is not None:
                pieces[-1] += x
            else:
                pieces.append(x)
            pos += 1 if x is None else len(x)

        if turns[0][0] != "system":
            put(f"<|im_start|>system\n{SYSTEM_DEFAULT}<|im_end|>\n")
        for role, parts in turns:
            put(f"<|im_start|>{role}\n")
            begin = pos
            for p in parts:
                put(None if isinstance(p, tuple) else p)
            put("<|im_end|>")
            if role == "assistant":
                spans.append((begin, pos))
            put("\n")
        return pieces, spans

    def sample(self, turns):
        """(input_ids, trained spans, image paths in order)."""
        pieces, spans = self.render(turns)
        # Cut the text where spans begin and end (the SentencePiece adapter's rule), in
        # the flat coordinate where an image is one position.
        cuts = {p for s in spans for p in s}
        ids, trained, pos, token_at = [], [], 0, {}
        for piece in pieces:
            if piece is None:
                token_at.setdefault(pos, len(ids))
                ids.append(self.placeholder)
                pos += 1
                continue
            inner = sorted(c - pos for c in cuts if pos < c < pos + len(piece))
            bounds = [0, *inner, len(piece)]
            for b, e in zip(bounds, bounds[1:]):
                token_at[pos + b] = len(ids)
                ids += self.sp.encode(piece[b:e])
            pos += len(piece)
        token_at[pos] = len(ids)
        trained = [[token_at[b], token_at[e]] for b, e in spans]
        images = [p[1] for _, parts in turns for p in parts if isinstance(p, tuple)]
        return ids, trained, images


def llava_turns(record, root):
    """A LLaVA record's turns for Reference, images placed at their <image> tags."""
    images = record.get("images") or ([record["image"]] if "image" in record else [])
    images = iter(images)
    roles = {"human": "user", "gpt": "assistant", "system": "system"}
    turns = []
    for c in record["conversations"]:
        parts = []
        for i, piece in enumerate(c["value"].split(IMAGE)):
            if i:
                parts.append(("image", os.path.join(root, next(images))))
            if piece:
                parts.append(piece)
        turns.append((roles[c["from"]], parts))
    return turns

