"""Forward inter-chunk state pass of ``chunk_linear_attn``.

One program per (K tile, V tile, sequence x state head) walks its
sequence's chunks in visiting order (last to first with ``REVERSE``),
stores the state entering each chunk and carries it on:

    h[slot(c)] = S                                   (state entering chunk c)
    S = exp(b_tot) S + (k * exp(b_tot - b)[:, None])^T v

Inputs: ``k [B*T, H, K]``, ``v [B*T, H, V]``, ``gc [B*T, H]`` float32,
``g_gamma [H]``, ``h0 [N, H, K, V]``, ``cu_seqlens [N+1]``,
``chunk_offsets [N+1]`` (see _chunk_la_common).  Outputs: ``h [slots, H, K,
V]`` (float32, or the inputs' half dtype: the output and backward kernels
multiply it on the tensor cores in that dtype), ``final [N, H, K, V]``
float32, the state after the last chunk.
"""

import triton.language as tl

from core_triton.common.runtime import jit
from core_triton.common.sequences import sequence_chunks
from core_triton.linear_attn.chunk_common import chunk_gates, update_dot


@jit(sizes=("T", "NT", "NS"))
def chunk_state_kernel(
    k,
    v,
    gc,
    g_gamma,
    h0,
    cu_seqlens,
    chunk_offsets,
    T,
    NT,
    NS,
    h,
    final,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    USE_G: tl.constexpr,
    USE_GAMMA: tl.constexpr,
    USE_H0: tl.constexpr,
    REVERSE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
    STATE_F32: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    i_k = tl.program_id(0)
    i_v = tl.program_id(1)
    i_nh = tl.program_id(2)
    i_n = i_nh // H
    i_h = i_nh % H
    bos, eos, slot0, n_chunks = sequence_chunks(cu_seqlens, chunk_offsets, i_n, T, NT, NS, BT, IS_VARLEN)
    n_chunks = n_chunks.to(tl.int32)

    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    off_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    state_row = (i_n.to(tl.int64) * H + i_h) * K * V

    state = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        state += tl.load(h0 + state_row + off_kv, mask=m_kv, other=0).to(tl.float32)

    for it in range(0, n_chunks):
        if REVERSE:
            c = n_chunks - 1 - it
        else:
            c = it
        ts = bos + c * BT
        te = tl.minimum(ts + BT, eos)
        slot = slot0 + c
        tl.store(h + (slot * H + i_h) * K * V + off_kv, state.to(h.dtype.element_ty), mask=m_kv)

        o_t = ts + tl.arange(0, BT).to(tl.int64)
        m_t = o_t < te
        b, b_tot = chunk_gates(gc, g_gamma, i_h, o_t, m_t, ts, te, H, BT, USE_G, USE_GAMMA, REVERSE)
        # k^T loaded directly as [BK, BT] (no transpose of a product).
        b_kt = tl.load(
            k + (o_t[None, :] * H + i_h) * K + o_k[:, None],
            mask=(o_k < K)[:, None] & m_t[None, :],
            other=0,
        )
        b_v = tl.load(
            v + (o_t[:, None] * H + i_h) * V + o_v[None, :], mask=m_t[:, None] & (o_v < V)[None, :], other=0
        )
        # Decay of each token's contribution to the end of the chunk; the
        # where() keeps rows past the chunk from overflowing exp.
        w = tl.where(m_t, tl.exp(b_tot - b), 0.0)
        state = state * tl.exp(b_tot) + update_dot(b_kt * w[None, :], b_v, PREC, STATE_F32)

    tl.store(final + state_row + off_kv, state, mask=m_kv)
