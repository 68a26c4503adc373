#!/usr/bin/python3
"""Qwen2-VL image preprocessing the way HF's image processor does it, with
PIL and numpy only: the reference for tutti's pixels and the baseline of
`tutti bench decode`.

The steps are those of transformers' Qwen2VLImageProcessor for one still
image: PIL decodes the file and converts it to RGB, the array goes back into
PIL for Image.resize(..., BICUBIC) to the planned size, is rescaled by 1/255
in float64 and cast to float32, normalised with the mean and std, put
channel-first, repeated to the temporal patch and cut into patches ordered
(grid_h/merge, grid_w/merge, merge, merge) with rows of
channel x temporal x patch x patch values.

It reads one request per line on stdin and answers one line on stdout:

  time full PATH HEIGHT WIDTH   the whole path; prints the CPU seconds it took
  time decode PATH              PIL's decode and RGB conversion only
  write PATH HEIGHT WIDTH OUT   writes pixel_values (float32, native order) to OUT; prints "ok"
  resize PATH HEIGHT WIDTH OUT  writes the RGB bytes of PIL's Image.resize(..., BICUBIC) alone
                                (HEIGHT rows of WIDTH x 3 bytes) to OUT; prints "ok"

Files are read once and kept in memory, so a timing covers the work from the
encoded bytes on. Options: --patch, --merge, --temporal, --mean R,G,B,
--std R,G,B (defaults: Qwen2-VL's 14, 2, 2 and CLIP's mean and std).
"""

import argparse
import io
import sys
import time

import numpy as np
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def decode(data):
    image = Image.open(io.BytesIO(data))
    if image.mode != "RGB":
        image = image.convert("RGB")
    return np.array(image)


def resize(rgb, height, width):
    return np.array(Image.fromarray(rgb).resize((width, height), resample=Image.BICUBIC))


def preprocess(data, height, width, opts):
    resized = resize(decode(data), height, width)
    scaled = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.array(opts.mean, dtype=np.float32)
    std = np.array(opts.std, dtype=np.float32)
    chw = ((scaled - mean) / std).transpose(2, 0, 1)
    frames = np.broadcast_to(np.array([chw]), (opts.temporal,) + chw.shape)
    p, m, t = opts.patch, opts.merge, opts.temporal
    gh, gw = height // p, width // p
    patches = frames.reshape(1, t, 3, gh // m, m, p, gw // m, m, p)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(patches.reshape(gh * gw, 3 * t * p * p))


def floats(text):
    values = tuple(float(v) for v in text.split(","))
    if len(values) != 3:
        raise argparse.ArgumentTypeError("needs three comma-separated values")
    return values


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patch", type=int, default=14)
    parser.add_argument("--merge", type=int, default=2)
    parser.add_argument("--temporal", type=int, default=2)
    parser.add_argument("--mean", type=floats, default=CLIP_MEAN)
    parser.add_argument("--std", type=floats, default=CLIP_STD)
    opts = parser.parse_args()
    files = {}

    def load(path):
        if path not in files:
            with open(path, "rb") as f:
                files[path] = f.read()
        return files[path]

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        try:
            if words[0] == "time" and words[1] == "full":
                data, h, w = load(words[2]), int(words[3]), int(words[4])
                t0 = time.thread_time()
                preprocess(data, h, w, opts)
                print(time.thread_time() - t0, flush=True)
            elif words[0] == "time" and words[1] == "decode":
                data = load(words[2])
                t0 = time.thread_time()
                decode(data)
                print(time.thread_time() - t0, flush=True)
            elif words[0] == "write":
                out = preprocess(load(words[1]), int(words[2]), int(words[3]), opts)
                out.astype(np.float32).tofile(words[4])
                print("ok", flush=True)
            elif words[0] == "resize":
                out = resize(decode(load(words[1])), int(words[2]), int(words[3]))
                np.ascontiguousarray(out, dtype=np.uint8).tofile(words[4])
                print("ok", flush=True)
            else:
                print("error unknown request:", line.strip(), flush=True)
        except Exception as e:  # one bad request must not end the session
            print("error", type(e).__name__, str(e).replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()
