"""Batches without daemons: a random, consistent plan for a whole job of W ranks
(each image encoded on one rank, its document on another), and each rank's
batch laid out in a real shared-memory segment as tutti-stagerd lays it out,
mapped with tutti.map_batch and wrapped as a tutti.torch.Batch."""
import os
from multiprocessing import shared_memory

import numpy as np

import tutti
from tutti.torch._batch import Batch

ROW = 3 * 2 * 14 * 14
START, PAD, END = 151652, 151655, 151653
AUDIO_START, AUDIO_PAD, AUDIO_END = 151647, 151646, 151648


def job(world, hidden, dtype="DTYPE_FLOAT32", sources=None):
    """sources: names of a mixture's sources (a sample's source is its id modulo their
    count), or None for a job without a mixture."""
    return {"config": {"world_size": world, "job_id": "synthetic", "seed": 1, "epochs": 0,
                       "vision": {"merge_size": 2}, "audio": {}, "batch": {},
                       "post_balancing": {"enabled": True, "hidden_size": hidden,
                                          "embedding_dtype": dtype},
                       "mixture": {"sources": [{"name": n} for n in sources]} if sources else None},
            "steps_per_epoch": 0, "total_steps": 0, "shards": [], "samples": 0,
            "dataset_bytes": 0, "config_fingerprint": "synthetic",
            "sources": [{"name": n} for n in (sources or ["text", "vl"])],
            "mixture_history": []}


def random_step(world, step, rng, max_images=6):
    """Per rank: (encoded images, documents) and the plan dict, consistent across ranks."""
    images = []  # (sample, index, grid_h, grid_w, enc_rank, llm_rank)
    samples = int(rng.integers(world, 3 * world + 1))
    llm_of = {}
    for s in range(samples):
        sid = step * 1000 + s + 1
        llm_of[sid] = int(rng.integers(0, world))
        for i in range(int(rng.integers(0, 3))):
            if len(images) >= max_images * world:
                break
            gh, gw = 2 * int(rng.integers(1, 4)), 2 * int(rng.integers(1, 4))
            images.append((sid, i, gh, gw, int(rng.integers(0, world)), llm_of[sid]))
    return images, llm_of


def rank_plan(world, rank, images, llm_of, hidden, elem=4, audio=None):
    """Rank `rank`'s plan, laid out as tutti-packerd lays it out (plan_version 4,
    services/packer/core/exchange.h): each LLM rank's documents in two sequences in sample
    order, a pair's items in the LLM rank's input_ids order, each rank's encoder images
    following its sends (grouped by destination), so that every pair is one contiguous run
    at both ends. audio: {sample_id: [tokens of each clip]} (encoded on the document's rank,
    never exchanged)."""
    audio = audio or {}
    tokens = {(s, i): gh * gw // 4 for s, i, gh, gw, _, _ in images}
    of_sample = {}
    for im in images:
        of_sample.setdefault(im[0], []).append(im)

    def sequences(r):  # the LLM rank's sequences: lists of sample ids
        sids = sorted(s for s, l in llm_of.items() if l == r)
        half = len(sids) // 2
        return [sids[:half], sids[half:]]

    layout = {r: sequences(r) for r in range(world)}
    # Every image's place in its LLM rank's input_ids order.
    at = {}
    for r, seqs in layout.items():
        n = 0
        for seq in seqs:
            for sid in seq:
                for im in of_sample.get(sid, ()):
                    at[(im[0], im[1])] = n
                    n += 1
    order = sorted(images, key=lambda im: (im[5], at[(im[0], im[1])]))

    def transfers(pairs, peer_of):
        out = {}
        for im in pairs:
            out.setdefault(peer_of(im[4], im[5]), []).append(im)
        result = []
        for p, ims in sorted(out.items()):
            t = {"peer": p, "items": [{"sample_id": s, "encoder": "ENCODER_VISION", "index": i,
                                       "bytes": tokens[(s, i)] * hidden * elem}
                                      for s, i, _, _, _, _ in ims]}
            t["bytes"] = sum(it["bytes"] for it in t["items"])
            result.append(t)
        return result

    sends = transfers([im for im in order if im[4] == rank], lambda e, l: l)
    recvs = transfers([im for im in order if im[5] == rank], lambda e, l: e)
    mbs = []
    for seq in layout[rank]:
        docs = []
        for sid in seq:
            ims = of_sample.get(sid, [])
            clips = audio.get(sid, [])
            n = sum(tokens[(im[0], im[1])] + 2 for im in ims) + sum(a + 2 for a in clips) + 3
            docs.append({"sample_id": sid, "offset": 0, "length": n,
                         "encoder_tokens": sum(tokens[(im[0], im[1])] for im in ims) + sum(clips),
                         "images": [{"image_index": im[1], "grid_t": 1, "grid_h": im[2],
                                     "grid_w": im[3], "llm_tokens": tokens[(im[0], im[1])]}
                                    for im in ims]})
        mbs.append({"modality": "MODALITY_VL", "sequences": [{"docs": docs}]})
    # Encoder images: in the order of the sends.
    mine = [im for im in order if im[4] == rank]
    enc = [{"encoder": "ENCODER_VISION",
            "images": [{"sample_id": s, "image_index": i, "grid_t": 1, "grid_h": gh,
                        "grid_w": gw, "llm_rank": l} for s, i, gh, gw, _, l in mine]}]
    return {"rank": rank, "plan_version": 4, "micro_batches": mbs, "encoders": enc,
            "exchange": {"sends": sends, "recvs": recvs,
                         "send_bytes": sum(t["bytes"] for t in sends),
                         "recv_bytes": sum(t["bytes"] for t in recvs)}}


class Segment:
    count = 0

    def __init__(self, step, rank, plan, images, bf16=False, skipped=(), dropped=(), sources=0,
                 interleave=False, audio=None, text=None):
        by_key = {(im[0], im[1]): im for im in images}
        mine = [by_key[(ip["sample_id"], ip["image_index"])]
                for e in plan["encoders"] for ip in e["images"]]  # in the plan's order
        mine = [im for im in mine if im[0] not in dropped]  # samples the batch lacks
        px = np.concatenate([np.full((gh * gw, ROW), s % 251, np.float32)
                             for s, i, gh, gw, _, _ in mine]) if mine else np.zeros((0, ROW), np.float32)
        grid = np.array([[1, gh, gw] for _, _, gh, gw, _, _ in mine], np.int32).reshape(-1, 3)
        sids = np.array([im[0] for im in mine], np.int64)
        ids, cu, doc_ids, seq_off, mb_off = [], [0], [], [0], [0]
        starts, loss = [], []
        for mb in plan["micro_batches"]:
            for seq in mb["sequences"]:
                for d in seq["docs"]:
                    clips = []
                    for n in (audio or {}).get(d["sample_id"], []):
                        clips += [AUDIO_START] + [AUDIO_PAD] * n + [AUDIO_END]
                    if interleave:  # 7, image 0, 8, the other images, the clips, 9; 9 trained
                        begin = len(ids)
                        ids += [7]
                        for k, im in enumerate(d["images"]):
                            starts.append(len(ids) + 1 - begin)
                            ids += [START] + [PAD] * im["llm_tokens"] + [END]
                            ids += [8] if k == 0 else []
                        ids += clips + ([9] if d["images"] else [8, 9])
                        loss += [0] * (len(ids) - begin - 1) + [1]
                    else:  # the image runs, the clips, the text
                        for im in d["images"]:
                            starts.append(len(ids) + 1 - cu[-1])
                            ids += [START] + [PAD] * im["llm_tokens"] + [END]
                        ids += clips + [7, 8, 9]
                        loss += [1] * (len(ids) - len(loss))
                    cu.append(len(ids))
                    doc_ids.append(d["sample_id"])
                seq_off.append(len(ids))
            mb_off.append(mb_off[-1] + len(mb["sequences"]))
        px_dtype = "DTYPE_FLOAT32"
        if bf16:
            import torch

            px = torch.from_numpy(px).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            px_dtype = "DTYPE_BFLOAT16"
        arrays = [("pixel_values", px, px_dtype), ("image_grid_thw", grid, "DTYPE_INT32"),
                  ("image_sample_ids", sids, "DTYPE_INT64"),
                  ("input_ids", np.array(ids, np.int32), "DTYPE_INT32"),
                  ("cu_seqlens", np.array(cu, np.int32), "DTYPE_INT32"),
                  ("seq_offsets", np.array(seq_off, np.int32), "DTYPE_INT32"),
                  ("micro_batch_offsets", np.array(mb_off, np.int32), "DTYPE_INT32"),
                  ("doc_sample_ids", np.array(doc_ids, np.int64), "DTYPE_INT64")]
        if interleave:
            arrays += [("loss_mask", np.array(loss, np.uint8), "DTYPE_UINT8"),
                       ("doc_image_starts", np.array(starts, np.int32), "DTYPE_INT32")]
        offset, layout = 0, []
        for name, a, td in arrays:
            layout.append((name, a, td, offset))
            offset = (offset + a.nbytes + 63) // 64 * 64
        Segment.count += 1
        self.name = f"tutti-torchtest-{os.getpid()}-{Segment.count}"
        self.shm = shared_memory.SharedMemory(name=self.name, create=True, size=max(offset, 64))
        descs = []
        for name, a, td, off in layout:
            if a.nbytes:
                np.frombuffer(self.shm.buf, dtype=a.dtype, count=a.size, offset=off)[:] = a.ravel()
            descs.append({"name": name, "dtype": td, "shape": list(a.shape), "offset": off,
                          "nbytes": a.nbytes})
        self.desc = {"step": step, "rank": rank, "shm_name": "/" + self.name,
                     "shm_size": self.shm.size, "arrays": descs, "plan": plan, "seq_len": 4096,
                     "skipped": [{"sample_id": sid, "reason": "corrupt"} for sid in skipped]}
        if sources or text:  # SampleInfo.source, sample_source and sample_meta of each sample
            self.desc["samples"] = [dict({"sample_id": sid, "modality": "MODALITY_VL"},
                                         **({"source": sid % sources} if sources else {}),
                                         **(text or {}).get(sid, {}))
                                    for sid in sorted(set(doc_ids))]

    def close(self):
        self.shm.close()
        self.shm.unlink()


def batch(world, rank, step, images, llm_of, hidden, transport, bf16=False, skipped=(),
          dropped=(), plan_version=4, sources=None, interleave=False, audio=None, text=None):
    """skipped: sample ids this rank's stager lists as skipped; dropped: sample ids whose
    images this rank's batch lacks; plan_version: what the plan says it is (an older one
    is refused by the exchange); sources: see job; interleave: each image run after a text
    token (the stager's schema-2 layout, with doc_image_starts and loss_mask); audio:
    {sample_id: [tokens of each clip]}, each clip's run before the document's last token
    (interleaved) or after its image runs; text: {sample_id: {"sample_source": str,
    "sample_meta": compact JSON}} as the stager sets them from k.json."""
    plan = rank_plan(world, rank, images, llm_of, hidden, audio=audio)
    plan["plan_version"] = plan_version
    seg = Segment(step, rank, plan, images, bf16=bf16, skipped=skipped, dropped=dropped,
                  sources=len(sources) if sources else 0, interleave=interleave, audio=audio,
                  text=text)
    raw = tutti.map_batch(seg.desc, copy_on_write=True)
    b = Batch(raw, job(world, hidden, sources=sources))
    b._transport = transport
    return b, seg


def pattern(keys_rows, hidden, salt):
    """Rows whose values say (sample, image, row, column): every byte checkable."""
    parts = []
    for (sid, index), n in keys_rows:
        r = np.arange(n, dtype=np.float64)[:, None]
        c = np.arange(hidden, dtype=np.float64)[None, :]
        parts.append(((sid * 7 + index * 131 + r * 17 + c * 3 + salt) % 9973).astype(np.float32))
    return np.concatenate(parts) if parts else np.zeros((0, hidden), np.float32)
