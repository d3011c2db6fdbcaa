"""Where does our dK/dV kernel lose to a plain one (issue 31)?

At the Llama shape (B1 T4k, 32 query heads on 4, head dim 64, causal, the
group split 8 ways) a 60-line causal dK/dV kernel that masks every block
with one compare (``bench.probes.dq_fused``) ran in 345 us at 32x64/4w/3s;
ours, at the same tile, 427.  This probe starts from that plain kernel and
adds our kernel's structure one piece at a time, each a constexpr flag:

* ``R``: three runs of query blocks (masked diagonal, unmasked middle, a
  masked tail that is empty here), each its own pipelined loop, as ours;
* ``S``: the sequence strides as run-time arguments (multiples of 16, as
  Triton's launcher specialises them), not compile-time products;
* ``G``: the group's query heads per program as a run-time count, as ours
  (``group // splits`` of arguments), not a constant;
* ``L``: the ``lse == -inf`` guard, and the rows clamped to the end;
* ``E``: the epilogue as ours: partials ``[splits, B, T, H, D]`` through
  masked stores;
* ``B`` (not ours: a candidate): one loop, the mask under a run-time branch
  taken by the diagonal blocks only (without ``R``).

Each flag alone, all of them, and all but each one, beside our kernel's
own launch (the plan's, made as ``bench.probes.dkdv_runs`` does) in the same
process.  Every variant's dK/dV is checked against our kernel's.

``python -m bench.probes.dkdv_bisect``; prints a table.  ``BISECT_TILES``
(e.g. ``"32,64,4,3 32,128,4,3"``) picks the tiles.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.launch import run_steps
from torch_api._launch import launch

LOG2E = tl.constexpr(1.4426950408889634)
B, T, HQ, H, D = 1, 4096, 32, 4, 64
SPLITS = 8
FLAGS = "RSGLEB"


@triton.jit
def _blocks(dk, dv, k, v, offs_n, Q_h, DO_h, LSE_h, DELTA_h, lo, hi, end, sq, qk_scale, mask_below,
            D: tl.constexpr, BM: tl.constexpr, MASK: tl.constexpr, GUARD: tl.constexpr):  # fmt: skip
    offs_d = tl.arange(0, D)
    for start in range(lo, hi, BM):
        offs_m = start + tl.arange(0, BM)
        rows = offs_m
        if GUARD:
            rows = tl.minimum(rows, tl.maximum(end - 1, 0))
        q = tl.load(Q_h + rows[:, None] * sq + offs_d[None, :])
        do = tl.load(DO_h + rows[:, None] * sq + offs_d[None, :])
        lse = tl.load(LSE_h + rows)
        delta = tl.load(DELTA_h + rows)
        if GUARD:
            lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
        else:
            lse2 = lse * LOG2E
        s_t = dot(k, tl.trans(q), None) * qk_scale
        if MASK == 2:
            # One loop, the mask under a branch: only the blocks below mask_below.
            if start < mask_below:
                s_t = tl.where(offs_n[:, None] <= offs_m[None, :], s_t, float("-inf"))
        elif MASK:
            if GUARD:
                lim = tl.where(offs_m < end, offs_m, -2147483648)
            else:
                lim = offs_m
            s_t = tl.where(offs_n[:, None] <= lim[None, :], s_t, float("-inf"))
        p_t = tl.exp2(s_t - lse2[None, :])
        dv += dot(p_t.to(do.dtype), do, None)
        dp_t = dot(v, tl.trans(do), None)
        ds_t = p_t * (dp_t - delta[None, :])
        dk += dot(ds_t.to(q.dtype), q, None)
    return dk, dv


@triton.jit
def row_strides(stride_qt, stride_kt, HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, S: tl.constexpr):
    """The time strides of ``[B, T, HQ, D]`` queries and ``[B, T, H, D]``
    keys: the run-time arguments with ``S``, else compile-time products."""
    if S:
        return stride_qt, stride_kt
    else:
        return HQ * D, H * D


@triton.jit
def _bisect_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV, T, group_rt, splits_rt, stride_qt, stride_kt, scale,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    SPLITS: tl.constexpr, R: tl.constexpr, S: tl.constexpr, G: tl.constexpr, L: tl.constexpr,
    E: tl.constexpr, BR: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid = tl.program_id(1)
    if G:
        per = group_rt // splits_rt
        split = pid % splits_rt
        bh = pid // splits_rt
    else:
        per: tl.constexpr = (HQ // H) // SPLITS
        split = pid % SPLITS
        bh = pid // SPLITS
    b = bh // H
    h = bh % H
    group: tl.constexpr = HQ // H
    sq, sk = row_strides(stride_qt, stride_kt, HQ, H, D, S)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, D)
    k = tl.load(K + (b * T + offs_n[:, None]) * sk + h * D + offs_d[None, :])
    v = tl.load(V + (b * T + offs_n[:, None]) * sk + h * D + offs_d[None, :])
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    qk_scale = scale * 1.4426950408889634
    for g in range(split * per, split * per + per):
        hq = h * group + g
        Q_h = Q + b * T * sq + hq * D
        DO_h = DO + b * T * sq + hq * D
        LSE_h = LSE + (b * HQ + hq) * T
        DELTA_h = DELTA + (b * HQ + hq) * T
        lo = (pid_n * BN // BM) * BM
        if R:
            # The first block whose queries all follow the keys: unmasked from there.
            mid = tl.minimum(tl.cdiv(pid_n * BN + BN, BM) * BM, T)
            dk, dv = _blocks(dk, dv, k, v, offs_n, Q_h, DO_h, LSE_h, DELTA_h, lo, mid, T, sq, qk_scale, 0,
                             D, BM, True, L)  # fmt: skip
            dk, dv = _blocks(dk, dv, k, v, offs_n, Q_h, DO_h, LSE_h, DELTA_h, mid, T, T, sq, qk_scale, 0,
                             D, BM, False, L)  # fmt: skip
            dk, dv = _blocks(dk, dv, k, v, offs_n, Q_h, DO_h, LSE_h, DELTA_h, T, T, T, sq, qk_scale, 0,
                             D, BM, True, L)  # fmt: skip
        elif BR:
            mid = tl.minimum(tl.cdiv(pid_n * BN + BN, BM) * BM, T)
            dk, dv = _blocks(dk, dv, k, v, offs_n, Q_h, DO_h, LSE_h, DELTA_h, lo, T, T, sq, qk_scale, mid,
                             D, BM, 2, L)  # fmt: skip
        else:
            dk, dv = _blocks(dk, dv, k, v, offs_n, Q_h, DO_h, LSE_h, DELTA_h, lo, T, T, sq, qk_scale, 0,
                             D, BM, True, L)  # fmt: skip
    dk = dk * scale
    if E:
        # [splits, B, T, H, D], rows masked as ours.
        rows = ((split.to(tl.int64) * (tl.num_programs(1) // (H * SPLITS)) + b) * T + offs_n) * H + h
        kvalid = offs_n < T
        tl.store(DK + rows[:, None] * D + offs_d[None, :], dk, mask=kvalid[:, None])
        tl.store(DV + rows[:, None] * D + offs_d[None, :], dv, mask=kvalid[:, None])
    else:
        # [splits, B, H, T, D]
        rows = (split * (tl.num_programs(1) // SPLITS) + bh) * T + offs_n
        tl.store(DK + rows[:, None] * D + offs_d[None, :], dk)
        tl.store(DV + rows[:, None] * D + offs_d[None, :], dv)


def _variants():
    """Each flag alone, all of ours (RSGLE), all but each one, and ours with
    the branch instead of the runs (SGLEB)."""
    ours = "RSGLE"
    return ["", *FLAGS, ours, "SGLEB", *(ours.replace(f, "") for f in ours)]


def main():
    from bench.probes.dkdv_runs import backward_case, retiled

    tiles = [tuple(int(x) for x in t.split(",")) for t in os.environ.get("BISECT_TILES", "32,64,4,3").split()]
    *_, steps, inputs = backward_case(B, T, HQ, H, D, True)
    main_plan = steps[0]
    ref_dk, ref_dv = run_steps(steps, inputs, launch)
    q, k, v, do = (inputs[n] for n in ("q", "k", "v", "do"))
    lse, delta = inputs["lse"], inputs["delta"]
    scale = D**-0.5
    c = main_plan.constexprs
    print(f"ours (plan {c['BM']}x{c['BN']}/{main_plan.num_warps}w/{main_plan.num_stages}s, splits {SPLITS})")
    ours = triton.testing.do_bench(lambda: launch(main_plan, inputs), warmup=25, rep=200) * 1e3
    print(f"| variant | tile | us | max diff vs ours |\n|---|---|---|---|\n| ours | plan | {ours:.1f} | |")
    for bm, bn, w, s in tiles:
        plan = retiled(main_plan, (bm, bn, w, s), T)
        got = launch(plan, inputs)
        diff = max((a - b).abs().max().item() for a, b in zip(got, launch(main_plan, inputs), strict=True))
        us = triton.testing.do_bench(lambda plan=plan: launch(plan, inputs), warmup=25, rep=200) * 1e3
        print(f"| ours | {bm}x{bn}/{w}w/{s}s | {us:.1f} | {diff:.1e} (partials) |", flush=True)
        for flags in _variants():
            fl = {f: int(f in flags) for f in FLAGS}
            fl["BR"] = fl.pop("B")
            dk = torch.full((SPLITS, B, T, H, D), float("nan"), device="cuda", dtype=torch.float32)
            dv = torch.full_like(dk, float("nan"))
            grid = (T // bn, B * H * SPLITS)
            args = (q, k, v, do, lse, delta, dk, dv, T, HQ // H, SPLITS, HQ * D, H * D, scale, HQ, H, D)

            def run(args=args, grid=grid, bm=bm, bn=bn, w=w, s=s, fl=fl):
                _bisect_dkdv[grid](*args, bm, bn, SPLITS, **fl, num_warps=w, num_stages=s)

            try:
                run()
                torch.cuda.synchronize()
                if fl["E"]:
                    got_k, got_v = dk.sum(0), dv.sum(0)
                else:  # [splits, B, H, T, D] laid out in a [splits, B, T, H, D] buffer
                    got_k = dk.view(SPLITS, B, H, T, D).sum(0).transpose(1, 2)
                    got_v = dv.view(SPLITS, B, H, T, D).sum(0).transpose(1, 2)
                diff = max(
                    (got_k - ref_dk.float()).abs().max().item(), (got_v - ref_dv.float()).abs().max().item()
                )
                us = triton.testing.do_bench(run, warmup=25, rep=200) * 1e3
                row = f"{us:.1f} | {diff:.1e}"
            except Exception as e:  # a variant's failure must not hide the others
                row = f"error {type(e).__name__}: {str(e)[:120]} |"
            print(f"| plain+{flags or '-'} | {bm}x{bn}/{w}w/{s}s | {row} |", flush=True)
    ours = triton.testing.do_bench(lambda: launch(main_plan, inputs), warmup=25, rep=200) * 1e3
    print(f"| ours again | plan | {ours:.1f} | |")


if __name__ == "__main__":
    main()
