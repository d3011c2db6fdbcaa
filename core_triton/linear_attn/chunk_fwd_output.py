"""Forward output of ``chunk_linear_attn``: inter-chunk plus intra-chunk.

One program per (V tile, chunk slot, batch row x query head):

    o = scale * (exp(b)[:, None] * (q @ h[slot]) + (D * (q @ k^T)) @ v)

with ``D`` the in-chunk decay mask (_chunk_la_common.intra_decay) and
``h[slot]`` the state entering the chunk (chunk_state.py).  Query head
``hq`` reads key/value/state head ``hq // (HQ // H)``.

Inputs: ``q [B*T, HQ, K]``, ``k [B*T, H, K]``, ``v [B*T, H, V]``, ``gc``,
``g_gamma``, ``h [slots, H, K, V]``, ``cu_seqlens``, ``chunk_offsets``.
Output: ``o [B*T, HQ, V]`` in the inputs' dtype.
"""

import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.common.sequences import chunk_of_slot
from core_triton.linear_attn.chunk_common import chunk_gates, intra_decay, state_dot


@jit(sizes=("T", "N", "n_iter", "NT", "NS"))
def chunk_output_kernel(
    q,
    k,
    v,
    gc,
    g_gamma,
    h,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    N,
    n_iter,
    NT,
    NS,
    o,
    HQ: tl.constexpr,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    USE_G: tl.constexpr,
    USE_GAMMA: tl.constexpr,
    REVERSE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
    STATE_F32: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    i_v = tl.program_id(0)
    i_s = tl.program_id(1)
    i_bh = tl.program_id(2)
    i_b = i_bh // HQ
    i_hq = i_bh % HQ
    i_h = i_hq // (HQ // H)
    _, _, _, ts, te, slot = chunk_of_slot(
        cu_seqlens, chunk_offsets, i_s, i_b, T, N, n_iter, NT, NS, BT, IS_VARLEN
    )
    if te <= ts:
        return  # a spare slot of packed input: no rows, and its state slot was never written

    o_t = ts + tl.arange(0, BT).to(tl.int64)
    m_t = o_t < te
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    h_base = h + (slot * H + i_h) * K * V

    acc = tl.zeros([BT, BV], dtype=tl.float32)
    scores = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        b_q = tl.load(
            q + (o_t[:, None] * HQ + i_hq) * K + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0
        )
        b_kt = tl.load(
            k + (o_t[None, :] * H + i_h) * K + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0
        )
        b_h = tl.load(
            h_base + o_k[:, None].to(tl.int64) * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0
        )
        acc += state_dot(b_q, b_h, PREC, STATE_F32)
        scores += dot(b_q, b_kt, PREC)

    b, _ = chunk_gates(gc, g_gamma, i_h, o_t, m_t, ts, te, H, BT, USE_G, USE_GAMMA, REVERSE)
    b_v = tl.load(v + (o_t[:, None] * H + i_h) * V + o_v[None, :], mask=m_t[:, None] & m_v[None, :], other=0)
    scores = scores * intra_decay(b, m_t, BT, REVERSE, False)
    out = acc * tl.exp(b)[:, None] + dot(scores.to(b_v.dtype), b_v, PREC)
    out = out * scale
    tl.store(
        o + (o_t[:, None] * HQ + i_hq) * V + o_v[None, :],
        out.to(o.dtype.element_ty),
        mask=m_t[:, None] & m_v[None, :],
    )
