"""Backward kernel of the recurrent gated delta rule.

The delta update cannot be undone stably (``S_{t-1}`` from ``S_t`` divides
by ``1 - beta |k|^2`` and by the decay), and the reverse walk needs every
token's state, so the kernel keeps checkpoints.  Same programs as the
forward (one value head of one sequence, all ``K`` rows, ``BV`` value
columns):

1. In time order, recompute the states and store the one entering each
   block of ``CB`` tokens in ``ckpt[slot]`` (slots as the chunk kernels
   number them: core_triton.common.sequences).
2. Blocks last to first: replay the block from its checkpoint, storing each
   token's decayed state ``S_a = decay(t) * S_{t-1}`` in this program's
   ``scratch`` (``CB`` tiles), then walk the block backward carrying ``dS``
   (the gradient of the state after the token), from ``dht``::

       S_t   = S_a + outer(k, u),   u = beta (v - S_a^T k)
       dS   += scale * outer(q, do)
       dq    = scale * S_t do                  du = dS^T k
       dk    = dS u - beta S_a du              dv = beta du
       dbeta = (v - S_a^T k) . du
       dS_a  = dS - beta outer(k, du)
       dg    = sum(dS_a * S_a)   (gk: its row sums)
       dS    = decay(t) * dS_a

   and ``dS`` after the first token is ``d initial_state``.

Memory: ``cdiv(T, CB)`` checkpoints per sequence and value head, plus ``CB``
states per program.  Sums over ``V`` (dq, dk, dbeta, dg) are partial per
value tile, and dq/dk also per value head of a key head's group: float32
``[NV * G, ...]`` / ``[NV, ...]`` buffers that a reduction launch sums in a
fixed order.  dv and d initial_state are complete in one program.
"""

import triton.language as tl

from core_triton.common.runtime import jit
from core_triton.common.sequences import sequence_chunks
from core_triton.delta_rule.recurrent_fwd import token_decay


@jit(sizes=("T", "NT", "NS", "ROWS"))
def delta_recurrent_bwd_kernel(
    q,
    k,
    v,
    beta,
    g,
    gk,
    h0,
    do,
    dht,
    cu_seqlens,
    chunk_offsets,
    T,
    NT,
    NS,
    ROWS,
    scale,
    dq,
    dk,
    dv,
    dbeta,
    dgate,
    dh0,
    ckpt,
    scratch,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    CB: tl.constexpr,
    GATE: tl.constexpr,
    USE_H0: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    G: tl.constexpr = HV // HK
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    NV = tl.num_programs(0)
    i_n = i_nh // HV
    i_h = i_nh % HV
    i_hk = i_h // G
    bos, eos, slot0, n_chunks = sequence_chunks(cu_seqlens, chunk_offsets, i_n, T, NT, NS, CB, IS_VARLEN)
    n_chunks = n_chunks.to(tl.int32)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    off_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    p_state = i_nh.to(tl.int64) * (K * V) + off_kv
    # This program's scratch: CB tiles of [BK, BV].
    p_scratch = (
        (i_nh.to(tl.int64) * NV + i_v) * (CB * BK * BV) + o_k[:, None] * BV + tl.arange(0, BV)[None, :]
    )
    # Partial buffers: dq/dk [NV * G, ROWS, HK, K], dbeta/dgate [NV, ROWS, HV(, K)].
    qk_part = (i_v * G + i_h % G).to(tl.int64) * ROWS
    v_part = i_v.to(tl.int64) * ROWS

    # Pass 1: checkpoints.
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + p_state, mask=m_h, other=0).to(tl.float32)
    for c in range(0, n_chunks):
        ts = bos + c * CB
        te = tl.minimum(ts + CB, eos)
        tl.store(ckpt + ((slot0 + c) * HV + i_h) * (K * V) + off_kv, S, mask=m_h)
        for row in range(ts, te):
            b_k = tl.load(k + (row * HK + i_hk) * K + o_k, mask=m_k, other=0).to(tl.float32)
            b_v = tl.load(v + (row * HV + i_h) * V + o_v, mask=m_v, other=0).to(tl.float32)
            b_beta = tl.load(beta + row * HV + i_h).to(tl.float32)
            S = token_decay(S, g, gk, row, i_h, o_k, m_k, HV, K, GATE)
            S += b_k[:, None] * (b_beta * (b_v - tl.sum(S * b_k[:, None], axis=0)))[None, :]
    tl.debug_barrier()

    # Pass 2: blocks last to first.
    dS = tl.load(dht + p_state, mask=m_h, other=0).to(tl.float32)
    for it in range(0, n_chunks):
        c = n_chunks - 1 - it
        ts = bos + c * CB
        te = tl.minimum(ts + CB, eos)
        S = tl.load(ckpt + ((slot0 + c) * HV + i_h) * (K * V) + off_kv, mask=m_h, other=0)
        for row in range(ts, te):
            b_k = tl.load(k + (row * HK + i_hk) * K + o_k, mask=m_k, other=0).to(tl.float32)
            b_v = tl.load(v + (row * HV + i_h) * V + o_v, mask=m_v, other=0).to(tl.float32)
            b_beta = tl.load(beta + row * HV + i_h).to(tl.float32)
            S = token_decay(S, g, gk, row, i_h, o_k, m_k, HV, K, GATE)
            tl.store(scratch + p_scratch + (row - ts) * (BK * BV), S)
            S += b_k[:, None] * (b_beta * (b_v - tl.sum(S * b_k[:, None], axis=0)))[None, :]
        # the walk below reads what other threads of this program stored
        tl.debug_barrier()
        for i in range(0, te - ts):
            row = te - 1 - i
            S_a = tl.load(scratch + p_scratch + (row - ts) * (BK * BV))
            b_k = tl.load(k + (row * HK + i_hk) * K + o_k, mask=m_k, other=0).to(tl.float32)
            b_q = tl.load(q + (row * HK + i_hk) * K + o_k, mask=m_k, other=0).to(tl.float32)
            b_v = tl.load(v + (row * HV + i_h) * V + o_v, mask=m_v, other=0).to(tl.float32)
            b_do = tl.load(do + (row * HV + i_h) * V + o_v, mask=m_v, other=0).to(tl.float32)
            b_beta = tl.load(beta + row * HV + i_h).to(tl.float32)
            err = b_v - tl.sum(S_a * b_k[:, None], axis=0)
            u = b_beta * err
            S_t = S_a + b_k[:, None] * u[None, :]
            dS += (b_q * scale)[:, None] * b_do[None, :]
            b_dq = tl.sum(S_t * b_do[None, :], axis=1) * scale
            du = tl.sum(dS * b_k[:, None], axis=0)
            b_dk = tl.sum(dS * u[None, :], axis=1) - b_beta * tl.sum(S_a * du[None, :], axis=1)
            tl.store(dv + (row * HV + i_h) * V + o_v, (b_beta * du).to(dv.dtype.element_ty), mask=m_v)
            tl.store(dq + ((qk_part + row) * HK + i_hk) * K + o_k, b_dq, mask=m_k)
            tl.store(dk + ((qk_part + row) * HK + i_hk) * K + o_k, b_dk, mask=m_k)
            tl.store(dbeta + (v_part + row) * HV + i_h, tl.sum(err * du, axis=0))
            dS = dS - b_beta * b_k[:, None] * du[None, :]
            if GATE == 1:
                tl.store(dgate + (v_part + row) * HV + i_h, tl.sum(tl.sum(dS * S_a, axis=1), axis=0))
            if GATE == 2:
                tl.store(dgate + ((v_part + row) * HV + i_h) * K + o_k, tl.sum(dS * S_a, axis=1), mask=m_k)
            dS = token_decay(dS, g, gk, row, i_h, o_k, m_k, HV, K, GATE)
        # the next block's replay overwrites the scratch this walk read
        tl.debug_barrier()
    if USE_H0:
        tl.store(dh0 + p_state, dS.to(dh0.dtype.element_ty), mask=m_h)
