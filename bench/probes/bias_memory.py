"""Peak GPU memory of flash attention fwd+bwd with a bias, against no bias
(``python -m bench.probes.bias_memory``; PyTorch, CUDA).

B4 H16 T4096 D128 bf16, causal off.  Rows: no bias; a broadcast ``[1, 1, T,
T]`` bias that needs a gradient, and one that needs none; a full ``[B, H,
T, T]`` bias (its gradient has that size anyway).  The same for the ring on
a group of one rank (its per-step bias gradient buffer was the global
width).  ``peak``: ``torch.cuda.max_memory_allocated`` during the call,
everything included (inputs, cotangent, bias, outputs, gradients);
``extra``: the peak above the no-bias case's, and how much of that the bias
and its own gradient account for (what any implementation must hold)."""

from __future__ import annotations

import json
import os
import sys

import torch

B, H, T, D = 4, 16, 4096, 128


def _peak(fn) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def _case(op, bias_shape, bias_grad):
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (B, T, H, D)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    bias = None
    if bias_shape is not None:
        bias = torch.randn(bias_shape, device="cuda", dtype=torch.bfloat16, generator=g)
        bias.requires_grad_(bias_grad)

    def run():
        out = op(*leaves, bias=bias)
        out.backward(do)

    run()  # compile and warm up outside the measurement
    for t in (*leaves, bias):
        if t is not None:
            t.grad = None
    peak = _peak(run)
    inherent = 0 if bias is None else bias.numel() * bias.element_size() * (2 if bias_grad else 1)
    return peak, inherent


def main(argv):
    import torch.distributed as dist

    import torch_api

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1)
    ops = {"flash": torch_api.flash_attention, "ring (1 rank)": torch_api.ring_attention}
    cases = {
        "no bias": (None, False),
        "[1,1,T,T] bias, grad": ((1, 1, T, T), True),
        "[1,1,T,T] bias, no grad": ((1, 1, T, T), False),
        "[B,H,T,T] bias, grad": ((B, H, T, T), True),
    }
    rows = []
    mib = 2**20
    for op_name, op in ops.items():
        base = None
        for name, (shape, grad) in cases.items():
            torch.cuda.empty_cache()
            peak, inherent = _case(op, shape, grad)
            base = peak if base is None else base
            row = {"op": op_name, "case": name, "peak_MiB": round(peak / mib, 1),
                   "vs_no_bias": round(peak / base, 3), "extra_MiB": round((peak - base) / mib, 1),
                   "bias_and_grad_MiB": round(inherent / mib, 1)}  # fmt: skip
            rows.append(row)
            print(
                f"{op_name:14s} {name:26s} peak {peak / mib:9.1f} MiB  x{peak / base:.3f}  "
                f"extra {(peak - base) / mib:8.1f} MiB (bias and its gradient: {inherent / mib:.1f})",
                flush=True,
            )
    out = os.environ.get("TWINKERNELS_BENCH_DIR", "bench-results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bias-memory.json"), "w") as f:
        meta = {"B": B, "H": H, "T": T, "D": D, "gpu": torch.cuda.get_device_name()}
        json.dump({"meta": meta, "rows": rows}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
