"""`tutti convert`: the command line (python3 -m tutti.convert)."""
import argparse
import json
import re
import sys
from typing import List, Optional

from .driver import ConvertError, ConvertOptions, Report, run
from .formats import FORMATS, FormatOptions
from .images import ImageLimits
from .records import REASONS
from .sample import Limits

DESCRIPTION = """\
Turns conversation and caption records into tutti shards (sample schema 2): applies the
model's chat template and tokenizer, places one placeholder token where each image goes,
marks the assistant's turns as the trained spans, and writes tar shards plus the dataset
manifest (tutti_dataset.json) under --out. Then: tutti index --source OUT --out IDX.

Inputs (files or directories of them): .jsonl / .json records in LLaVA
("conversations" with <image> tags), chat ("messages" with typed content parts),
FineVision ("images" + "texts") or caption form; WebDataset .tar caption shards
(jpg/png/webp + txt/json); .parquet rows when pyarrow is installed.

Deterministic: the same inputs and options give byte-identical shards whatever --workers.
Resumable: rerun the same command after an interruption; finished shards are kept.
Records that cannot become a correct sample are skipped, counted and named by reason
(--strict: the first one ends the run):
""" + "".join(f"  {k:22} {v}\n" for k, v in REASONS.items())

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not a byte size (e.g. 512M, 1G, 1048576)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def _ids(text: str) -> List[int]:
    try:
        ids = [int(x) for x in text.split(",")]
    except ValueError:
        ids = []
    if len(ids) != 3 or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not three token ids START,PAD,END")
    return ids


def _var(text: str):
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"'{text}' is not KEY=VALUE")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tutti convert", description=DESCRIPTION,
                                usage="tutti convert --out DIR --tokenizer PATH [options] INPUT...",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="*", metavar="INPUT", help="record files or directories")
    p.add_argument("--out", help="output directory (created; a rerun resumes in it)")
    p.add_argument("--tokenizer", help="a Hugging Face tokenizer directory (tokenizer.json; "
                   "needs `tokenizers` or `transformers`) or a SentencePiece .model")
    p.add_argument("--tokenizer-kind", choices=("auto", "hf", "sentencepiece"), default="auto",
                   help="which tokenizer to load from --tokenizer (default: auto, HF first)")
    p.add_argument("--chat-template", metavar="PATH",
                   help="a Jinja template file, chat_template.json or tokenizer_config.json "
                   "(default: the tokenizer directory's, else ChatML as Qwen2-VL writes it)")
    p.add_argument("--template-var", type=_var, action="append", default=[], metavar="KEY=VALUE",
                   help="a variable the template sees (VALUE as JSON if it parses, else text), "
                   "e.g. enable_thinking=false; repeatable")
    p.add_argument("--template-date", default="2024-01-01",
                   help="the date strftime_now() gives templates, fixed so output is "
                   "reproducible (default: 2024-01-01)")
    g = p.add_argument_group("records")
    g.add_argument("--format", choices=FORMATS, default="auto",
                   help="the record format (default: auto, from each record's fields)")
    g.add_argument("--image-root", metavar="DIR",
                   help="base of relative image paths (default: each input file's directory)")
    g.add_argument("--source", help="the samples' `source` (default: the record's \"source\")")
    g.add_argument("--meta-fields", default="id",
                   help="record fields copied into the sample's `meta`, comma-separated "
                   "(default: id; empty for none)")
    g.add_argument("--caption-style", choices=("chat", "plain"), default="chat",
                   help="caption records as a user turn of images answered by the caption "
                   "(chat, default) or images, caption, EOS without a template (plain)")
    g.add_argument("--caption-prompt", default="",
                   help="user text beside a caption's images in chat style (default: none)")
    g = p.add_argument_group("limits (a record over one is skipped with its reason)")
    g.add_argument("--max-tokens", type=int, default=Limits.max_tokens,
                   help=f"tokens per sample, an image counting one (default: {Limits.max_tokens})")
    g.add_argument("--max-images", type=int, default=Limits.max_images,
                   help=f"images per sample (default: {Limits.max_images}, as tutti index)")
    g.add_argument("--max-sample-bytes", type=_bytes, default=Limits.max_sample_bytes,
                   help="k.json and images together (default: 64M)")
    g.add_argument("--max-meta-bytes", type=_bytes, default=Limits.max_meta_bytes,
                   help="the sample's meta as JSON (default: 64K)")
    g.add_argument("--max-image-side", type=int, default=ImageLimits.max_side,
                   help=f"pixels on an image's longer side (default: {ImageLimits.max_side})")
    g.add_argument("--max-image-pixels", type=int, default=ImageLimits.max_pixels,
                   help=f"pixels in an image (default: {ImageLimits.max_pixels})")
    g.add_argument("--max-aspect-ratio", type=float, default=ImageLimits.max_aspect_ratio,
                   help=f"an image's long side over its short (default: {ImageLimits.max_aspect_ratio:g})")
    g.add_argument("--verify-images", choices=("header", "decode"), default="header",
                   help="read each image's header (default) or decode it whole (slower; "
                   "catches truncated files)")
    g = p.add_argument_group("placeholder ids (default: the tokenizer's <|vision_start|>, "
                             "<|image_pad|>, ... tokens, else new ids after its vocabulary)")
    g.add_argument("--vision-ids", type=_ids, metavar="START,PAD,END",
                   help="vision_start, image_pad, vision_end")
    g.add_argument("--audio-ids", type=_ids, metavar="START,PAD,END",
                   help="audio_start, audio_pad, audio_end")
    g.add_argument("--image-placeholder-id", type=int,
                   help="the id standing for an image in input_ids (default: image_pad)")
    g = p.add_argument_group("output")
    g.add_argument("--shard-size", type=_bytes, default=1 << 30,
                   help="bytes per shard; a larger sample gets a shard of its own (default: 1G)")
    g.add_argument("--samples-per-shard", type=int, default=0,
                   help="samples per shard, whichever limit comes first (default: 0, none)")
    g.add_argument("--workers", type=int, default=0,
                   help="worker processes (default: 0, one per CPU this process may use)")
    g.add_argument("--strict", action="store_true",
                   help="the first record that would be skipped ends the run (exit status 1)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace shards in --out written by another conversion")
    g.add_argument("--examples", type=int, default=5,
                   help="skipped records named per reason (default: 5)")
    g.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    g.add_argument("--summary-file", metavar="PATH", help="also write the JSON summary there")
    g.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    g.add_argument("--bench", action="store_true",
                   help="run the benchmark instead (tutti bench convert; --bench --help lists "
                   "its options)")
    return p


def options(a: argparse.Namespace) -> ConvertOptions:
    return ConvertOptions(
        inputs=a.inputs, out=a.out, tokenizer=a.tokenizer, tokenizer_kind=a.tokenizer_kind,
        chat_template=a.chat_template, template_vars=dict(a.template_var),
        template_date=a.template_date,
        formats=FormatOptions(format=a.format, image_root=a.image_root, source=a.source,
                              meta_fields=[f for f in a.meta_fields.split(",") if f],
                              caption_style=a.caption_style, caption_prompt=a.caption_prompt),
        limits=Limits(max_tokens=a.max_tokens, max_images=a.max_images,
                      max_sample_bytes=a.max_sample_bytes, max_meta_bytes=a.max_meta_bytes,
                      images=ImageLimits(a.max_image_side, a.max_image_pixels,
                                         a.max_aspect_ratio, a.verify_images)),
        vision_ids=a.vision_ids, audio_ids=a.audio_ids, image_placeholder_id=a.image_placeholder_id,
        shard_size=a.shard_size, samples_per_shard=a.samples_per_shard, workers=a.workers,
        strict=a.strict, overwrite=a.overwrite, examples=a.examples,
        progress="never" if a.no_progress else "auto")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def summary_text(r: Report) -> str:
    t = r.total
    kept = f", {r.kept_shards} kept from an earlier run" if r.kept_shards else ""
    lines = [f"converted {r.records} records into {t.samples} samples: {len(r.shards)} shards "
             f"({_mib(r.bytes)}{kept}) in {r.out}, {r.seconds:.1f} s with {r.workers} workers",
             f"  tokens {t.tokens} ({t.trained_tokens} trained), images {t.images}",
             f"  tokenizer {r.tokenizer}; chat template {r.template}"]
    skipped = sum(t.skipped.values())
    lines.append(f"  skipped {skipped} records" + (":" if skipped else ""))
    for reason in sorted(t.skipped):
        named = t.examples.get(reason, [])
        lines.append(f"    {reason:22} {t.skipped[reason]:8}  {named[0] if named else ''}")
        lines += [f"    {'':22} {'':8}  {n}" for n in named[1:]]
    if t.samples:
        lines.append(f"next: tutti index --source {r.out} --out {r.out}/index.tutti")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--bench" in argv:
        from . import bench
        return bench.main([a for a in argv if a != "--bench"])
    p = parser()
    a = p.parse_args(argv)
    missing = [f for f in ("out", "tokenizer") if not getattr(a, f)]
    if missing or not a.inputs:
        p.error("needs " + ", ".join([f"--{f}" for f in missing] + ([] if a.inputs else ["INPUT"])))
    try:
        report = run(options(a))
    except ConvertError as e:
        print(f"tutti convert: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tutti convert: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    summary = report.to_json()
    if a.summary_file:
        with open(a.summary_file, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
            f.write("\n")
    print(json.dumps(summary, sort_keys=True) if a.json else summary_text(report))
    if report.total.samples == 0:
        print("tutti convert: no sample written: every record was skipped", file=sys.stderr)
        return 1
    return 0
