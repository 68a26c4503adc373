"""`tutti bench convert` (or `tutti convert --bench`): the converter's samples/s on one
core and over cores, against the tokenizer alone on the same text.

  tokenizer   the tokenizer's own encode of each sample's rendered text (the chat template
              applied beforehand, untimed), one process
  convert_1   tutti convert with one worker: reading records, rendering, tokenizing,
              checking images, writing shards and the manifest
  convert_W   the same with W workers; speed-up = its samples/s over convert_1's
  bare_loop   the least any converter does, one process: json.loads a record, render its
              messages with the template, encode the text, json.dumps the ids, write them
              and the image files as tar members (no checks, no trained spans, no
              placeholders): what is left of the overhead is the converter's own

overhead = convert_1's time per sample over the tokenizer's, minus one (target <= 25%).
The records are generated: LLaVA-style conversations of 1-4 rounds (30% text-only, 60%
with an image in the first turn, 10% with a second in a later turn), over 16 JPEGs; the
tokenizer is a SentencePiece model trained on the same kind of text unless --tokenizer
names one. Each case runs --repeats times; the best time counts. Wall time gives the
samples/s; CPU time (the process's and its workers') is printed beside it, the steadier
figure on a shared machine. convert_W's figures include starting the run (workers,
tokenizer, template, imports), as a user's run does.
"""
import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

from . import driver, formats, inputs
from .template import IMAGE_CLOSE, IMAGE_OPEN


def _words(rng, n=6000):
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    weights = [12, 9, 8, 7, 7, 6, 6, 6, 4, 4, 3, 3, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, .2, .2, .1, .1]
    return ["".join(rng.choices(letters, weights, k=rng.randint(1, 9))) for _ in range(n)]


class Text:
    """Sentences over a Zipf-distributed vocabulary of made-up words."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.words = _words(self.rng)
        self.weights = [1.0 / (i + 1) for i in range(len(self.words))]

    def sentence(self, lo, hi):
        words = self.rng.choices(self.words, self.weights, k=self.rng.randint(lo, hi))
        return " ".join(words).capitalize() + self.rng.choice(".?!")

    def paragraph(self, lo, hi):
        n = self.rng.randint(lo, hi)
        out = []
        while sum(len(s.split()) for s in out) < n:
            out.append(self.sentence(4, 18))
        return " ".join(out)


def make_dataset(root, samples, seed=0):
    from PIL import Image

    os.makedirs(os.path.join(root, "img"), exist_ok=True)
    rng = random.Random(seed)
    images = []
    for i in range(16):
        name = f"img/{i}.jpg"
        im = Image.effect_noise((256, 192), 40 + i).convert("RGB")
        im.save(os.path.join(root, name), "JPEG", quality=85)
        images.append(name)
    text = Text(seed)
    with open(os.path.join(root, "records.jsonl"), "w") as f:
        for i in range(samples):
            rounds = rng.randint(1, 4)
            kind = rng.random()
            n_images = 0 if kind < 0.3 else (1 if kind < 0.9 or rounds == 1 else 2)
            conv = []
            for r in range(rounds):
                question = text.paragraph(8, 40)
                if (r == 0 and n_images) or (n_images == 2 and r == rounds - 1):
                    question = "<image>\n" + question
                conv.append({"from": "human", "value": question})
                conv.append({"from": "gpt", "value": text.paragraph(20, 150)})
            f.write(json.dumps({"id": f"b{i}", "images": rng.sample(images, n_images),
                                "conversations": conv}) + "\n")
    return os.path.join(root, "records.jsonl")


def train_tokenizer(root, seed=0, vocab=8000):
    import sentencepiece

    text = Text(seed + 1)
    corpus = [text.sentence(4, 30) for _ in range(40000)] + ["You are a helpful assistant."] * 100
    prefix = os.path.join(root, "bench")
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_prefix=prefix, vocab_size=vocab,
        user_defined_symbols=["<|im_start|>", "<|im_end|>"], character_coverage=1.0,
        minloglevel=2, num_threads=2)
    return prefix + ".model"


def rendered_texts(context, path):
    """Each record's text as the converter renders it (image marks taken out)."""
    texts = []
    f = inputs.InputFile(path)
    for task in f.tasks(0, 0, f.count):
        for _, raw in inputs.read(task):
            record = formats.parse(raw, context.formats, os.path.dirname(path))
            messages = [context.template.message(t.role, [p if isinstance(p, str) else
                                                          f"{IMAGE_OPEN}{p}{IMAGE_CLOSE}" for p in t.parts])
                        for t in record.turns]
            text, _ = context.template.render_with_spans(messages)
            for i in range(len(record.images)):
                text = text.replace(f"{IMAGE_OPEN}{i}{IMAGE_CLOSE}", "")
            texts.append(text)
    return texts


def _cpu() -> float:
    """CPU seconds of this process and its reaped children (the pool's workers).

    This process's own time from process_time (nanoseconds): os.times counts
    in clock ticks (10 ms), which a short run can read as zero."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def bare_loop(context, path, out):
    """bare_loop above: the unavoidable steps, nothing else."""
    from .shards import member_bytes

    roles = {"human": "user", "gpt": "assistant"}
    root = os.path.dirname(path)
    with open(path, "rb") as f, open(out, "wb") as tar:
        for n, line in enumerate(f):
            r = json.loads(line)
            messages = [{"role": roles[c["from"]], "content": c["value"].replace("<image>", "")}
                        for c in r["conversations"]]
            ids = context.tokenizer.encode_text(context.template.render(messages))
            tar.write(member_bytes(f"{n:09d}.json", json.dumps({"input_ids": ids}).encode()))
            for i, image in enumerate(r["images"]):
                with open(os.path.join(root, image), "rb") as g:
                    tar.write(member_bytes(f"{n:09d}.{i}.jpg", g.read()))


def best(repeats, fn):
    """The least wall time and the least CPU time over `repeats` runs of fn."""
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), _cpu()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(_cpu() - c0)
    return min(wall), min(cpu)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tutti bench convert", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=8000, help="records generated (default: 8000)")
    p.add_argument("--workers", default="2", help="worker counts to time besides 1, comma-separated "
                   "(default: 2)")
    p.add_argument("--tokenizer", help="a tokenizer (as tutti convert --tokenizer); default: a "
                   "SentencePiece model of 8,000 pieces trained here")
    p.add_argument("--chat-template", help="as tutti convert --chat-template")
    p.add_argument("--repeats", type=int, default=3, help="runs per case, the best counts (default: 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    counts = sorted({1, *(int(w) for w in a.workers.split(",") if w)})
    root = tempfile.mkdtemp(prefix="tutti-bench-convert-")
    try:
        tok = a.tokenizer or train_tokenizer(root)
        data = make_dataset(root, a.samples)
        options = driver.ConvertOptions(inputs=[data], out="", tokenizer=tok, chat_template=a.chat_template,
                                        progress="never", shard_size=256 << 20)
        context = driver.Context(options)
        texts = rendered_texts(context, data)
        encode = context.tokenizer.encode_text
        tokens = sum(len(encode(t)) for t in texts)
        n = len(texts)
        wall, cpu = best(a.repeats, lambda: [encode(t) for t in texts])
        result = {"samples": n, "tokens_per_sample": tokens / n, "tokenizer": context.tokenizer.kind,
                  "tokenizer_samples_per_s": n / wall, "tokenizer_cpu_us_per_sample": 1e6 * cpu / n,
                  "convert": {}}
        wall, cpu = best(a.repeats, lambda: bare_loop(context, data, os.path.join(root, "bare.tar")))
        result.update(bare_loop_samples_per_s=n / wall, bare_loop_cpu_us_per_sample=1e6 * cpu / n)
        for w in counts:
            def once():
                out = os.path.join(root, f"out{w}")
                shutil.rmtree(out, ignore_errors=True)
                options.out, options.workers = out, w
                report = driver.run(options)
                assert report.total.samples == len(texts), report.total.skipped
            wall, cpu = best(a.repeats, once)
            result["convert"][w] = {"samples_per_s": n / wall, "samples_per_s_per_core": n / wall / w,
                                    "cpu_us_per_sample": 1e6 * cpu / n}
        one = result["convert"][1]
        result["overhead"] = result["tokenizer_samples_per_s"] / one["samples_per_s"] - 1
        result["overhead_cpu"] = one["cpu_us_per_sample"] / result["tokenizer_cpu_us_per_sample"] - 1
        result["bare_loop_overhead_cpu"] = (result["bare_loop_cpu_us_per_sample"] /
                                            result["tokenizer_cpu_us_per_sample"] - 1)
        for w, r in result["convert"].items():
            r["speedup"] = r["samples_per_s"] / one["samples_per_s"]
            # CPU per sample at 1 worker over at W: W times it is the speed-up W free cores give.
            r["cpu_efficiency"] = one["cpu_us_per_sample"] / r["cpu_us_per_sample"]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if a.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    print(f"{result['samples']} samples, {result['tokens_per_sample']:.0f} tokens each "
          f"({result['tokenizer']} tokenizer), best of {a.repeats}")
    print(f"  {'case':12} {'samples/s':>10} {'per core':>10} {'speed-up':>9} {'CPU us/sample':>14} "
          f"{'CPU efficiency':>15}")
    print(f"  {'tokenizer':12} {result['tokenizer_samples_per_s']:10.0f} "
          f"{result['tokenizer_samples_per_s']:10.0f} {'':>9} {result['tokenizer_cpu_us_per_sample']:14.0f}")
    print(f"  {'bare_loop':12} {result['bare_loop_samples_per_s']:10.0f} "
          f"{result['bare_loop_samples_per_s']:10.0f} {'':>9} {result['bare_loop_cpu_us_per_sample']:14.0f}")
    for w, r in result["convert"].items():
        print(f"  {'convert_' + str(w):12} {r['samples_per_s']:10.0f} {r['samples_per_s_per_core']:10.0f} "
              f"{r['speedup']:8.2f}x {r['cpu_us_per_sample']:14.0f} {r['cpu_efficiency']:15.2f}")
    print(f"  load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; CPU efficiency: CPU time "
          "per sample with 1 worker over with W (W x it = the speed-up on W idle cores)")
    for name, key in (("wall time", "overhead"), ("CPU time", "overhead_cpu")):
        verdict = "met" if result[key] <= 0.25 else "NOT met"
        print(f"converter overhead over the tokenizer alone, one core, {name}: "
              f"{100 * result[key]:.1f}% (target <= 25%: {verdict})")
    print(f"bare loop overhead over the tokenizer alone, CPU time: "
          f"{100 * result['bare_loop_overhead_cpu']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
