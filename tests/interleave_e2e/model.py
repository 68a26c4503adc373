"""The tiny vision-language model of the interleaved end-to-end test, shared by its ranks
and its single-process reference: the example trainer's ViT (varlen attention per image,
2x2 merger) and a one-layer causal LM over the converted vocabulary with M-RoPE."""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client",
                                "python", "examples"))
import train_vlm  # noqa: E402

PATCH_VALUES = 3 * 2 * 14 * 14  # channels x temporal patch x patch x patch


class LM(nn.Module):
    def __init__(self, vocab, dim, heads=2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.block = train_vlm.Block(dim, heads, rope=True)
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, h, position_ids, cu_seqlens):
        """h [1, T, dim], position_ids [3, 1, T], cu_seqlens [D + 1]: logits [1, T, vocab]."""
        h = h[0]
        mask = train_vlm.varlen_mask(cu_seqlens, h.shape[0], causal=True)
        cos_sin = train_vlm.mrope(position_ids[:, 0], h.shape[1] // self.heads)
        return self.head(self.norm(self.block(h, mask, cos_sin)))[None]


def build(vocab, hidden, seed=0):
    torch.manual_seed(seed)
    vit = train_vlm.VisionEncoder(PATCH_VALUES, 16, hidden)
    lm = LM(vocab, hidden)
    return vit, lm


def parameters(vit, lm):
    return list(vit.parameters()) + list(lm.parameters())


def summed_loss(logits, labels):
    """Summed cross-entropy of logits[:, :-1] against labels[:, 1:] (-100 ignored)."""
    return F.cross_entropy(logits[0, :-1], labels[0, 1:], ignore_index=-100, reduction="sum")


def flat_grads(params):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])
