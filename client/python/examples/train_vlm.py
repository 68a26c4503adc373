"""A small vision-language model trained on tutti's batches: a ViT with varlen
attention per image, a 2x2 patch merger, and a causal LM with Qwen2-VL M-RoPE
and varlen attention per document, data-parallel on any number of ranks with
post-balancing (each image encoded where the ViT load is balanced, its
embeddings exchanged to the rank whose sequence holds the sample).

    torchrun --nproc_per_node 4 train_vlm.py --steps 30             # gloo on CPU, NCCL on GPUs
    mpirun -np 4 python3 train_vlm.py --steps 30 --transport mpi     # tutti's MPI transport

TUTTI_PACKER and TUTTI_STAGER (or the node's default stager socket) say where the
daemons are. The lines marked `# tutti` are everything tutti-specific."""
import argparse
import json
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import tutti.torch

VOCAB = 1024           # the synthetic ids (skewed like BPE frequencies) folded into buckets
ID_RANGE = 151640      # ids below are text; above, tutti's vision/audio markers and pads
SPECIALS = 16


def fold_ids(ids):
    ids = ids.long()
    text = ids * VOCAB // ID_RANGE
    return torch.where(ids < ID_RANGE, text, VOCAB + (ids - ID_RANGE) % SPECIALS)


def varlen_mask(cu_seqlens, total, causal):
    """[total, total] additive mask: attention only within each segment of cu_seqlens."""
    seg = torch.zeros(total, dtype=torch.long, device=cu_seqlens.device)
    seg[cu_seqlens[1:-1].long()] = 1
    seg = seg.cumsum(0)
    allowed = seg[:, None] == seg[None, :]
    if causal:
        allowed &= torch.ones(total, total, dtype=torch.bool, device=seg.device).tril()
    return torch.zeros(total, total, device=seg.device).masked_fill(~allowed, float("-inf"))


class Block(nn.Module):
    def __init__(self, dim, heads, rope=None):
        super().__init__()
        self.heads, self.rope = heads, rope
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, mask, cos_sin=None):
        t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(t, 3, self.heads, d // self.heads).unbind(1)
        if cos_sin is not None:
            q, k = rotate(q, *cos_sin), rotate(k, *cos_sin)
        att = torch.einsum("thd,shd->hts", q, k) / math.sqrt(d // self.heads) + mask
        x = x + self.proj(torch.einsum("hts,shd->thd", att.softmax(-1), v).reshape(t, d))
        return x + self.mlp(self.norm2(x))


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def mrope(position_ids, head_dim, sections=(2, 3, 3), theta=10000.0):
    """cos, sin [T, 1, head_dim/2] for 3-D position ids [3, T]: frequency i rotates by the
    temporal, height or width id as `sections` assign it (Qwen2-VL M-RoPE)."""
    dev = position_ids.device
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=dev) / head_dim)
    axis = torch.repeat_interleave(torch.arange(3, device=dev), torch.tensor(sections, device=dev))
    ang = position_ids[axis].float().T * inv  # [T, head_dim/2]
    return ang.cos()[:, None, :], ang.sin()[:, None, :]


class VisionEncoder(nn.Module):
    def __init__(self, row_values, dim, out_dim, merge=2):
        super().__init__()
        self.merge2 = merge * merge
        self.embed = nn.Linear(row_values, dim)
        self.block = Block(dim, 2)
        self.merger = nn.Sequential(nn.LayerNorm(dim * self.merge2),
                                    nn.Linear(dim * self.merge2, out_dim), nn.GELU(),
                                    nn.Linear(out_dim, out_dim))

    def forward(self, pixel_values, cu_seqlens):
        x = self.embed(pixel_values.float())
        x = self.block(x, varlen_mask(cu_seqlens, x.shape[0], causal=False))
        return self.merger(x.reshape(-1, x.shape[1] * self.merge2))  # 2x2 groups are contiguous


class CausalLM(nn.Module):
    def __init__(self, dim, layers, heads=4):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(VOCAB + SPECIALS, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, rope=True) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, VOCAB + SPECIALS)

    def forward(self, h, position_ids, cu_seqlens):
        h = h[0]
        mask = varlen_mask(cu_seqlens, h.shape[0], causal=True)
        cos_sin = mrope(position_ids[:, 0], h.shape[1] // self.heads)
        for b in self.blocks:
            h = b(h, mask, cos_sin)
        return self.head(self.norm(h))[None]


def swap_first_and_last(emb):
    """The negative control of the gradient test: two embedding rows placed wrongly. (An op
    on the exchange's output runs per micro-batch: a micro-batch's backward frees what it
    saved, so a node shared by several micro-batches could not be backed through twice.)"""
    if emb.shape[0] < 2:
        return emb
    n = emb.shape[0]
    perm = torch.cat([torch.tensor([n - 1]), torch.arange(1, n - 1), torch.tensor([0])])
    return emb[perm.to(emb.device)]


def add_source_losses(mb, token_loss, counted, loss_sum, tokens):
    """Adds each label token's loss and count to its document's source (mb.doc_sources,
    an index into batch.source_names): token_loss[t] is the loss of the label of token t + 1."""
    cu = mb.cu_seqlens.to(token_loss.device, torch.long)
    pos = torch.arange(1, token_loss.numel() + 1, device=token_loss.device)
    doc = torch.searchsorted(cu[1:].contiguous(), pos, right=True)
    sources = mb.doc_sources.to(token_loss.device)
    keep = counted & (doc < sources.numel())
    src = sources[doc[keep]]
    known = src >= 0
    loss_sum.index_add_(0, src[known], token_loss[keep][known])
    tokens.index_add_(0, src[known], torch.ones_like(token_loss[keep][known]))


def all_reduce_grads(params):
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)  # the loss is divided by the global label count: a sum
    at = 0
    for p, g in zip(params, grads):
        p.grad = flat[at:at + g.numel()].view_as(g).clone()
        at += g.numel()
    return flat


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--transport", default="auto", help="auto, torch, mpi or nccl")
    ap.add_argument("--hidden", type=int, default=64, help="= the job's post_balancing.hidden_size")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log", help="rank 0 writes one JSON line per step here")
    ap.add_argument("--dump-grads", help="rank 0 saves every step's all-reduced gradients here")
    ap.add_argument("--sgd", action="store_true", help="plain SGD (gradient comparisons)")
    ap.add_argument("--swap-rows", action="store_true",
                    help="place two image-embedding rows wrongly (a negative control)")
    ap.add_argument("--resume", help="a loader state saved with --save-state")
    ap.add_argument("--save-state", help="save the loader's state after the last step")
    args = ap.parse_args()

    env = tutti.torch.init_process_group()                                          # tutti
    device = torch.device("cuda", env.local_rank) if torch.cuda.is_available() else torch.device("cpu")
    loader = tutti.torch.Loader(transport=args.transport, max_steps=args.steps,     # tutti
                                device=device if device.type == "cuda" else None)
    if args.resume:
        loader.load_state_dict(torch.load(args.resume))                             # tutti
    torch.manual_seed(args.seed)
    vit = VisionEncoder(3 * 2 * 14 * 14, 32, args.hidden).to(device)
    lm = CausalLM(args.hidden, 2).to(device)
    params = list(vit.parameters()) + list(lm.parameters())
    opt = torch.optim.SGD(params, lr=args.lr) if args.sgd else torch.optim.Adam(params, lr=args.lr)
    log = open(args.log, "w") if args.log and env.rank == 0 else None
    dumps = []
    for batch in loader:                                                            # tutti
        t0 = time.time()
        opt.zero_grad(set_to_none=True)
        x = vit(batch.pixel_values, batch.vit_cu_seqlens)                           # tutti
        emb = tutti.torch.exchange(x, batch)                                        # tutti
        tokens = torch.tensor(float(batch.num_label_tokens), device=device)         # tutti
        dist.all_reduce(tokens)
        loss_sum = torch.zeros((), device=device)
        names = batch.source_names                                                  # tutti
        source_loss = torch.zeros(len(names), device=device)
        source_tokens = torch.zeros(len(names), device=device)
        for mb in batch.micro_batches:                                              # tutti
            rows = swap_first_and_last(emb) if args.swap_rows else emb  # per micro-batch
            h = mb.scatter_image_embeds(lm.embed(fold_ids(mb.input_ids)), rows)      # tutti
            logits = lm(h, mb.mrope_position_ids, mb.cu_seqlens)                    # tutti
            labels = mb.labels[:, 1:]                                               # tutti
            target = torch.where(labels >= 0, fold_ids(labels.clamp(min=0)), labels)
            token_loss = F.cross_entropy(logits[0, :-1], target[0], ignore_index=-100,
                                         reduction="none")
            loss = token_loss.sum() / tokens
            loss.backward()  # the last micro-batch's backward runs the backward exchange
            loss_sum += loss.detach()
            add_source_losses(mb, token_loss.detach(), target[0] != -100, source_loss,
                              source_tokens)
        flat = all_reduce_grads(params)
        dist.all_reduce(loss_sum)
        dist.all_reduce(source_loss)
        dist.all_reduce(source_tokens)
        opt.step()
        if env.rank == 0:
            row = {"step": batch.step, "loss": loss_sum.item(), "tokens": int(tokens.item()),
                   "seconds": round(time.time() - t0, 4),
                   # Per source: the mean loss of its label tokens, and their count.
                   "source_loss": {n: (source_loss[i] / source_tokens[i]).item()
                                   for i, n in enumerate(names) if source_tokens[i] > 0},
                   "source_tokens": {n: int(source_tokens[i].item())
                                     for i, n in enumerate(names) if source_tokens[i] > 0}}
            print(json.dumps(row), flush=True)
            if log:
                log.write(json.dumps(row) + "\n")
                log.flush()
            if args.dump_grads:
                dumps.append({"step": batch.step, "loss": loss_sum.item(), "grad": flat.cpu()})
    if args.dump_grads and env.rank == 0:
        torch.save(dumps, args.dump_grads)
    if args.save_state and env.rank == 0:
        torch.save(loader.state_dict(), args.save_state)                             # tutti
    dist.barrier()


if __name__ == "__main__":
    main()
