"""The Gluon dK/dV draft (bench.probes.gluon_dkdv_kernel) beside the
plan's dK/dV launch, on an sm_90 GPU (issue 31).  Not part of ``nox -s
bench``.

For each shape: the real forward and dQ launches make ``lse`` and
``delta`` (bench.probes.dkdv_runs.backward_case); the plan's dK/dV launch
(the split's sum included) gives the reference, itself tested against
float64; each variant of the Gluon kernel (``VARIANTS``: BM, STAGES) runs
on the same inputs with its outputs filled with NaN first, is compared
with it (largest difference over the reference's largest magnitude), and
both launches are timed alone.  Check shapes first (ragged lengths,
several batches, grouped heads), then issue 31's timing shapes.

``python -m bench.probes.gluon_dkdv``; ``GLUON_DKDV_TIME=0`` checks only.
"""

from __future__ import annotations

import math
import os

import torch
import triton

from bench.probes.dkdv_runs import backward_case
from bench.probes.gluon_dkdv_kernel import flash_bwd_dkdv_gluon_kernel
from core_triton.common.launch import run_steps
from torch_api._launch import launch

CHECKS = (
    # (B, T, HQ, H, D, causal)
    (1, 128, 1, 1, 128, False),
    (1, 128, 1, 1, 128, True),
    (2, 1000, 4, 4, 128, True),
    (2, 1000, 4, 4, 128, False),
    (3, 777, 8, 2, 128, True),
    (2, 300, 4, 1, 128, False),
)
SHAPES = (
    (4, 8192, 16, 16, 128, False),
    (4, 8192, 16, 16, 128, True),
    (16, 2048, 16, 16, 128, False),
    (16, 2048, 16, 16, 128, True),
    (1, 4096, 32, 4, 128, True),
)
VARIANTS = ((32, 2), (64, 2), (32, 3))  # (BM, STAGES); BM 64 spilled ~124 bytes offline
BN, MAXNREG = 128, 168


def _scratch(size, align, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def gluon_dkdv(inputs, causal, bm, stages, out=None):
    """The Gluon kernel's ``(dk, dv)``, into ``out`` if given (timing),
    else into new arrays filled with NaN."""
    q, k = inputs["q"], inputs["k"]
    B, Tq, HQ, D = q.shape
    _, Tk, H, _ = k.shape
    dk, dv = out or (torch.full_like(k, float("nan")), torch.full_like(inputs["v"], float("nan")))
    grid = (triton.cdiv(Tk, BN), B * H)
    flash_bwd_dkdv_gluon_kernel[grid](
        q, k, inputs["v"], inputs["do"], inputs["lse"], inputs["delta"], 1.0 / math.sqrt(D), B, Tq, Tk,
        dk, dv, HQ=HQ, H=H, D=D, CAUSAL=causal, BM=bm, BN=BN, STAGES=stages, num_warps=4, maxnreg=MAXNREG,
    )  # fmt: skip
    return dk, dv


def main():
    triton.set_allocator(_scratch)
    timing = os.environ.get("GLUON_DKDV_TIME", "1") != "0"
    print("| shape | variant | dK err | dV err | NaN | plan us | Gluon us | plan / Gluon |")
    print("|---|---|---|---|---|---|---|---|")
    failed = 0
    for shape in CHECKS + (SHAPES if timing else ()):
        causal = shape[5]
        _, _, steps, inputs = backward_case(*shape)
        ref = dict(zip(("dk", "dv"), run_steps(steps, inputs, launch), strict=True))
        plan_us = ""
        if timing and shape in SHAPES:
            plan_us = triton.testing.do_bench(lambda s=steps, i=inputs: run_steps(s, i, launch), rep=200)
            plan_us *= 1e3
        for bm, stages in VARIANTS:
            try:
                dk, dv = gluon_dkdv(inputs, causal, bm, stages)
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                print(f"| {shape} | BM {bm} {stages}s | {type(exc).__name__}: {str(exc)[:150]} | | | | | |")
                failed += 1
                continue
            nan = bool(dk.isnan().any() or dv.isnan().any())
            errs = [((a.float() - ref[n].float()).abs().max() / ref[n].float().abs().max()).item()
                    for n, a in (("dk", dk), ("dv", dv))]  # fmt: skip
            bad = nan or max(errs) > 2e-2
            failed += bad
            cells = f"{errs[0]:.2e} | {errs[1]:.2e}{' **FAIL**' if bad else ''} | {nan}"
            if plan_us:
                g_us = triton.testing.do_bench(
                    lambda i=inputs, c=causal, m=bm, s=stages, o=(dk, dv): gluon_dkdv(i, c, m, s, o), rep=200
                ) * 1e3  # fmt: skip
                cells += f" | {plan_us:.1f} | {g_us:.1f} | {plan_us / g_us:.2f}"
            else:
                cells += " | | |"
            print(f"| {shape} | BM {bm} {stages}s | {cells} |", flush=True)
    print(f"checks failed: {failed}")


if __name__ == "__main__":
    main()
