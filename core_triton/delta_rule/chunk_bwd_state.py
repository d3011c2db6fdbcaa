"""Backward inter-chunk state pass of the chunk-parallel gated delta rule.

From the forward (chunk_fwd_state.py, chunk_fwd_walk.py), per chunk with
``S`` entering it: ``U = Uv - W S``, ``o = scale ((q * exp(b)) S + P U)``,
``S' = exp(b_last) S + Kd^T U`` with ``Kd = k * exp(b_last - b)``.  With
``dS'`` the gradient of the state leaving the chunk, carried last chunk
first from the final state's cotangent ``dht``:

    dh[slot(c)] = dS'
    dU = scale P^T do + Kd dS'
    dS = exp(b_last) dS' + scale (q * exp(b))^T do - W^T dU

and ``dS`` after the first chunk is the initial state's gradient.

One program per (V tile, sequence x value head), all of K in one or two
pieces of ``BK`` rows (``dS'`` as two ``[BK, BV]`` halves: smaller
products, fewer registers live at once).  Inputs: ``q``
(with ``Q_DECAYED``, per-channel gates: ``Qd = q exp(b)`` from
chunk_fwd_wu.py, ``[B*T, HV, K]``), ``kd``, ``w`` (chunk_fwd_wu.py),
``gc``, ``aqk``, ``do [B*T, HV, V]``, ``dht``, ``cu_seqlens``,
``chunk_offsets``, ``seq_order`` (chunk_common.state_tile).  Outputs:
``dh [slots, HV, K, V]``, ``du [B*T, HV, V]`` float32 and ``dh0 [N, HV,
K, V]``.
"""

import triton
import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.delta_rule.chunk_common import rows_tile, rows_tile_t, state_tile


@jit(sizes=("T", "NT", "NS"))
def delta_chunk_bwd_state_kernel(
    q,
    kd,
    w,
    gc,
    aqk,
    do,
    dht,
    cu_seqlens,
    chunk_offsets,
    seq_order,
    scale,
    T,
    NT,
    NS,
    dh,
    du,
    dh0,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GATE: tl.constexpr,
    USE_H0: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
    Q_DECAYED: tl.constexpr = False,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    TWO: tl.constexpr = K > BK  # (the plan makes 2 BK >= K)
    i_h, bos, eos, slot0, n_chunks, o_k, o_v, m_k, m_v, m_kv, off_kv, state_row = state_tile(
        cu_seqlens, chunk_offsets, seq_order, T, NT, NS, HV, K, V, BT, BK, BV, IS_VARLEN
    )
    i_hk = i_h // (HV // HK)
    o_tt = tl.arange(0, BT)
    # The second piece of K: rows BK.. of the state.
    o_k2 = o_k + BK
    m_k2 = o_k2 < K
    m_kv2 = m_k2[:, None] & m_v[None, :]
    off_kv2 = off_kv + BK * V

    dS = tl.load(dht + state_row + off_kv, mask=m_kv, other=0).to(tl.float32)
    dS2 = tl.zeros([BK, BV], dtype=tl.float32)
    if TWO:
        dS2 += tl.load(dht + state_row + off_kv2, mask=m_kv2, other=0).to(tl.float32)
    for it in range(0, n_chunks):
        c = n_chunks - 1 - it
        ts = bos + c * BT
        te = tl.minimum(ts + BT, eos)
        p_dh = dh + ((slot0 + c) * HV + i_h) * K * V
        tl.store(p_dh + off_kv, dS, mask=m_kv)
        if TWO:
            tl.store(p_dh + off_kv2, dS2, mask=m_kv2)
        o_t = ts + o_tt
        m_t = o_t < te
        last = te - 1
        # P^T loaded as such: element (j, i) = P[i, j], i >= j (float32, or
        # float16: chunk.P_FLOAT16, exact in the tf32 product).
        b_pt = tl.load(
            aqk + (o_t[None, :] * HV + i_h) * BT + o_tt[:, None],
            mask=m_t[None, :] & (o_tt[:, None] <= o_tt[None, :]),
            other=0,
        ).to(tl.float32)
        b_do = rows_tile(do, o_t, m_t, HV, i_h, V, o_v, m_v)
        b_du = dot(b_pt, b_do.to(tl.float32), PREC) * scale
        b_du += _keys_times(kd, dS, o_t, m_t, HV, i_h, K, o_k, m_k, PREC)
        if TWO:
            b_du += _keys_times(kd, dS2, o_t, m_t, HV, i_h, K, o_k2, m_k2, PREC)
        tl.store(du + (o_t[:, None] * HV + i_h) * V + o_v[None, :], b_du, mask=m_t[:, None] & m_v[None, :])
        dS = _carried_back(
            dS, q, w, gc, b_do, b_du, o_t, m_t, last, scale, i_h, i_hk, HK, HV, K, BK, o_k, m_k, GATE,
            Q_DECAYED, PREC,
        )  # fmt: skip
        if TWO:
            dS2 = _carried_back(
                dS2, q, w, gc, b_do, b_du, o_t, m_t, last, scale, i_h, i_hk, HK, HV, K, BK, o_k2, m_k2, GATE,
                Q_DECAYED, PREC,
            )  # fmt: skip
    if USE_H0:
        tl.store(dh0 + state_row + off_kv, dS.to(dh0.dtype.element_ty), mask=m_kv)
        if TWO:
            tl.store(dh0 + state_row + off_kv2, dS2.to(dh0.dtype.element_ty), mask=m_kv2)


@triton.jit
def _keys_times(kd, dS, o_t, m_t, HV: tl.constexpr, i_h, K: tl.constexpr, o_k, m_k, PREC: tl.constexpr):
    """``Kd dS'`` over one piece of K (rows ``o_k``): ``[BT, BV]``."""
    b_kd = rows_tile(kd, o_t, m_t, HV, i_h, K, o_k, m_k).to(tl.float32)
    return dot(b_kd, dS, PREC)


@triton.jit
def _carried_back(dS, q, w, gc, b_do, b_du, o_t, m_t, last, scale, i_h, i_hk, HK: tl.constexpr,
                  HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, o_k, m_k, GATE: tl.constexpr,
                  Q_DECAYED: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """One piece of K (rows ``o_k``) of ``dS = exp(b_last) dS' + scale (q *
    exp(b))^T do - W^T dU``, the state's gradient entering the chunk."""
    # q (or Qd) stays in its dtype where no decay multiplies it: a half
    # tile times do is then one native product (exact, as in tf32).
    if Q_DECAYED:
        # (in do's dtype: a float16 Qd, chunk.WALK_READS_QD, beside bf16 do)
        b_qt = rows_tile_t(q, o_t, m_t, HV, i_h, K, o_k, m_k).to(b_do.dtype)
    else:
        b_qt = rows_tile_t(q, o_t, m_t, HK, i_hk, K, o_k, m_k)
    decay_last = tl.zeros([BK], dtype=tl.float32) + 1.0
    if GATE == 1:
        b_qt = b_qt.to(tl.float32) * tl.exp(tl.load(gc + o_t * HV + i_h, mask=m_t, other=0))[None, :]
        decay_last = decay_last * tl.exp(tl.load(gc + last * HV + i_h))
    if GATE == 2:
        if not Q_DECAYED:
            b_qt = b_qt.to(tl.float32) * tl.exp(rows_tile_t(gc, o_t, m_t, HV, i_h, K, o_k, m_k))
        decay_last = tl.exp(tl.load(gc + (last * HV + i_h) * K + o_k, mask=m_k, other=0))
    b_wt = rows_tile_t(w, o_t, m_t, HV, i_h, K, o_k, m_k).to(tl.float32)
    return dS * decay_last[:, None] + dot(b_qt, b_do.to(b_qt.dtype), PREC) * scale - dot(b_wt, b_du, PREC)
