"""Register caps on the flash kernels at head dim 64 (issue 31).

``bench.probes.fwd_bisect`` put a plain causal forward at 128x64/8w/3s at
1417 us (B4 H16 T8k) where ours took 1759 and the plan's 64x64/4w/4s 1549.
Offline sm_90 compiles (Triton 3.6) say why: ours takes 167 registers
there (one 8-warp program a multiprocessor), the plain kernel 123 (two);
with PTX ``.maxnreg`` 128 ours fits in 128 without spilling.  Likewise
64x64/4w/4s: 168 registers (3 programs), 128 without spills under the
cap (4).  This probe times each launch of the backward and forward, the
plan's own and variants ``(BM, BN, warps, stages, maxnreg)``, and checks
each variant's outputs against the plan's.

``python -m bench.probes.reg_cap``; ``REG_CAP_SHAPE="i j"`` runs those
shapes of ``SHAPES``.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton

from bench.probes.dkdv_runs import backward_case, retiled
from core_triton.common.launch import run_steps
from torch_api._launch import launch

SHAPES = (
    # (B, T, HQ, H, D, causal)
    (1, 4096, 32, 4, 64, True),
    (4, 8192, 16, 16, 64, True),
    (4, 8192, 16, 16, 64, False),
    (16, 2048, 16, 16, 64, True),
    (16, 2048, 16, 16, 64, False),
)
if "REG_CAP_SHAPE" in os.environ:
    SHAPES = tuple(SHAPES[int(i)] for i in os.environ["REG_CAP_SHAPE"].split())
# Variants per launch, beside the plan's own tile (with and without a cap).
VARIANTS = {
    "fwd": ((64, 64, 4, 4, 128), (128, 64, 8, 3, None), (128, 64, 8, 3, 128), (128, 64, 4, 3, 168)),
    "dq": ((64, 64, 4, 3, 128), (128, 64, 8, 3, None), (128, 64, 8, 3, 128)),
    "dkdv": ((32, 64, 4, 3, None), (32, 64, 4, 3, 128), (64, 64, 8, 3, None), (64, 64, 8, 3, 128)),
}


def _variant(plan, tiles, T, block):
    *tile, cap = tiles
    return dataclasses.replace(retiled(plan, tuple(tile), T, block), maxnreg=cap)


def _time(plan, rest, inputs, ref):
    got = run_steps((plan, *rest), inputs, launch)
    torch.cuda.synchronize()
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, ref, strict=True))
    us = triton.testing.do_bench(lambda: launch(plan, inputs), warmup=25, rep=200) * 1e3
    return f"{us:.1f} | {diff:.1e}"


def main():
    print("| shape | launch | tiles (BM, BN, warps, stages, maxnreg) | us | max diff vs plan |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        forward, dq_steps, dkdv_steps, inputs = backward_case(*shape)
        T = shape[1]
        for name, steps, block in (
            ("fwd", forward, "BM"),
            ("dq", dq_steps, "BM"),
            ("dkdv", dkdv_steps, "BN"),
        ):
            main_plan, rest = steps[0], steps[1:]
            ref = run_steps(steps, inputs, launch)
            c = main_plan.constexprs
            mine = (c["BM"], c["BN"], main_plan.num_warps, main_plan.num_stages, main_plan.maxnreg)
            for tiles in (mine, *(t for t in VARIANTS[name] if t != mine)):
                try:
                    row = _time(_variant(main_plan, tiles, T, block), rest, inputs, ref)
                except Exception as e:  # one variant's failure must not hide the others
                    row = f"error {type(e).__name__}: {str(e)[:120]} |"
                mark = " (plan)" if tiles == mine else ""
                print(f"| {shape} | {name} | {tiles}{mark} | {row} |", flush=True)


if __name__ == "__main__":
    main()
