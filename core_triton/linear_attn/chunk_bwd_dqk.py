"""Backward of ``chunk_linear_attn``: query and key gradients, and the
per-token gate quantity the gate gradients are summed from.

One program per (chunk slot, batch row x state head), covering all of K
(``BK >= K``, so the per-token sums over K below need no second pass) and
looping over V tiles.  For each query head of the group, with
``A = do @ v^T`` (``A[i, j] = do_i . v_j``):

    dq = scale * (exp(b)[:, None] * (do @ h[slot]^T) + (D * A) @ k)
    dk += scale * (D^T * A^T) @ q
and once per state head
    dk += exp(b_tot - b)[:, None] * (v @ dh[slot]^T)

Gate gradient.  With ``B_t`` the log decay accumulated from the sequence's
start (reversed: from its end) to token ``t``, the recurrence (docs/api.md#recurrent) reads
``o_t = scale * (q_t e^{B_t}) . sum_j (k_j e^{-B_j}) v_j^T (+ h0 term)``
and ``final = e^{B_last} (...)``, so
``dL/dB_t = sum_group q_t . dq_t - k_t . dk_t`` (plus ``<dht, final>`` at
the last visited token) and ``dg_t`` is the sum of ``dL/dB_s`` over the
tokens ``s`` whose ``B_s`` contains ``g_t``: a suffix sum within the
sequence (prefix sum with ``REVERSE``), done by the foundation's global
cumsum on the ``w`` written here.  ``dg_gamma[h]`` is the sum of ``dg``
over all tokens.

Why no ``tl.trans`` of a product: on Hopper, Triton 3.4 to 3.7.0 miscompile
the transpose of a ``tl.dot`` result in this kernel (flash-linear-attention
issue 640: corrupt dk/dg).  ``A^T`` and ``D^T`` are computed directly from
swapped operands; only loaded tiles are transposed.

Inputs: ``q``, ``k``, ``v``, ``gc``, ``g_gamma``, ``h``, ``do``, ``dh``,
``dht``, ``final`` (forward's final state), ``cu_seqlens``,
``chunk_offsets``.  Outputs: ``dq [B*T, HQ, K]``, ``dk [B*T, H, K]``,
``w [B*T, H]`` float32 (only with ``STORE_W``: a gate that gets a
gradient).
"""

import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit
from core_triton.common.sequences import chunk_of_slot
from core_triton.linear_attn.chunk_common import chunk_gates, intra_decay, state_dot


@jit(sizes=("T", "N", "n_iter", "NT", "NS"))
def chunk_bwd_dqk_kernel(
    q,
    k,
    v,
    gc,
    g_gamma,
    h,
    do,
    dh,
    dht,
    final,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    N,
    n_iter,
    NT,
    NS,
    dq,
    dk,
    w,
    HQ: tl.constexpr,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    USE_G: tl.constexpr,
    USE_GAMMA: tl.constexpr,
    USE_DHT: tl.constexpr,
    REVERSE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    IEEE: tl.constexpr,
    STATE_F32: tl.constexpr,
    STORE_W: tl.constexpr,
    BV: tl.constexpr,
):
    PREC: tl.constexpr = "ieee" if IEEE else None  # dot()'s precision
    GROUP: tl.constexpr = HQ // H
    i_s = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H
    i_n, bos, eos, ts, te, slot = chunk_of_slot(
        cu_seqlens, chunk_offsets, i_s, i_b, T, N, n_iter, NT, NS, BT, IS_VARLEN
    )
    if te <= ts:
        return  # a spare slot of packed input: no rows, and its state slot was never written

    o_t = ts + tl.arange(0, BT).to(tl.int64)
    m_t = o_t < te
    state_off = (slot * H + i_h) * K * V
    b, b_tot = chunk_gates(gc, g_gamma, i_h, o_t, m_t, ts, te, H, BT, USE_G, USE_GAMMA, REVERSE)
    decay = intra_decay(b, m_t, BT, REVERSE, False) * scale
    decay_t = intra_decay(b, m_t, BT, REVERSE, True) * scale

    # Is this the chunk visited last in its sequence (then dh[slot] is dht)?
    if REVERSE:
        is_last = (ts == bos) & (te > ts)
    else:
        is_last = (te == eos) & (te > ts)
    final_term = tl.zeros([BK], dtype=tl.float32)

    w_row = tl.zeros([BT], dtype=tl.float32)
    # K tiles: one when BK >= K (the usual case); more only where whole-K
    # [BT, BK] operand tiles would not fit in shared memory (K near 256 with
    # long chunks or float32, see shared_memory.py), at the price of
    # recomputing the K-independent scores once per tile.
    for i_k in range(0, tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        b_k = tl.load(k + (o_t[:, None] * H + i_h) * K + o_k[None, :], mask=m_tk, other=0)
        b_dk = tl.zeros([BT, BK], dtype=tl.float32)
        for j in tl.static_range(GROUP):
            i_hq = i_h * GROUP + j
            acc_q = tl.zeros([BT, BK], dtype=tl.float32)
            scores = tl.zeros([BT, BT], dtype=tl.float32)  # [i, j] = do_i . v_j
            scores_t = tl.zeros([BT, BT], dtype=tl.float32)  # [j, i]
            for i_v in range(0, tl.cdiv(V, BV)):
                o_v = i_v * BV + tl.arange(0, BV)
                m_v = o_v < V
                m_tv = m_t[:, None] & m_v[None, :]
                m_vk = m_v[:, None] & m_k[None, :]
                b_do = tl.load(do + (o_t[:, None] * HQ + i_hq) * V + o_v[None, :], mask=m_tv, other=0)
                b_v = tl.load(v + (o_t[:, None] * H + i_h) * V + o_v[None, :], mask=m_tv, other=0)
                # States as [BV, BK] tiles: h^T loaded, not transposed in registers.
                off_vk = o_k[None, :].to(tl.int64) * V + o_v[:, None]
                b_ht = tl.load(h + state_off + off_vk, mask=m_vk, other=0)
                acc_q += state_dot(b_do, b_ht, PREC, STATE_F32)
                scores += dot(b_do, tl.trans(b_v), PREC)
                scores_t += dot(b_v, tl.trans(b_do), PREC)
                if j == 0:
                    b_dht = tl.load(dh + state_off + off_vk, mask=m_vk, other=0)
                    b_dk += state_dot(b_v, b_dht, PREC, STATE_F32)
                    if STORE_W:
                        if USE_DHT:
                            # <dht, final> of this sequence and head, partial over V and K tiles.
                            st_off = (i_n.to(tl.int64) * H + i_h) * K * V
                            # (a full-shape mask: the interpreter refuses a broadcast scalar one)
                            m_f = m_vk & ((o_v[:, None] * 0 + is_last.to(tl.int32)) > 0)
                            f1 = tl.load(dht + st_off + off_vk, mask=m_f, other=0).to(tl.float32)
                            f2 = tl.load(final + st_off + off_vk, mask=m_f, other=0).to(tl.float32)
                            final_term += tl.sum(f1 * f2, axis=0)
            if j == 0:
                b_dk = b_dk * tl.where(m_t, tl.exp(b_tot - b), 0.0)[:, None]
            b_q = tl.load(q + (o_t[:, None] * HQ + i_hq) * K + o_k[None, :], mask=m_tk, other=0)
            b_dq = acc_q * (tl.where(m_t, tl.exp(b), 0.0) * scale)[:, None]
            b_dq += dot((scores * decay).to(b_k.dtype), b_k, PREC)
            tl.store(
                dq + (o_t[:, None] * HQ + i_hq) * K + o_k[None, :], b_dq.to(dq.dtype.element_ty), mask=m_tk
            )
            b_dk += dot((scores_t * decay_t).to(b_q.dtype), b_q, PREC)
            if STORE_W:
                w_row += tl.sum(b_q.to(tl.float32) * b_dq, axis=1)

        tl.store(dk + (o_t[:, None] * H + i_h) * K + o_k[None, :], b_dk.to(dk.dtype.element_ty), mask=m_tk)
        if STORE_W:
            w_row -= tl.sum(b_k.to(tl.float32) * b_dk, axis=1)
    if STORE_W:
        if USE_DHT:
            # Every dg_t of the sequence gets <dht, final>: put it on the
            # last visited token, which every suffix (prefix) sum includes.
            p = tl.arange(0, BT)
            if REVERSE:
                at = p == 0
            else:
                at = p == (te - ts - 1)
            w_row += tl.where(at & is_last, tl.sum(final_term, axis=0), 0.0)
        tl.store(w + o_t * H + i_h, w_row, mask=m_t)
