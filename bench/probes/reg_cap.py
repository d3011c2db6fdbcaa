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
shapes of ``SHAPES``; ``REG_CAP_PLAN_ONLY=1`` times the plans' own launches
only (``PART=trees`` then compares two trees launch by launch).
"""

from __future__ import annotations

import dataclasses
import os

from bench.probes.dkdv_runs import backward_case, retiled, time_and_check, variant_rows
from core_triton.common.launch import run_steps
from torch_api._launch import launch

SHAPES = (
    # (B, T, HQ, H, D, causal)
    (1, 4096, 32, 4, 64, True),
    (4, 8192, 16, 16, 64, True),
    (4, 8192, 16, 16, 64, False),
    (16, 2048, 16, 16, 64, True),
    (16, 2048, 16, 16, 64, False),
    # Head dim 128 (its variants are head dim 64's: for REG_CAP_PLAN_ONLY).
    (4, 8192, 16, 16, 128, True),
    (1, 4096, 32, 4, 128, True),
)
if "REG_CAP_SHAPE" in os.environ:
    SHAPES = tuple(SHAPES[int(i)] for i in os.environ["REG_CAP_SHAPE"].split())
# Variants per launch, beside the plan's own tile (with and without a cap).
VARIANTS = {
    "fwd": ((64, 64, 4, 4, 128), (128, 64, 8, 3, None), (128, 64, 8, 3, 128), (128, 64, 4, 3, 168)),
    "dq": ((64, 64, 4, 3, 128), (128, 64, 8, 3, None), (128, 64, 8, 3, 128)),
    "dkdv": ((32, 64, 4, 3, None), (32, 64, 4, 3, 128), (64, 64, 8, 3, None), (64, 64, 8, 3, 128)),
}
if os.environ.get("REG_CAP_PLAN_ONLY"):
    VARIANTS = dict.fromkeys(VARIANTS, ())


def _variant(plan, tiles, T, block):
    *tile, cap = tiles
    return dataclasses.replace(retiled(plan, tuple(tile), T, block), maxnreg=cap)


def main():
    print("| shape | launch | tiles (BM, BN, warps, stages, maxnreg) | us | max diff vs plan |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        forward, dq_steps, dkdv_steps, inputs = backward_case(*shape)
        launches = (("fwd", forward, "BM"), ("dq", dq_steps, "BM"), ("dkdv", dkdv_steps, "BN"))
        for name, steps, block in launches:
            main_plan, rest = steps[0], steps[1:]
            ref = run_steps(steps, inputs, launch)
            c = main_plan.constexprs
            mine = (c["BM"], c["BN"], main_plan.num_warps, main_plan.num_stages, main_plan.maxnreg)

            def row(tiles, main_plan=main_plan, rest=rest, inputs=inputs, ref=ref, block=block, T=shape[1]):
                us, diff = time_and_check(_variant(main_plan, tiles, T, block), rest, inputs, ref)
                return f"{us:.1f} | {diff:.1e}"

            for tiles, mark, text in variant_rows(mine, VARIANTS[name], row):
                print(f"| {shape} | {name} | {tiles}{mark} | {text} |", flush=True)


if __name__ == "__main__":
    main()
