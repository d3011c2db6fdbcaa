"""Forward of the chunk-parallel gated delta rule after the per-chunk
matrices: the inter-chunk state walk and the outputs in one pass.

One program per (V tile, sequence x value head) walks its sequence's
chunks in order, with the float32 state ``S [K, BV]`` (all of K) in
registers.  For each chunk, from the state ``S`` entering it:

    U = Uv - W S                                    (the chunk's delta updates)
    o = scale * ((q * exp(b)) S + P U)              (its outputs)
    S = exp(b_last) S + Kd^T U                      (b_last: the chunk's last token)

so the forward never writes the per-chunk states ``h`` or the updates
``U``: at B4 T4k HV32 K=V=128 those were 0.54 GB of float32 states and
0.27 GB of updates, written by the walk and read back by a separate output
kernel (the backward, which needs them, runs chunk_fwd_state.py).  The
products keep the precisions of that pair of kernels: ``W S`` in W's dtype
(the inputs' for half inputs), ``q S`` and ``P U`` with the float32 state
and updates (tf32 on the tensor cores for half inputs; rounding either to
the inputs' dtype took the half-precision test's output error from 0.9e-2
to 1.5e-2 of its scale).

With ``WU_HERE`` (scalar or no gates) the walk reads no ``W``, ``Uv``:
since ``W = Tinv diag(beta) (k * exp(b))`` and ``Uv = Tinv diag(beta) v``,

    U = Tinv (beta * (v - exp(b) * (k S)))

one more ``[BT, BT]`` product per chunk in place of the launch that
stored ``W`` and ``Uv`` (their 32 KB a chunk and head in bf16 at K = V =
128, written then read back once per value tile).  ``k S`` is in k's
dtype as ``W S`` was in W's, ``Tinv (...)`` with float32 operands.

``P`` (the decayed scores, chunk_intra.py) is read from ``aqk`` (always for
per-channel gates), or formed here from ``q k^T`` for scalar (or no) gates
without ``P_FROM_AQK``.  Value head ``h`` reads query/key head ``h // (HV
// HK)``.  Inputs: ``q, k [B*T, HK, K]``, ``kd, w [B*T, HV, K]``, ``uv,
v [B*T, HV, V]``, ``beta [B*T, HV]``, ``tinv, aqk [B*T, HV, BT]``,
``gc``, ``h0 [N, HV, K, V]`` (``kd``, ``w``, ``uv`` unread with
``WU_HERE``, ``v``, ``beta``, ``tinv`` without).  With ``Q_DECAYED``
(per-channel gates, chunk.WALK_READS_QD) ``q`` is ``Qd = q * exp(b)
[B*T, HV, K]`` from chunk_fwd_wu.py, and of ``gc`` only each chunk's last
row is read.  Packed input: ``cu_seqlens``, ``chunk_offsets``,
``seq_order`` (chunk_common.state_tile).
Outputs: ``o [B*T, HV, V]`` (the inputs' dtype), ``final [N, HV, K, V]``
(float32).
"""

import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.delta_rule.chunk_common import rows_tile, rows_tile_t, state_tile


@jit(sizes=("T", "NT", "NS"))
def delta_chunk_fwd_walk_kernel(
    q,
    k,
    kd,
    w,
    uv,
    v,
    beta,
    tinv,
    gc,
    aqk,
    h0,
    cu_seqlens,
    chunk_offsets,
    seq_order,
    scale,
    T,
    NT,
    NS,
    o,
    final,
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
    P_FROM_AQK: tl.constexpr,
    WU_HERE: tl.constexpr,
    WIDE: tl.constexpr = False,
    Q_DECAYED: tl.constexpr = False,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    FROM_AQK: tl.constexpr = GATE == 2 or P_FROM_AQK
    # Scalar (or no) gates: k^T (exp(b_last - b) U) in place of Kd^T U.
    FROM_K: tl.constexpr = GATE != 2
    i_h, bos, eos, slot0, n_chunks, o_k, o_v, m_k, m_v, m_kv, off_kv, state_row = state_tile(
        cu_seqlens, chunk_offsets, seq_order, T, NT, NS, HV, K, V, BT, BK, BV, IS_VARLEN
    )
    i_hk = i_h // (HV // HK)
    o_tt = tl.arange(0, BT)
    causal = o_tt[None, :] <= o_tt[:, None]

    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + state_row + off_kv, mask=m_kv, other=0).to(tl.float32)
    for c in range(0, n_chunks):
        ts = bos + c * BT
        te = tl.minimum(ts + BT, eos)
        o_t = ts + o_tt
        m_t = o_t < te
        m_tv = m_t[:, None] & m_v[None, :]
        keep = m_t[:, None] & causal
        last = te - 1
        if GATE == 1:
            b_g = tl.load(gc + o_t * HV + i_h, mask=m_t, other=0)
            g_last = tl.load(gc + last * HV + i_h)
        if GATE == 2:
            if not Q_DECAYED:
                b_gk = rows_tile(gc, o_t, m_t, HV, i_h, K, o_k, m_k)
            g_last = tl.load(gc + (last * HV + i_h) * K + o_k, mask=m_k, other=0)
        if WU_HERE:
            # U = Tinv (beta (v - exp(b) k S)): W S and Uv from the inputs
            # (scalar or no gates), k S in k's dtype as W S was in W's.
            tl.static_assert(GATE != 2)
            b_k = rows_tile(k, o_t, m_t, HK, i_hk, K, o_k, m_k)
            if WIDE:
                b_ks = dot(b_k.to(tl.float32), S, PREC)
            else:
                b_ks = dot(b_k, S.to(b_k.dtype), PREC)
            if GATE == 1:
                b_ks = b_ks * tl.exp(b_g)[:, None]
            b_beta = tl.load(beta + o_t * HV + i_h, mask=m_t, other=0).to(tl.float32)
            b_x = (rows_tile(v, o_t, m_t, HV, i_h, V, o_v, m_v).to(tl.float32) - b_ks) * b_beta[:, None]
            b_tinv = tl.load(tinv + (o_t[:, None] * HV + i_h) * BT + o_tt[None, :], mask=keep, other=0)
            b_u = dot(b_tinv, b_x, PREC)
        else:
            # U in float32 from W S in W's dtype (module docstring).
            b_w = rows_tile(w, o_t, m_t, HV, i_h, K, o_k, m_k)
            b_uv = rows_tile(uv, o_t, m_t, HV, i_h, V, o_v, m_v)
            b_u = b_uv.to(tl.float32) - dot(b_w, S.to(b_w.dtype), PREC)

        if Q_DECAYED:
            # Qd = q exp(b) from the W/Uv launch (chunk.WALK_READS_QD): no
            # [BT, K] float32 tile of b per chunk and value tile.
            tl.static_assert(GATE == 2)
            acc = dot(rows_tile(q, o_t, m_t, HV, i_h, K, o_k, m_k).to(tl.float32), S, PREC)
        else:
            b_q = rows_tile(q, o_t, m_t, HK, i_hk, K, o_k, m_k)
            b_qs = b_q.to(tl.float32)
            if GATE == 2:
                b_qs = b_qs * tl.exp(b_gk)
            acc = dot(b_qs, S, PREC)
        if GATE == 1:
            acc = acc * tl.exp(b_g)[:, None]
        if not FROM_AQK or FROM_K:
            if WU_HERE:
                b_kt = tl.trans(b_k)  # a loaded tile (never a product's: chunk_common.rows_tile_t)
            else:
                b_kt = rows_tile_t(k, o_t, m_t, HK, i_hk, K, o_k, m_k)
        if FROM_AQK:
            # (float32, or float16: chunk.P_FLOAT16, exact in the tf32 product)
            b_p = tl.load(aqk + (o_t[:, None] * HV + i_h) * BT + o_tt[None, :], mask=keep, other=0)
            b_p = b_p.to(tl.float32)
        else:
            b_p = dot(b_q, b_kt, PREC)
            if GATE == 1:
                b_p = b_p * tl.exp(tl.where(keep, b_g[:, None] - b_g[None, :], float("-inf")))
            else:
                b_p = tl.where(keep, b_p, 0.0)
        out = (acc + dot(b_p, b_u, PREC)) * scale
        tl.store(o + (o_t[:, None] * HV + i_h) * V + o_v[None, :], out.to(o.dtype.element_ty), mask=m_tv)

        if GATE == 1:
            S = S * tl.exp(g_last)
        if GATE == 2:
            S = S * tl.exp(g_last)[:, None]
        if FROM_K:
            if GATE == 1:
                b_u = b_u * tl.exp(tl.where(m_t, g_last - b_g, float("-inf")))[:, None]
            if WIDE:
                S += dot(b_kt.to(tl.float32), b_u, PREC)
            else:
                S += dot(b_kt, b_u.to(b_kt.dtype), PREC)
        else:
            b_kdt = rows_tile_t(kd, o_t, m_t, HV, i_h, K, o_k, m_k)
            S += dot(b_kdt, b_u.to(b_kdt.dtype), PREC)
    tl.store(final + state_row + off_kv, S, mask=m_kv)
