"""The Gluon backward's kernels (core_triton.attention.flash_bwd_dkdv_gluon
and flash_bwd_dq_gluon) at several tiles beside the Triton dK/dV and dQ
launches (the plan's with the Gluon backward off), on an sm_90 GPU (issue
31).  Not part of ``nox -s bench``.

For each shape the real forward makes ``out`` and ``lse``, the plan's dQ
launch ``dq`` and ``delta``, its dK/dV launch (the split's sum included)
``dk`` and ``dv`` (bench.probes.dkdv_runs.backward_case): those are the
reference, themselves tested against float64.  Each variant of each kernel
(``DKDV_VARIANTS``, ``DQ_VARIANTS``: the query or key block and the
stages) runs on the same inputs with its outputs filled with NaN first and is compared
with them (largest difference over the reference's largest
magnitude; the dK/dV draft takes the plan's ``delta``); at the timing
shapes both launches are timed alone.  Check shapes first (ragged
lengths, more or fewer keys than queries, several batches, grouped heads),
then issue 31's timing shapes.

``python -m bench.probes.gluon_bwd``; ``GLUON_BWD_TIME=0`` checks only.
"""

from __future__ import annotations

import math
import os

import torch
import triton

from bench.probes.dkdv_runs import backward_case
from core_triton.attention import flash
from core_triton.attention.flash_bwd_dkdv_gluon import flash_bwd_dkdv_gluon_kernel
from core_triton.attention.flash_bwd_dq_gluon import flash_bwd_dq_gluon_kernel
from core_triton.common.launch import run_steps
from torch_api._launch import _ensure_scratch_allocator, launch

CHECKS = (
    # (B, Tq, HQ, H, D, causal[, Tk]): Tk default Tq
    (1, 128, 1, 1, 128, False),
    (1, 128, 1, 1, 128, True),
    (2, 1000, 4, 4, 128, True),
    (2, 1000, 4, 4, 128, False),
    (3, 777, 8, 2, 128, True),
    (2, 300, 4, 1, 128, False),
    # More keys than queries and fewer, causal (top-left aligned) and not.
    (2, 300, 4, 2, 128, True, 1000),
    (2, 1000, 4, 2, 128, True, 300),
    (2, 500, 4, 4, 128, False, 77),
)
SHAPES = (
    (4, 8192, 16, 16, 128, False),
    (4, 8192, 16, 16, 128, True),
    (16, 2048, 16, 16, 128, False),
    (16, 2048, 16, 16, 128, True),
    (1, 4096, 32, 4, 128, True),
)
# (query block, stages) with 128 keys a program: the plan's (39th session,
# H200: BM 32 with 2 or 3 stages ran 0.38-1.05x of the Triton launch, BM 64
# 0.67-1.18x).
DKDV_VARIANTS = ((64, 2),)
# (key block, stages) with 128 queries a program: the plan's (BN 64 with 2
# or 3 stages within 3% of it).
DQ_VARIANTS = ((128, 2),)
MAXNREG = 168


def _nan_like(*arrays):
    return tuple(torch.full_like(a, float("nan")) for a in arrays)


def gluon_dkdv(inputs, causal, bm, stages, out=None):
    """The dK/dV kernel's ``(dk, dv)``, into ``out`` if given (timing), else
    into new arrays filled with NaN."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    B, Tq, HQ, D = q.shape
    _, Tk, H, _ = k.shape
    dk, dv = out or _nan_like(k, v)
    flash_bwd_dkdv_gluon_kernel[(triton.cdiv(Tk, 128), B * H)](
        q, k, v, inputs["do"], inputs["lse"], inputs["delta"], 1.0 / math.sqrt(D), B, Tq, Tk, dk, dv,
        HQ=HQ, H=H, D=D, CAUSAL=causal, BM=bm, BN=128, STAGES=stages, num_warps=4, maxnreg=MAXNREG,
    )  # fmt: skip
    return dk, dv


def gluon_dq(inputs, causal, bn, stages, out=None):
    """The dQ kernel's ``(dq, delta)``, into ``out`` if given (timing), else
    into new arrays filled with NaN."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    B, Tq, HQ, D = q.shape
    _, Tk, H, _ = k.shape
    dq, delta = out or _nan_like(q, inputs["lse"])
    flash_bwd_dq_gluon_kernel[(triton.cdiv(Tq, 128), B * HQ)](
        q, k, v, inputs["o"], inputs["do"], inputs["lse"], 1.0 / math.sqrt(D), B, Tq, Tk, dq, delta,
        HQ=HQ, H=H, D=D, CAUSAL=causal, BM=128, BN=bn, STAGES=stages, num_warps=4, maxnreg=MAXNREG,
    )  # fmt: skip
    return dq, delta


def _err(got, ref):
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def _variant_rows(shape, name, run, variants, ref, plan_us):
    """One table row per variant of a draft: errors against ``ref``, and
    its time beside the plan's where ``plan_us`` is given; the count of
    failed checks."""
    failed = 0
    for block, stages in variants:
        label = f"{name} {block} {stages}s"
        try:
            got = run(block, stages)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
            print(f"| {shape} | {label} | {type(exc).__name__}: {str(exc)[:150]} | | | | | |")
            failed += 1
            continue
        nan = any(bool(a.isnan().any()) for a in got)
        errs = [_err(a, r) for a, r in zip(got, ref, strict=True)]
        bad = nan or max(errs) > 2e-2
        failed += bad
        cells = f"{errs[0]:.2e} | {errs[1]:.2e}{' **FAIL**' if bad else ''} | {nan}"
        if plan_us:
            g_us = triton.testing.do_bench(lambda b=block, s=stages, o=got: run(b, s, o), rep=200) * 1e3
            cells += f" | {plan_us:.1f} | {g_us:.1f} | {plan_us / g_us:.2f}"
        else:
            cells += " | | |"
        print(f"| {shape} | {label} | {cells} |", flush=True)
    return failed


def main():
    _ensure_scratch_allocator()  # the descriptors live in global scratch
    flash.set_gluon_backward("off")  # the reference: the Triton kernels' launches
    timing = os.environ.get("GLUON_BWD_TIME", "1") != "0"
    print("| shape | draft, block, stages | err 1 (dK / dQ) | err 2 (dV / delta) | NaN | plan us | Gluon us |"
          " plan / Gluon |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    failed = 0
    for shape in CHECKS + (SHAPES if timing else ()):
        causal = shape[5]
        _, dq_steps, dkdv_steps, inputs = backward_case(*shape)
        dq_ref = run_steps(dq_steps, inputs, launch)
        dkdv_ref = run_steps(dkdv_steps, inputs, launch)
        timed = timing and shape in SHAPES

        def plan_time(steps, timed=timed, inputs=inputs):
            return (
                triton.testing.do_bench(lambda: run_steps(steps, inputs, launch), rep=200) * 1e3
                if timed
                else 0
            )

        dkdv_us, dq_us = plan_time(dkdv_steps), plan_time(dq_steps)
        failed += _variant_rows(
            shape, "dK/dV BM", lambda m, s, o=None, i=inputs, c=causal: gluon_dkdv(i, c, m, s, o),
            DKDV_VARIANTS, dkdv_ref, dkdv_us,
        )  # fmt: skip
        failed += _variant_rows(
            shape, "dQ BN", lambda n, s, o=None, i=inputs, c=causal: gluon_dq(i, c, n, s, o),
            DQ_VARIANTS, dq_ref, dq_us,
        )  # fmt: skip
    print(f"checks failed: {failed}")


if __name__ == "__main__":
    main()
