"""Forward inter-chunk state pass of the chunk-parallel gated delta rule.

One program per (V tile, sequence x value head) walks its sequence's
chunks in order, with the float32 state ``S [K, BV]`` (all of K):

    h[slot(c)] = S                                  (state entering chunk c)
    U = Uv - W S                                    (the chunk's delta updates)
    S = exp(b_last) S + Kd^T U                      (b_last: the chunk's last token)

Inputs: ``kd``, ``w [B*T, HV, K]``, ``uv [B*T, HV, V]`` (chunk_intra.py),
``gc``, ``h0 [N, HV, K, V]``, ``cu_seqlens``, ``chunk_offsets``,
``seq_order`` (chunk_common.state_tile).  Outputs:
``h [slots, HV, K, V]``, ``u [B*T, HV, V]`` (in the dtype of ``w``: the
inputs' for half inputs, chunk.py) and ``final [N, HV, K, V]`` (float32).
The backward runs it (rather than keep ``h`` and ``u`` from the
forward); the forward runs it only beyond K = 128, where
chunk_fwd_output.py then forms the outputs (chunk_fwd_walk.py does both
in one pass up to K = 128).
"""

import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.delta_rule.chunk_common import rows_tile, rows_tile_t, state_tile


@jit(sizes=("T", "NT", "NS"))
def delta_chunk_fwd_state_kernel(
    kd,
    w,
    uv,
    gc,
    h0,
    cu_seqlens,
    chunk_offsets,
    seq_order,
    T,
    NT,
    NS,
    h,
    u,
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
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    i_h, bos, eos, slot0, n_chunks, o_k, o_v, m_k, m_v, m_kv, off_kv, state_row = state_tile(
        cu_seqlens, chunk_offsets, seq_order, T, NT, NS, HV, K, V, BT, BK, BV, IS_VARLEN
    )

    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + state_row + off_kv, mask=m_kv, other=0).to(tl.float32)
    for c in range(0, n_chunks):
        ts = bos + c * BT
        te = tl.minimum(ts + BT, eos)
        tl.store(h + ((slot0 + c) * HV + i_h) * K * V + off_kv, S, mask=m_kv)
        o_t = ts + tl.arange(0, BT)
        m_t = o_t < te
        b_w = rows_tile(w, o_t, m_t, HV, i_h, K, o_k, m_k)
        # W S in W's dtype (the inputs' for half inputs: chunk.py), U in float32.
        b_u = rows_tile(uv, o_t, m_t, HV, i_h, V, o_v, m_v).to(tl.float32) - dot(b_w, S.to(b_w.dtype), PREC)
        tl.store(u + (o_t[:, None] * HV + i_h) * V + o_v[None, :], b_u, mask=m_t[:, None] & m_v[None, :])
        b_kdt = rows_tile_t(kd, o_t, m_t, HV, i_h, K, o_k, m_k)
        last = te - 1
        if GATE == 1:
            S = S * tl.exp(tl.load(gc + last * HV + i_h))
        if GATE == 2:
            S = S * tl.exp(tl.load(gc + (last * HV + i_h) * K + o_k, mask=m_k, other=0))[:, None]
        S += dot(b_kdt, b_u.to(b_kdt.dtype), PREC)
    tl.store(final + state_row + off_kv, S, mask=m_kv)
