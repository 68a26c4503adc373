#!/usr/bin/env python3
"""Measures what an image and a document cost on this GPU, for the simulator.

Times, forward and backward, on random weights in bf16:
  * a stack of the model preset's ViT blocks on one image of p patches, over a
    range of p, with fused attention (scaled_dot_product_attention: flash) and
    with eager attention (the [heads, p, p] score matrix in memory);
  * the preset's LLM blocks on one document of n tokens (causal, fused), over
    a range of n.
A few blocks are timed and scaled to the model's depth. Writes the pairs
`tutti simulate --calibration FILE` fits (tools/sim/calibration.h):
  vit sdpa <patches> <seconds>
  vit eager <patches> <seconds>
  llm flash <tokens> <seconds>
with '#' lines naming the date, the device and the shapes. Runs within its
time budget (--budget-s, 300 s): sizes left when it runs out, or that do not
fit the GPU's memory, are skipped and said so in a '#' line.

For an H200 (or any CUDA GPU) with PyTorch, no network needed:
  python3 tools/gpu_calibrate.py --model vit400m-moe16b-a3b
The latest output is kept, dated, in tools/gpu_calibrate.out. CI runs it on
the CPU with --tiny (tools/sim/test_gpu_calibrate.py).

The MoE LLM is timed as a dense block of its active parameters per token
(the FLOPs an MoE token pays; routing and expert imbalance are not timed).
"""
import argparse
import datetime
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

# The model presets of common/model_shape.cc: parameters, hidden size, layers,
# heads (and the LLM's key/value heads), what the blocks are sized from.
PRESETS = {
    "vit400m-moe16b-a3b": {
        "vit": dict(params=400e6, hidden=1152, layers=27, heads=16),
        "llm": dict(active_params=3e9, hidden=2048, layers=28, heads=16, kv_heads=16),
    },
    "vit675m-dense7b": {
        "vit": dict(params=675e6, hidden=1280, layers=32, heads=16),
        "llm": dict(active_params=7.6e9, hidden=3584, layers=28, heads=28, kv_heads=4),
    },
    # A CPU-sized shape with the same code path (tests).
    "tiny": {
        "vit": dict(params=2 * 12 * 64 * 64, hidden=64, layers=2, heads=4),
        "llm": dict(active_params=2 * 12 * 64 * 64, hidden=64, layers=2, heads=4, kv_heads=2),
    },
}
PATCHES = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
TOKENS = [1024, 2048, 4096, 8192, 16384, 32768]
TINY_SIZES = [32, 64, 128, 256, 512]
# torch < 2.0 has no fused attention: its 'sdpa' and 'flash' lines then time
# the same arithmetic unfused (said in the output's header).
FUSED = hasattr(F, "scaled_dot_product_attention")


def attention(q, k, v, causal=False):
    if FUSED:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v


def mlp_width(params_per_layer, hidden, attention_params, matrices):
    """The MLP width that makes a layer's parameters what the preset says."""
    return max(hidden, int((params_per_layer - attention_params) / (matrices * hidden)))


class VitBlock(torch.nn.Module):
    def __init__(self, hidden, heads, mlp, eager):
        super().__init__()
        self.heads, self.eager = heads, eager
        self.norm1 = torch.nn.LayerNorm(hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.norm2 = torch.nn.LayerNorm(hidden)
        self.fc1 = torch.nn.Linear(hidden, mlp)
        self.fc2 = torch.nn.Linear(mlp, hidden)

    def forward(self, x):  # x: [1, p, hidden]
        b, p, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, p, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [1, heads, p, d/heads]
        if self.eager:
            scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
            a = torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v
        else:
            a = attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, p, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class LlmBlock(torch.nn.Module):
    def __init__(self, hidden, heads, kv_heads, mlp):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        head = hidden // heads
        self.norm1 = torch.nn.LayerNorm(hidden)
        self.q = torch.nn.Linear(hidden, hidden, bias=False)
        self.kv = torch.nn.Linear(hidden, 2 * kv_heads * head, bias=False)
        self.o = torch.nn.Linear(hidden, hidden, bias=False)
        self.norm2 = torch.nn.LayerNorm(hidden)
        self.gate_up = torch.nn.Linear(hidden, 2 * mlp, bias=False)
        self.down = torch.nn.Linear(mlp, hidden, bias=False)

    def forward(self, x):  # x: [1, n, hidden]
        b, n, d = x.shape
        head = d // self.heads
        h = self.norm1(x)
        q = self.q(h).view(b, n, self.heads, head).transpose(1, 2)
        k, v = self.kv(h).view(b, n, 2, self.kv_heads, head).unbind(2)
        rep = self.heads // self.kv_heads
        k = k.transpose(1, 2).repeat_interleave(rep, dim=1)
        v = v.transpose(1, 2).repeat_interleave(rep, dim=1)
        a = attention(q, k, v, causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, n, d))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def vit_blocks(shape, count, eager):
    d = shape["hidden"]
    mlp = mlp_width(shape["params"] / shape["layers"], d, 4 * d * d, 2)
    return [VitBlock(d, shape["heads"], mlp, eager) for _ in range(count)]


def llm_blocks(shape, count):
    d, heads, kv = shape["hidden"], shape["heads"], shape["kv_heads"]
    attention = 2 * d * d + 2 * d * (d // heads) * kv
    mlp = mlp_width(shape["active_params"] / shape["layers"], d, attention, 3)
    return [LlmBlock(d, heads, kv, mlp) for _ in range(count)]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_stack(blocks, length, device, dtype, repeats):
    """Median seconds of one forward and backward of `blocks` over [1, length, d]."""
    stack = torch.nn.Sequential(*blocks).to(device=device, dtype=dtype)
    x = torch.randn(1, length, blocks[0].norm1.normalized_shape[0], device=device, dtype=dtype,
                    requires_grad=True)
    times = []
    for i in range(repeats + 1):  # the first is a warm-up
        sync(device)
        start = time.perf_counter()
        stack(x).float().sum().backward()
        sync(device)
        if i > 0:
            times.append(time.perf_counter() - start)
        stack.zero_grad(set_to_none=True)
        x.grad = None
    times.sort()
    return times[len(times) // 2]


def is_oom(error):
    return isinstance(error, MemoryError) or "out of memory" in str(error).lower()


def measure(kind, sizes, make_blocks, scale, args, device, dtype, deadline, out):
    """Times make_blocks() over `sizes`; writes '<kind> <size> <seconds>' scaled."""
    for size in sizes:
        if time.monotonic() > deadline:
            out.append(f"# {kind} {size}: skipped, past the time budget")
            continue
        try:
            seconds = time_stack(make_blocks(), size, device, dtype, args.repeats)
        except (RuntimeError, MemoryError) as e:
            if not is_oom(e):
                raise
            out.append(f"# {kind} {size}: skipped, does not fit the device's memory")
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        out.append(f"{kind} {size} {seconds * scale:.6g}")
        print(out[-1], flush=True)


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="vit400m-moe16b-a3b", choices=sorted(PRESETS))
    p.add_argument("--tiny", action="store_true", help="the tiny shape and sizes (CPU tests)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--blocks", type=int, default=2, help="blocks timed, scaled to the depth")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per size (median)")
    p.add_argument("--budget-s", type=float, default=300, help="seconds for the whole run")
    p.add_argument("--out", default=os.path.join(here, "gpu_calibrate.out"))
    args = p.parse_args(argv)
    model = "tiny" if args.tiny else args.model
    if args.blocks < 1 or args.repeats < 1 or not args.budget_s > 0:
        p.error("--blocks, --repeats and --budget-s must be positive")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_calibrate: no CUDA device; run on a GPU machine or pass --device cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    shape = PRESETS[model]
    vit, llm = shape["vit"], shape["llm"]
    vit_n, llm_n = min(args.blocks, vit["layers"]), min(args.blocks, llm["layers"])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = [
        f"# tutti gpu_calibrate {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"# device {name}, torch {torch.__version__}, {dtype}".replace("torch.", ""),
        f"# model {model}: vit {vit}, llm {llm}",
        f"# {vit_n} ViT and {llm_n} LLM blocks timed (median of {args.repeats}), "
        f"seconds scaled to the whole encoder and LLM, forward and backward",
    ]
    if not FUSED:
        out.append("# no scaled_dot_product_attention in this torch: sdpa and flash lines unfused")
    deadline = time.monotonic() + args.budget_s
    patches = TINY_SIZES if args.tiny else PATCHES
    tokens = TINY_SIZES if args.tiny else TOKENS
    measure("vit sdpa", patches, lambda: vit_blocks(vit, vit_n, False), vit["layers"] / vit_n,
            args, device, dtype, deadline, out)
    measure("vit eager", patches, lambda: vit_blocks(vit, vit_n, True), vit["layers"] / vit_n,
            args, device, dtype, deadline, out)
    measure("llm flash", tokens, lambda: llm_blocks(llm, llm_n), llm["layers"] / llm_n, args,
            device, dtype, deadline, out)
    with open(args.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
