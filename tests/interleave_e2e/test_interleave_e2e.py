"""Interleaved conversations from raw records to gradients, every part real: LLaVA-style and
FineVision-style records with 0, 1 and 2 images at different turns (PNG and JPEG files written
here with PIL) are converted by `tutti convert` with a SentencePiece model trained here,
indexed by `tutti index`, planned by tutti-packerd with post-balancing for 4 ranks on 2 nodes
(one tutti-stagerd each) and trained through tutti.torch by 4 rank processes under torchrun
(ranks.py). Against an independent reconstruction from the raw records (the ChatML text written
out by hand and tokenized, each image's run at its <image> tag, sized by HF's smart_resize):

- every document's input_ids, its sample's source and meta (batch and micro-batch), its labels (-100 exactly outside the assistant's turns, on the
  image runs and on the document's first token), its M-RoPE ids (an HF-style get_rope_index
  over the reconstructed tokens) and its image positions;
- every image's embedding rows where its placeholder was are the encoder rows of that image,
  encoded on whichever rank post-balancing chose, and those pixels are the raw image's
  (HF's Qwen2-VL preprocessing done here with PIL and numpy);
- each step's loss and all-reduced gradients equal a single-process reference built from the
  reconstructed documents, one document at a time, and so do the SGD steps after them.

Needs TUTTI_BUILD_DIR (tutti, tutti-packerd, tutti-stagerd, build/python)."""
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python", "tests"))
import cluster  # noqa: E402
import convert_fixtures as fx  # noqa: E402
from hf_reference import hf_style_rope  # noqa: E402
import model  # noqa: E402

HIDDEN = 32
STEPS = 3
LR = 0.5
PATCH, MERGE, MIN_PIXELS, MAX_PIXELS = 14, 2, 3136, 50176
MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)  # CLIP's, the job's default
STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)
RTOL, ATOL = 1e-4, 1e-6

JOB = """job_id: "{job_id}"
seed: {seed}
world_size: {world}
ranks_per_node: {per_node}
index_path: "{index}"
epochs: {epochs}
batch {{
  text_samples_per_step: 2
  vl_samples_per_step: 8
  grad_accum: 2
  text_micro_batch: 1
  vl_micro_batch: 1
  text_vl_ratio: "1:1"
}}
vision {{ min_pixels: 3136 max_pixels: 50176 VISION_IDS }}
audio {{ AUDIO_IDS }}
curriculum {{ start_step: 0 max_pixels: 50176 seq_len: 1024 }}
packing {{ strategy: "tutti" }}
post_balancing {{ enabled: {post} hidden_size: {hidden} embedding_dtype: DTYPE_FLOAT32 }}
plan_window: 4
"""


def smart_resize(height, width):
    """HF Qwen2-VL's smart_resize (factor 28, the job's pixel bounds)."""
    factor = PATCH * MERGE
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > MAX_PIXELS:
        beta = math.sqrt(height * width / MAX_PIXELS)
        h, w = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h * w < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h, w


def hf_pixels(path):
    """(pixel_values [patches, 1176], grid (t, h, w)) as HF's Qwen2-VL image processor makes
    them: smart_resize, PIL bicubic, rescale and CLIP normalisation, the frame repeated to the
    temporal patch, patches in 2x2 merge groups."""
    im = Image.open(path).convert("RGB")
    h, w = smart_resize(im.height, im.width)
    a = np.asarray(im.resize((w, h), Image.BICUBIC), np.float32) / 255.0
    a = ((a - MEAN) / STD).transpose(2, 0, 1)
    frames = np.stack([a, a])  # [temporal 2, C, H, W]
    gh, gw = h // PATCH, w // PATCH
    p = frames.reshape(1, 2, 3, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    p = p.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return p.reshape(gh * gw, 3 * 2 * PATCH * PATCH), (1, gh, gw)


def write_records(root, seed=3):
    """LLaVA JSONL and FineVision JSON records with 0, 1 and 2 images at different turns over
    images of distinct sizes and colours. Returns (input files, [turns per record] in the
    converter's record order, [(source, meta) per record] as k.json must carry them)."""
    rng = random.Random(seed)
    os.makedirs(os.path.join(root, "img"))
    images = []
    sizes = [(56, 56), (84, 56), (70, 98), (112, 84), (60, 130), (140, 70), (98, 98), (126, 56)]
    for i, (w, h) in enumerate(sizes):
        name = f"img/{i}.{'jpg' if i % 2 else 'png'}"
        fx.make_image(os.path.join(root, name), w, h, "JPEG" if i % 2 else "PNG", seed=10 + i)
        images.append(name)
    llava, turns, carried = [], [], []
    # (images per human turn) of each conversation: none, one at the first or a later turn, two
    # in one turn, two at different turns.
    shapes = [(0,), (0, 0), (1,), (0, 1), (1, 0, 0), (2,), (0, 2), (1, 0, 1), (0, 1, 1), (0, 0, 0),
              (1, 1), (2, 0), (0,), (0, 0, 1), (1,), (0, 1, 0)]
    for r, shape in enumerate(shapes):
        conv, used = [], []
        for k in shape:
            text = fx.sentence(rng, rng.randint(3, 10))
            tags = [rng.choice(("before", "after", "inside")) for _ in range(k)]
            for where in tags:
                if where == "before":
                    text = "<image>\n" + text
                elif where == "after":
                    text = text + "\n<image>"
                else:
                    words = text.split(" ")
                    cut = rng.randint(1, len(words))
                    text = " ".join(words[:cut]) + " <image> " + " ".join(words[cut:])
            used += [images[rng.randrange(len(images))] for _ in range(k)]
            conv.append({"from": "human", "value": text})
            conv.append({"from": "gpt", "value": fx.sentence(rng, rng.randint(2, 12))})
        rec = {"id": f"llava{r}", "conversations": conv}
        if len(used) == 1 and rng.random() < 0.5:
            rec["image"] = used[0]
        elif used:
            rec["images"] = used
        llava.append(rec)
        turns.append(fx.llava_turns(rec, root))
        carried.append(("", {"id": rec["id"]}))  # --meta-fields' default: the record's id
    fx.write_jsonl(os.path.join(root, "a.jsonl"), llava)
    finevision = []
    for r, n in enumerate((0, 1, 2, 1, 2, 0)):
        used = [images[rng.randrange(len(images))] for _ in range(n)]
        texts = [{"user": fx.sentence(rng, rng.randint(3, 8)), "assistant": fx.sentence(rng, rng.randint(2, 9))}
                 for _ in range(rng.randint(1, 3))]
        finevision.append({"images": used, "texts": texts, "source": "chartqa"})
        carried.append(("chartqa", {}))
        t = []
        for j, pair in enumerate(texts):  # untagged: the images open the first user turn
            lead = [("image", os.path.join(root, u)) for u in used] if j == 0 else []
            t += [("user", lead + [pair["user"]]), ("assistant", [pair["assistant"]])]
        turns.append(t)
    with open(os.path.join(root, "b.json"), "w") as f:
        json.dump(finevision, f)
    return [os.path.join(root, "a.jsonl"), os.path.join(root, "b.json")], turns, carried


class Expected:
    """A document as the raw record says it must be served."""

    def __init__(self, ids, trained, image_paths, markers):
        start, pad, end = markers["vision_start"], markers["image_pad"], markers["vision_end"]
        self.paths = image_paths
        self.pixels, self.grids = [], []
        for p in image_paths:
            px, g = hf_pixels(p)
            self.pixels.append(px)
            self.grids.append(g)
        trained_at = np.zeros(len(ids), bool)
        for b, e in trained:
            trained_at[b:e] = True
        tokens, labels, self.positions, image = [], [], [], 0
        for j, t in enumerate(ids):
            if t == pad:  # the placeholder: this image's run
                _, gh, gw = self.grids[image]
                n = gh * gw // (MERGE * MERGE)
                self.positions.append(np.arange(len(tokens) + 1, len(tokens) + 1 + n))
                tokens += [start] + [pad] * n + [end]
                labels += [-100] * (n + 2)
                image += 1
            else:
                tokens.append(t)
                labels.append(t if trained_at[j] else -100)
        labels[0] = -100  # no document is predicted from the one packed before it
        self.tokens, self.labels = np.array(tokens, np.int64), np.array(labels, np.int64)
        self.mrope = hf_style_rope(tokens, self.grids, MERGE, pad)


class InterleavedEndToEndTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tutti-interleave-e2e-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.tool = cluster.binary("tools", "tutti")

    def convert_and_index(self):
        raw = os.path.join(self.dir, "raw")
        inputs, turns, self.text = write_records(raw)
        sp = fx.train_sentencepiece(os.path.join(self.dir, "sp"))
        data = os.path.join(self.dir, "data")
        out = subprocess.run([self.tool, "convert", "--tokenizer", sp, "--out", data, "--workers",
                              "1", "--no-progress", "--json", "--samples-per-shard", "8", *inputs],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        summary = json.loads(out.stdout)
        with open(os.path.join(data, "tutti_dataset.json")) as f:
            manifest = json.load(f)
        self.assertEqual(manifest["samples"], len(turns), summary)
        index = os.path.join(self.dir, "index.tutti")
        out = subprocess.run([self.tool, "index", "--source", data, "--out", index],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return data, index, manifest, sp, turns

    def test_raw_records_to_gradients(self):
        data, index, manifest, sp, turns = self.convert_and_index()
        m = manifest["markers"]
        job = JOB.replace("VISION_IDS", f"vision_start_id: {m['vision_start']} image_pad_id: "
                                        f"{m['image_pad']} vision_end_id: {m['vision_end']}")
        job = job.replace("AUDIO_IDS", f"audio_start_id: {m['audio_start']} audio_pad_id: "
                                       f"{m['audio_pad']} audio_end_id: {m['audio_end']}")
        vocab = manifest["tokenizer"]["vocab_size"]
        dumps = os.path.join(self.dir, "dumps")
        os.makedirs(dumps)
        work = os.path.join(self.dir, "cluster")
        os.makedirs(work)
        c = cluster.Cluster(work, post=True, hidden=HIDDEN, epochs=1, data=(data, index), job=job)
        try:
            c.start()
            rc, out = cluster.torchrun(c, os.path.join(HERE, "ranks.py"), [
                "--steps", str(STEPS), "--vocab", str(vocab), "--hidden", str(HIDDEN), "--lr",
                str(LR), "--out", dumps], timeout=240)
        finally:
            c.stop()
        self.assertEqual(rc, 0, out[-6000:])
        ranks = [torch.load(os.path.join(dumps, f"rank{r}.pt")) for r in range(4)]
        for r in ranks:
            self.assertEqual(r["skipped"], [], f"rank {r['rank']} skipped samples")

        # Every sample as its raw record says it must be.
        ref = fx.Reference(sp, manifest["placeholders"]["image"])
        expected = {}
        for number, t in enumerate(turns):
            ids, trained, paths = ref.sample(t)
            expected[f"{number:09d}"] = Expected(ids, trained, paths, m)
        encoded = {(e["step"], e["key"], e["index"]): e for r in ranks for e in r["encoded"]}
        docs = [d for r in ranks for d in r["docs"]]
        seen, images_checked, interleaved = set(), 0, 0
        for d in docs:
            where = f"step {d['step']}, rank {d['rank']}, sample {d['key']}"
            want = expected[d["key"]]
            self.assertNotIn((d["step"], d["key"]), seen, f"{where}: served twice in one step")
            seen.add((d["step"], d["key"]))
            np.testing.assert_array_equal(d["input_ids"].numpy(), want.tokens, where)
            np.testing.assert_array_equal(d["labels"].numpy(), want.labels, where)
            np.testing.assert_array_equal(d["mrope"].numpy(), want.mrope, where)
            self.assertEqual(d["grids"], want.grids, where)
            # The sample's source and meta, per document, as the raw record gives them.
            self.assertEqual((d["source"], d["meta"]), self.text[int(d["key"])], where)
            pos = np.concatenate(want.positions) if want.positions else np.zeros(0, np.int64)
            np.testing.assert_array_equal(d["positions"].numpy(), pos, where)
            interleaved += bool(want.positions) and int(want.positions[0][0]) > 1
            row = 0
            for i, p in enumerate(want.positions):
                enc = encoded[(d["step"], d["key"], i)]
                self.assertEqual(enc["grid"], want.grids[i], f"{where}, image {i}")
                # The encoded pixels are this image's (the raw file, HF's preprocessing).
                np.testing.assert_allclose(enc["pixels"].numpy(), want.pixels[i], atol=0.05,
                                           err_msg=f"{where}, image {i}: {want.paths[i]}")
                # Its encoder rows, from whichever rank encoded it, where its placeholder was.
                np.testing.assert_array_equal(d["rows"][row:row + len(p)].numpy(),
                                              enc["rows"].numpy(), f"{where}, image {i}")
                row += len(p)
                images_checked += 1
        self.assertEqual({k for _, k in seen}, set(expected), "samples never served")
        self.assertGreater(interleaved, 0, "no document has text before its first image")
        self.assertTrue(any(not e.positions for e in expected.values()))

        # The loss and gradients of a plain single-process model over the reconstructed
        # documents, one at a time, step after step.
        for r in ranks:  # the batch's lists, in doc_sample_ids order
            for s in r["steps"]:
                got = list(zip(s["batch_sources"], s["batch_meta"]))
                self.assertEqual(got, [self.text[int(s["keys"][sid])] for sid in s["batch_docs"]])
        steps = ranks[0]["steps"]
        self.assertEqual([s["step"] for s in steps], list(range(STEPS)))
        vit, lm = model.build(vocab, HIDDEN)
        params = model.parameters(vit, lm)
        opt = torch.optim.SGD(params, lr=LR)
        worst = 0.0
        for s in steps:
            opt.zero_grad(set_to_none=True)
            keys = sorted(k for st, k in seen if st == s["step"])
            tokens = sum(int((expected[k].labels[1:] != -100).sum()) for k in keys)
            self.assertEqual(tokens, s["tokens"], f"step {s['step']}: label tokens")
            loss_sum = 0.0
            for k in keys:
                want = expected[k]
                h = lm.embed(torch.from_numpy(want.tokens))
                for i, p in enumerate(want.positions):
                    px = encoded[(s["step"], k, i)]["pixels"]
                    x = vit(px, torch.tensor([0, px.shape[0]], dtype=torch.int32))
                    h = h.index_put((torch.from_numpy(p),), x)
                logits = lm(h[None], torch.from_numpy(want.mrope)[:, None],
                            torch.tensor([0, len(want.tokens)], dtype=torch.int32))
                loss = model.summed_loss(logits, torch.from_numpy(want.labels)[None]) / tokens
                loss.backward()
                loss_sum += loss.item()
            grad = model.flat_grads(params)
            self.assertAlmostEqual(loss_sum, s["loss"], delta=1e-5, msg=f"step {s['step']}: loss")
            excess = float(((s["grad"] - grad).abs() - (ATOL + RTOL * grad.abs())).max())
            worst = max(worst, float((s["grad"] - grad).abs().max() / grad.abs().max()))
            self.assertLessEqual(excess, 0.0, f"step {s['step']}: gradients differ")
            opt.step()
        empty = sum(n == 0 for r in ranks for st in r["steps"] for n in st["micro_batches"])
        print(f"{len(docs)} documents over {STEPS} steps and 4 ranks ({empty} micro-batches "
              f"without documents), {images_checked} images placed, {interleaved} documents "
              f"with text before their first image; loss and gradients as "
              f"the single-process reference's (max grad diff / max |grad| {worst:.3g})")


if __name__ == "__main__":
    unittest.main()
