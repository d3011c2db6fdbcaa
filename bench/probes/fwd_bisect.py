"""How far is our flash forward from a plain one at head dim 64 (issue 31)?

At the Llama shape (B1 T4k, 32 query heads on 4, head dim 64, causal) our
forward took 218 us against cuDNN's 185; at head dim 64 no warp-specialised
kernel beat it.  ``bench.probes.dkdv_bisect`` found 17% of the dK/dV
launch in one piece of structure (a loop of run-time count); this probe
asks the same of the forward.  The plain kernel: one (batch, query head) and
``BM`` queries a program, the fully visible key blocks in one unmasked
loop, then (causal) the diagonal blocks masked by one compare, the
online softmax in base 2, every size a multiple of its block.  Flags
(constexpr):

* ``S``: the strides as run-time arguments (multiples of 16, as Triton's
  launcher specialises them) instead of compile-time products;
* ``G``: the empty-row guards of ours (``m == -inf`` shifted by 0, an empty
  row's ``l`` and ``lse``) in every block;
* ``E``: the ``lse`` written too (the forward of a training step).

Each variant and our plan's kernel at the same tiles, per shape, with the
maximum difference from our output.  ``python -m bench.probes.fwd_bisect``;
``FWD_BISECT_SHAPE="i j"`` runs those shapes of ``SHAPES``.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from bench.probes.dkdv_bisect import row_strides
from bench.probes.dkdv_runs import forward_case, retiled
from core_triton.common.kernel_helpers import dot
from core_triton.common.launch import run_steps
from torch_api._launch import launch

LOG2E = tl.constexpr(1.4426950408889634)
SHAPES = (
    # (B, T, HQ, H, causal)
    (1, 4096, 32, 4, True),
    (4, 8192, 16, 16, True),
    (4, 8192, 16, 16, False),
    (16, 2048, 16, 16, True),
)
TILES = ((64, 64, 4, 4), (128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 3))
D = 64


@triton.jit
def _blocks(state, q, K_h, V_h, offs_m, lo, hi, sk, qk_scale,
            D: tl.constexpr, BN: tl.constexpr, MASK: tl.constexpr, G: tl.constexpr):  # fmt: skip
    """Key blocks ``lo, lo + BN, ... < hi`` into the online softmax ``state
    = (acc, m, l)``; ``MASK``: the causal compare."""
    acc, m_i, l_i = state
    offs_d = tl.arange(0, D)
    for start in range(lo, hi, BN):
        offs_n = start + tl.arange(0, BN)
        k = tl.load(K_h + offs_n[:, None] * sk + offs_d[None, :])
        s = dot(q, tl.trans(k), None) * qk_scale
        if MASK:
            s = tl.where(offs_n[None, :] <= offs_m[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if G:
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V_h + offs_n[:, None] * sk + offs_d[None, :])
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, None)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _plain_fwd(
    Q, K, V, OUT, LSE, T, stride_qt, stride_kt, scale,
    HQ: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
    CAUSAL: tl.constexpr, S: tl.constexpr, G: tl.constexpr, E: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HQ
    hq = pid_bh % HQ
    h = hq // (HQ // H)
    sq, sk = row_strides(stride_qt, stride_kt, HQ, H, D, S)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + (b * T + offs_m[:, None]) * sq + hq * D + offs_d[None, :])
    K_h = K + b * T * sk + h * D
    V_h = V + b * T * sk + h * D
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    qk_scale = scale * LOG2E
    # Key blocks wholly below the block's first query are fully visible.
    full_end = (pid_m * BM // BN) * BN if CAUSAL else T
    state = (acc, m_i, l_i)
    state = _blocks(state, q, K_h, V_h, offs_m, 0, full_end, sk, qk_scale, D, BN, False, G)
    if CAUSAL:
        state = _blocks(state, q, K_h, V_h, offs_m, full_end, pid_m * BM + BM, sk, qk_scale, D, BN, True, G)
    acc, m_i, l_i = state
    if G:
        empty = l_i == 0.0
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
    else:
        out = acc / l_i[:, None]
    tl.store(OUT + (b * T + offs_m[:, None]) * sq + hq * D + offs_d[None, :], out.to(OUT.dtype.element_ty))
    if E:
        lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
        if G:
            lse = tl.where(l_i == 0.0, float("-inf"), lse)
        tl.store(LSE + (b * HQ + hq) * T + offs_m, lse)


def _variants():
    return ["", "S", "G", "E", "SGE"]


def main():
    shapes = SHAPES
    if "FWD_BISECT_SHAPE" in os.environ:
        shapes = tuple(SHAPES[int(i)] for i in os.environ["FWD_BISECT_SHAPE"].split())
    print("| shape | tile | variant | us | max diff vs ours |\n|---|---|---|---|---|")
    for B, T, HQ, H, causal in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        plans, inputs = forward_case(B, T, HQ, H, D, causal, g)
        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        main_plan, rest = plans.forward[0], plans.forward[1:]
        ref, _ = run_steps(plans.forward, inputs, launch)
        c = main_plan.constexprs
        mine = (c["BM"], c["BN"], main_plan.num_warps, main_plan.num_stages)
        shape = f"B{B} T{T} {HQ}:{H} {'causal' if causal else 'full'}"
        for tiles in (mine, *(t for t in TILES if t != mine)):
            bm, bn, w, s = tiles
            name = f"{bm}x{bn}/{w}w/{s}s" + (" (plan)" if tiles == mine else "")
            plan = retiled(main_plan, tiles, T, "BM")
            try:
                got, _ = run_steps((plan, *rest), inputs, launch)
                diff = (got.float() - ref.float()).abs().max().item()
                timed = functools.partial(launch, plan, inputs)
                us = triton.testing.do_bench(timed, warmup=25, rep=200) * 1e3
                print(f"| {shape} | {name} | ours | {us:.1f} | {diff:.1e} |", flush=True)
            except Exception as e:  # a tile's failure must not hide the others
                print(f"| {shape} | {name} | ours | error {type(e).__name__}: {str(e)[:100]} | |", flush=True)
            for flags in _variants():
                out = torch.full_like(q, float("nan"))
                lse = torch.full((B, HQ, T), float("nan"), device="cuda")
                fl = {f: int(f in flags) for f in "SGE"}
                args = (q, k, v, out, lse, T, HQ * D, H * D, D**-0.5, HQ, H, D, bm, bn, causal)

                def run(args=args, grid=(T // bm, B * HQ), w=w, s=s, fl=fl):
                    _plain_fwd[grid](*args, **fl, num_warps=w, num_stages=s)

                try:
                    run()
                    torch.cuda.synchronize()
                    diff = (out.float() - ref.float()).abs().max().item()
                    us = triton.testing.do_bench(run, warmup=25, rep=200) * 1e3
                    row = f"{us:.1f} | {diff:.1e}"
                except Exception as e:  # a variant's failure must not hide the others
                    row = f"error {type(e).__name__}: {str(e)[:100]} |"
                print(f"| {shape} | {name} | plain+{flags or '-'} | {row} |", flush=True)


if __name__ == "__main__":
    main()
