"""The dK/dV launch's tiles, timed alone (issue 31).

A plain causal grouped-query dK/dV kernel (bench.probes.dq_fused, every
block masked by one compare) ran in 345-364 us at the Llama shape where ours
took 446; most of the difference was our masked runs' valid masks ANDed
into every score tile (flash_common.query_limits now folds them into the
positions).  For each shape this plans the real backward, makes ``delta``
with the real dQ launch, then times the dK/dV launch (and the split's sum)
with the plan's tile and the others of ``TILES``; every variant's dK/dV is
compared with the plan's.

``python -m bench.probes.dkdv_runs``; prints a table.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import triton

from core_triton.attention import flash as core
from core_triton.attention.flash_configs import program_grid
from core_triton.common.launch import run_steps
from torch_api._launch import info, launch

SHAPES = (
    # (B, T, HQ, H, D, causal)
    (1, 4096, 32, 4, 64, True),
    (1, 16384, 32, 4, 64, True),
    (4, 8192, 16, 16, 64, True),
    (4, 8192, 16, 16, 64, False),
    (4, 8192, 16, 16, 128, True),
    (4, 8192, 16, 16, 128, False),
    (1, 4096, 32, 4, 128, True),
    (16, 2048, 16, 16, 128, True),
    (4, 1024, 16, 16, 128, True),
    # Unsplit grouped heads (each program walks its key head's group).
    (8, 4096, 32, 4, 64, True),
    (2, 8192, 32, 8, 128, True),
)
# DKDV_RUNS_DIMS="128": the head dims to run; DKDV_RUNS_SHAPE="i j": only the
# i-th and j-th of those shapes (one process a shape compiles side by side).
_DIMS = os.environ.get("DKDV_RUNS_DIMS", "64 128").split()
SHAPES = tuple(s for s in SHAPES if str(s[4]) in _DIMS)
if "DKDV_RUNS_SHAPE" in os.environ:
    SHAPES = tuple(SHAPES[int(i)] for i in os.environ["DKDV_RUNS_SHAPE"].split())
# Tiles tried beside the plan's own, per head dim.
# Head dim 128's 8-warp 32x64 and 64x64 compile without spills on sm_90
# (Triton 3.6, B4 H16 T8k causal: 200 and 255 registers) where the plan's
# 32x64/4w/3s spills 48 bytes.
TILES = {
    64: ((32, 64, 4, 3), (32, 128, 4, 3)),
    128: ((32, 64, 4, 3), (64, 128, 8, 2), (32, 64, 8, 3), (64, 64, 8, 3)),
}


def retiled(plan, tiles, length, block="BN"):
    """``plan`` with ``tiles = (BM, BN, warps, stages)`` and its grid's
    block axis over ``length`` in blocks of ``block`` ("BN" for the dK/dV
    kernel, "BM" for the forward), the other axis and the launch order
    (``ORDER``, flash_configs.program_grid; a kernel without one, the
    Gluon forward, lays its grid out as order 0) kept."""
    bm, bn, w, s = tiles
    order = plan.constexprs.get("ORDER", 0)
    blocks_first = program_grid(1, 2, order) == (1, 2)  # program_grid's layout for this order
    programs = plan.grid[1 if blocks_first else 0]
    blocks = triton.cdiv(length, {"BM": bm, "BN": bn}[block])
    return dataclasses.replace(
        plan,
        constexprs={**plan.constexprs, "BM": bm, "BN": bn},
        num_warps=w,
        num_stages=s,
        grid=program_grid(blocks, programs, order),
    )


def forward_case(B, T, HQ, H, D, causal, g, Tk=None):
    """``(plans, inputs)``: plain attention's plans for random bf16 ``q [B,
    T, HQ, D]``, ``k``, ``v [B, Tk, H, D]`` (``Tk`` default ``T``; from
    generator ``g``) and the forward's inputs."""
    Tk = T if Tk is None else Tk
    q = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, Tk, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, Tk, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    plans, _ = core.plans(
        info(q), info(k), info(v), None, None, None, None, None, causal, None, None, None, None
    )
    zero = torch.zeros(1, device="cuda", dtype=torch.int32)
    return plans, {"q": q, "k": k, "v": v, "qoff": zero, "koff": zero}


def backward_case(B, T, HQ, H, D, causal, Tk=None):
    """``(forward, dq, dkdv, inputs)``: plain attention's launches (each a
    tuple of steps) for random bf16 inputs (``T`` queries, ``Tk`` keys,
    default ``T``), and every array they read, the forward's and dQ's
    outputs included (``delta`` from the real dQ)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    plans, inputs = forward_case(B, T, HQ, H, D, causal, g, Tk)
    do = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    out, lse = run_steps(plans.forward, inputs, launch)
    dkdv_steps, dq_steps = plans.grads(info(do), info(out), False)
    inputs.update(o=out, do=do, lse=lse)
    _, delta = run_steps(dq_steps, inputs, launch)
    inputs["delta"] = delta
    return plans.forward, dq_steps, dkdv_steps, inputs


def time_and_check(plan, rest, inputs, ref) -> tuple[float, float]:
    """``(us, diff)``: the launch ``plan`` alone, timed, and the largest
    difference of the outputs of ``(plan, *rest)`` from ``ref``."""
    got = run_steps((plan, *rest), inputs, launch)
    torch.cuda.synchronize()
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, ref, strict=True))
    return triton.testing.do_bench(lambda: launch(plan, inputs), warmup=25, rep=200) * 1e3, diff


def variant_rows(mine, variants, row):
    """``(tiles, mark, row(tiles))`` for the plan's tiles ``mine`` (marked
    " (plan)") and each other of ``variants``; a variant that fails gives
    its error as its row, so that it hides no other."""
    for tiles in (mine, *(t for t in variants if t != mine)):
        try:
            text = row(tiles)
        except Exception as e:
            text = f"error {type(e).__name__}: {str(e)[:120]} |"
        yield tiles, " (plan)" if tiles == mine else "", text


def _row(plan, rest, inputs, ref) -> str:
    """``dK/dV us | sum us | max diff`` of one variant of the launch."""
    us, diff = time_and_check(plan, rest, inputs, ref)
    env = {**inputs, **dict(zip(plan.output_names, launch(plan, inputs), strict=True))}
    sum_us = triton.testing.do_bench(lambda: launch(rest[0], env), warmup=10, rep=50) * 1e3 if rest else 0.0
    return f"{us:.1f} | {sum_us:.1f} | {diff:.1e}"


def main():
    print("| shape | tiles (BM, BN, warps, stages) | dK/dV us | sum us | max diff |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        *_, steps, inputs = backward_case(*shape)
        main_plan, rest = steps[0], steps[1:]
        ref = run_steps(steps, inputs, launch)
        c = main_plan.constexprs
        mine = (c["BM"], c["BN"], main_plan.num_warps, main_plan.num_stages)

        def row(tiles, main_plan=main_plan, rest=rest, inputs=inputs, ref=ref, T=shape[1]):
            return _row(retiled(main_plan, tiles, T), rest, inputs, ref)

        for tiles, mark, text in variant_rows(mine, TILES[shape[4]], row):
            print(f"| {shape} | {tiles}{mark} | {text} |", flush=True)


if __name__ == "__main__":
    main()
