"""Small kernels on softmax statistics that both bindings need: the sinks'
gradient (flash and ring attention), and the ring's log-sum-exp merge of
partial results and its one-time sink add.

Layouts (contiguous, float32 where not said): ``lse``, ``delta`` ``[B, HQ,
T]``; ring partial outputs ``[B, T, HQ, DV]``; sinks ``[HQ]`` or ``[HQ, S]``
in their own dtype.  Every sum runs in one fixed order, so both bindings
get the same bits.  Lengths and batch sizes are run-time sizes.
"""

from __future__ import annotations

import functools

import triton.language as tl

from core_triton.common.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.common.runtime import jit
from core_triton.common.utils import cdiv, next_power_of_2, prod

_BT = 128


@jit(sizes=("B", "T"))
def sink_grad_kernel(
    sink, lse, delta, B, T, out, HQ: tl.constexpr, S: tl.constexpr, BS: tl.constexpr, BT: tl.constexpr
):
    """``dsink[h, s] = -sum_{b,i} exp(sink[h, s] - lse[b, h, i]) delta[b, h, i]``;
    a ``-inf`` sink gets 0 (its probability is 0, also where ``lse`` is
    ``-inf``: a row with no allowed key and no finite sink)."""
    h = tl.program_id(0)
    o_s = tl.arange(0, BS)
    m_s = o_s < S
    s = tl.load(sink + h * S + o_s, mask=m_s, other=float("-inf")).to(tl.float32)
    live = s != float("-inf")
    acc = tl.zeros([BS, BT], dtype=tl.float32)
    for b in range(0, B):
        base = (b * HQ + h).to(tl.int64) * T
        for t0 in range(0, T, BT):
            o_t = t0 + tl.arange(0, BT)
            m_t = o_t < T
            lv = tl.load(lse + base + o_t, mask=m_t, other=0.0)
            dv = tl.load(delta + base + o_t, mask=m_t, other=0.0)
            p = tl.exp(s[:, None] - lv[None, :])
            acc += tl.where(live[:, None] & m_t[None, :], p * dv[None, :], 0.0)
    tl.store(out + h * S + o_s, (-tl.sum(acc, axis=1)).to(out.dtype.element_ty), mask=m_s)


@functools.lru_cache(maxsize=256)
def sink_grad_plan(sink: TensorInfo, lse_shape: tuple[int, ...]) -> LaunchPlan:
    """The sinks' gradient (``dsink``, the sinks' shape and dtype) from
    inputs ``softmax_aux``, ``lse`` and ``delta`` (``lse_shape = (B, HQ, T)``)."""
    B, HQ, T = lse_shape
    S = prod(sink.shape[1:])
    return LaunchPlan(
        kernel=sink_grad_kernel,
        grid=(HQ,),
        params=(In("softmax_aux"), In("lse"), In("delta"), B, T),
        outputs=(OutputSpec(tuple(sink.shape), sink.dtype),),
        output_names=("dsink",),
        constexprs=dict(HQ=HQ, S=S, BS=max(next_power_of_2(S), 2), BT=_BT),
        num_warps=4,
        num_stages=1,
    )


@jit(sizes=("T",))
def ring_merge_kernel(
    out,
    lse,
    out_b,
    lse_b,
    T,
    new_out,
    new_lse,
    HQ: tl.constexpr,
    DV: tl.constexpr,
    BT: tl.constexpr,
    BD: tl.constexpr,
):
    """``lse' = logaddexp(lse, lse_b)``, ``out' = out - w * (out - out_b)``
    with ``w = exp(lse_b - lse')`` (0 where ``lse_b = -inf``: an empty side
    adds nothing; ``lse' = -inf`` stays so)."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    b = i_bh // HQ
    h = i_bh % HQ
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    row = i_bh.to(tl.int64) * T + o_t
    la = tl.load(lse + row, mask=m_t, other=float("-inf"))
    lb = tl.load(lse_b + row, mask=m_t, other=float("-inf"))
    hi = tl.maximum(la, lb)
    hi_safe = tl.where(hi == float("-inf"), 0.0, hi)
    new = tl.where(hi == float("-inf"), hi, hi_safe + tl.log(tl.exp(la - hi_safe) + tl.exp(lb - hi_safe)))
    w = tl.where(lb == float("-inf"), 0.0, tl.exp(lb - tl.where(new == float("-inf"), 0.0, new)))
    tl.store(new_lse + row, new, mask=m_t)
    o_d = tl.arange(0, BD)
    m = m_t[:, None] & (o_d < DV)[None, :]
    off = ((b.to(tl.int64) * T + o_t) * HQ + h)[:, None] * DV + o_d[None, :]
    oa = tl.load(out + off, mask=m, other=0.0)
    ob = tl.load(out_b + off, mask=m, other=0.0)
    tl.store(new_out + off, oa - w[:, None] * (oa - ob), mask=m)


@jit(sizes=("T",))
def ring_sinks_kernel(
    out,
    lse,
    sink,
    T,
    new_out,
    new_lse,
    HQ: tl.constexpr,
    S: tl.constexpr,
    DV: tl.constexpr,
    BS: tl.constexpr,
    BT: tl.constexpr,
    BD: tl.constexpr,
):
    """Let the sinks join the normaliser once: ``lse' = logaddexp(lse,
    logsumexp(sink[h]))``, ``out' = out * exp(lse - lse')``.  An empty row
    (``lse = -inf``, output 0) stays 0, also when every sink is ``-inf``."""
    i_t = tl.program_id(0)
    i_bh = tl.program_id(1)
    b = i_bh // HQ
    h = i_bh % HQ
    o_s = tl.arange(0, BS)
    s = tl.load(sink + h * S + o_s, mask=o_s < S, other=float("-inf")).to(tl.float32)
    s_hi = tl.max(s, axis=0)
    s_safe = tl.where(s_hi == float("-inf"), 0.0, s_hi)
    s_lse = tl.where(s_hi == float("-inf"), s_hi, s_safe + tl.log(tl.sum(tl.exp(s - s_safe), axis=0)))
    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < T
    row = i_bh.to(tl.int64) * T + o_t
    la = tl.load(lse + row, mask=m_t, other=float("-inf"))
    hi = tl.maximum(la, s_lse)
    hi_safe = tl.where(hi == float("-inf"), 0.0, hi)
    new = tl.where(hi == float("-inf"), hi, hi_safe + tl.log(tl.exp(la - hi_safe) + tl.exp(s_lse - hi_safe)))
    scale = tl.where(la == float("-inf"), 0.0, tl.exp(la - new))
    tl.store(new_lse + row, new, mask=m_t)
    o_d = tl.arange(0, BD)
    m = m_t[:, None] & (o_d < DV)[None, :]
    off = ((b.to(tl.int64) * T + o_t) * HQ + h)[:, None] * DV + o_d[None, :]
    tl.store(new_out + off, tl.load(out + off, mask=m, other=0.0) * scale[:, None], mask=m)


def _row_tiles(B: int, T: int, HQ: int, DV: int) -> tuple[int, int, tuple[int, int]]:
    bd = max(next_power_of_2(DV), 16)
    bt = max(16, min(64, 8192 // bd))
    return bt, bd, (cdiv(T, bt), B * HQ)


@functools.lru_cache(maxsize=256)
def ring_merge_plan(B: int, T: int, HQ: int, DV: int) -> LaunchPlan:
    """Merge a step's partial result (inputs ``out_b``, ``lse_b``) into the
    running one (``out``, ``lse``); outputs named ``out``, ``lse``."""
    bt, bd, grid = _row_tiles(B, T, HQ, DV)
    return LaunchPlan(
        kernel=ring_merge_kernel,
        grid=grid,
        params=(In("out"), In("lse"), In("out_b"), In("lse_b"), T),
        outputs=(OutputSpec((B, T, HQ, DV), "float32"), OutputSpec((B, HQ, T), "float32")),
        output_names=("out", "lse"),
        constexprs=dict(HQ=HQ, DV=DV, BT=bt, BD=bd),
        num_warps=4,
        num_stages=1,
    )


@functools.lru_cache(maxsize=256)
def ring_sinks_plan(B: int, T: int, HQ: int, DV: int, sink: TensorInfo) -> LaunchPlan:
    """Add the sinks (input ``softmax_aux``) to the merged ``out``, ``lse``;
    outputs named ``out``, ``lse``."""
    bt, bd, grid = _row_tiles(B, T, HQ, DV)
    S = prod(sink.shape[1:])
    return LaunchPlan(
        kernel=ring_sinks_kernel,
        grid=grid,
        params=(In("out"), In("lse"), In("softmax_aux"), T),
        outputs=(OutputSpec((B, T, HQ, DV), "float32"), OutputSpec((B, HQ, T), "float32")),
        output_names=("out", "lse"),
        constexprs=dict(HQ=HQ, S=S, DV=DV, BS=max(next_power_of_2(S), 2), BT=bt, BD=bd),
        num_warps=4,
        num_stages=1,
    )
