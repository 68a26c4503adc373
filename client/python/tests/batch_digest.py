"""One rank: takes batches from tutti.torch.Loader and prints a digest of each
(step, rank, sha256 of every field and model input, and the step's documents),
optionally resuming from a saved loader state or saving it after --steps."""
import argparse
import hashlib
import json

import torch

import tutti.torch


def digest(batch):
    h = hashlib.sha256()
    for t in (batch.pixel_values, batch.image_grid_thw, batch.input_ids, batch.cu_seqlens):
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    for mb in batch.micro_batches:
        for t in (mb.labels, mb.position_ids, mb.mrope_position_ids, mb.cu_seqlens):
            h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:24]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--resume")
    ap.add_argument("--save-state")
    args = ap.parse_args()
    loader = tutti.torch.Loader(max_steps=args.steps, transport=None)  # reads batches only
    if args.resume:
        loader.load_state_dict(torch.load(args.resume))
    for batch in loader:
        print("DIGEST " + json.dumps({"step": batch.step, "rank": batch.rank, "digest": digest(batch),
                                      "docs": sorted(int(d) for d in batch.doc_sample_ids)}),
              flush=True)
    if args.save_state and loader.rank == 0:
        torch.save(loader.state_dict(), args.save_state)


if __name__ == "__main__":
    main()
