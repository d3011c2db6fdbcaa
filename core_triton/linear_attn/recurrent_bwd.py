"""Backward kernel of the recurrent linear attention.

Same programs as the forward (one state head of one sequence, all ``K``
rows, a tile of ``BV`` value columns), in two passes over the sequence, so
that no per-token state is ever stored:

1. In visiting order, recompute the state ``S_t`` and write
   ``dq[t, j] = scale * S_t @ do[t, j]`` (partial over value tiles), and for
   ``gv`` the term ``sum_j o[t, j] * do[t, j]`` (``o`` recomputed from
   ``S_t``) into ``dgv`` as scratch.
2. In the opposite order, carry ``dS`` (starting at ``d_final_state``)::

       dS += scale * sum_j outer(q[t, j], do[t, j])
       dk[t] = dS @ v[t]   (partial over value tiles)    dv[t] = dS^T k[t]
       dS *= decay(t)

   and ``dS`` after the first visited token is ``d_initial_state``.

Gate gradients without the states: with ``M_t = dS_t * (S_t - k_t v_t^T)``
the gradient of token ``t``'s log-decay, its row sums obey
``rowsum(M_t) = sum_{s visited at or after t} (q_s * dq_s - k_s * dk_s)
+ rowsum(S_last * dS_last)`` (column sums likewise with ``o * do - v * dv``),
so each is a running sum carried in pass 2, started from the final state
that pass 1 leaves in registers.  ``dg_gamma`` sums ``dg`` over every token.

Partial results (over the ``NV`` value tiles) are float32 ``[NV, ...]``
buffers that a reduction launch sums and casts; ``dv``, ``dgv`` and
``d_initial_state`` are complete in one program.
"""

import triton.language as tl

from core_triton.common.runtime import jit
from core_triton.common.sequences import sequence_bounds
from core_triton.linear_attn.recurrent_fwd import decay_state


@jit(
    sizes=(
        "T",
        "ROWS",
    )
)
def recurrent_bwd_kernel(
    q,
    k,
    v,
    g,
    g_gamma,
    gk,
    gv,
    h0,
    do,
    dht,
    cu_seqlens,
    T,
    ROWS,
    scale,
    dq,
    dk,
    dv,
    dg,
    dgk,
    dgv,
    dgamma,
    dh0,
    H: tl.constexpr,
    G: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_G: tl.constexpr,
    USE_G_GAMMA: tl.constexpr,
    USE_GK: tl.constexpr,
    USE_GV: tl.constexpr,
    USE_H0: tl.constexpr,
    REVERSE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    NV = tl.num_programs(0)
    i_n = i_nh // H
    i_h = i_nh % H
    HQ: tl.constexpr = H * G
    K_TERMS: tl.constexpr = USE_G or USE_G_GAMMA or USE_GK
    bos, eos = sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN)
    # This program's slice of the [NV, B*T, ...] partial buffers.
    tile_rows = i_v.to(tl.int64) * ROWS

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    p_state = i_nh.to(tl.int64) * (K * V) + o_k[:, None] * V + o_v[None, :]

    b_gamma = 0.0
    if USE_G_GAMMA:
        b_gamma = tl.load(g_gamma + i_h).to(tl.float32)

    # Pass 1: visiting order, recompute S_t.
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + p_state, mask=m_h, other=0).to(tl.float32)
    for i in range(0, eos - bos):
        if REVERSE:
            row = eos - 1 - i
        else:
            row = bos + i
        b_k = tl.load(k + row * (H * K) + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
        b_v = tl.load(v + row * (H * V) + i_h * V + o_v, mask=m_v, other=0).to(tl.float32)
        b_h = decay_state(
            b_h, g, gk, gv, b_gamma, row, i_h, o_k, o_v, m_k, m_v, H, K, V, USE_G, USE_G_GAMMA, USE_GK, USE_GV
        )
        b_h += b_k[:, None] * b_v[None, :]
        b_od = tl.zeros([BV], dtype=tl.float32)
        for j in tl.static_range(G):
            i_q = i_h * G + j
            b_do = tl.load(do + row * (HQ * V) + i_q * V + o_v, mask=m_v, other=0).to(tl.float32)
            b_dq = tl.sum(b_h * b_do[None, :], axis=1) * scale
            tl.store(dq + (tile_rows + row) * (HQ * K) + i_q * K + o_k, b_dq, mask=m_k)
            if USE_GV:
                b_q = tl.load(q + row * (HQ * K) + i_q * K + o_k, mask=m_k, other=0).to(tl.float32)
                b_od += tl.sum(b_h * (b_q * scale)[:, None], axis=0) * b_do
        if USE_GV:
            tl.store(dgv + row * (H * V) + i_h * V + o_v, b_od, mask=m_v)

    # pass 2 reads back what other threads of this program stored in pass 1.
    tl.debug_barrier()

    # Pass 2: opposite order, carry dS.
    b_dh = tl.load(dht + p_state, mask=m_h, other=0).to(tl.float32)
    b_hdh = b_h * b_dh
    acc_s = tl.sum(tl.sum(b_hdh, axis=1), axis=0)
    acc_k = tl.sum(b_hdh, axis=1)
    acc_v = tl.sum(b_hdh, axis=0)
    total_s = acc_s * 0.0
    for i in range(0, eos - bos):
        if REVERSE:
            row = bos + i
        else:
            row = eos - 1 - i
        b_k = tl.load(k + row * (H * K) + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
        b_v = tl.load(v + row * (H * V) + i_h * V + o_v, mask=m_v, other=0).to(tl.float32)
        b_qdq = tl.zeros([BK], dtype=tl.float32)
        for j in tl.static_range(G):
            i_q = i_h * G + j
            b_q = tl.load(q + row * (HQ * K) + i_q * K + o_k, mask=m_k, other=0).to(tl.float32)
            b_do = tl.load(do + row * (HQ * V) + i_q * V + o_v, mask=m_v, other=0).to(tl.float32)
            b_dh += (b_q * scale)[:, None] * b_do[None, :]
            if K_TERMS:
                b_dq = tl.load(dq + (tile_rows + row) * (HQ * K) + i_q * K + o_k, mask=m_k, other=0)
                b_qdq += b_q * b_dq
        b_dk = tl.sum(b_dh * b_v[None, :], axis=1)
        b_dv = tl.sum(b_dh * b_k[:, None], axis=0)
        tl.store(dk + (tile_rows + row) * (H * K) + i_h * K + o_k, b_dk, mask=m_k)
        tl.store(dv + row * (H * V) + i_h * V + o_v, b_dv.to(dv.dtype.element_ty), mask=m_v)
        if K_TERMS:
            term_k = b_qdq - b_k * b_dk
            if USE_GK:
                acc_k += term_k
                tl.store(dgk + (tile_rows + row) * (H * K) + i_h * K + o_k, acc_k, mask=m_k)
            if USE_G or USE_G_GAMMA:
                acc_s += tl.sum(term_k, axis=0)
                total_s += acc_s
                if USE_G:
                    tl.store(dg + (tile_rows + row) * H + i_h, acc_s)
        if USE_GV:
            p_dgv = dgv + row * (H * V) + i_h * V + o_v
            acc_v += tl.load(p_dgv, mask=m_v, other=0) - b_v * b_dv
            tl.store(p_dgv, acc_v, mask=m_v)
        # dS_{t-1} = dS_t * decay(t), before the token visited next.
        b_dh = decay_state(
            b_dh,
            g,
            gk,
            gv,
            b_gamma,
            row,
            i_h,
            o_k,
            o_v,
            m_k,
            m_v,
            H,
            K,
            V,
            USE_G,
            USE_G_GAMMA,
            USE_GK,
            USE_GV,
        )

    if USE_H0:
        tl.store(dh0 + p_state, b_dh.to(dh0.dtype.element_ty), mask=m_h)
    if USE_G_GAMMA:
        tl.store(dgamma + (i_n.to(tl.int64) * NV + i_v) * H + i_h, total_s)
