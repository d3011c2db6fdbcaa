"""Forward kernel of the recurrent gated delta rule (also the decoding step).

One program owns one value head of one sequence and a tile of ``BV`` value
columns of its ``K x V`` float32 state (all ``K`` rows, padded to ``BK``):
the delta update of a column needs only that column (``u = beta (v - S^T
k)`` is per column), so value tiles are independent.  Token by token::

    S = decay(t) * S                 (exp(g[t]), or exp(gk[t]) per key row)
    u = beta[t] * (v[t] - S^T k[t])
    S = S + outer(k[t], u)
    o[t] = scale * S^T q[t]

Layouts (contiguous): q, k ``[B*T, HK, K]``, v ``[B*T, HV, V]``, beta and g
``[B*T, HV]``, gk ``[B*T, HV, K]``, h0/ht ``[N, HV, K, V]``; o ``[B*T, HV,
V]`` in the inputs' dtype.  Value head ``h`` reads key head ``h // G``.
Decoding passes the same buffer as ``h0`` and ``ht``: each program reads its
tile before it writes it.  ``L2``: q and k rows are L2-normalised here, as
l2norm.py's launch would have stored them (every program holds all of K),
so the forward needs no normalisation launch of its own.
"""

import triton
import triton.language as tl

from core_triton.common.runtime import jit
from core_triton.common.sequences import sequence_bounds


@triton.jit
def token_decay(S, g, gk, row, i_h, o_k, m_k, HV: tl.constexpr, K: tl.constexpr, GATE: tl.constexpr):
    """``S`` times token ``row``'s decay (GATE 1: ``exp(g)``, 2: ``exp(gk)`` per
    key row, 0: none)."""
    if GATE == 1:
        S = S * tl.exp(tl.load(g + row * HV + i_h).to(tl.float32))
    if GATE == 2:
        b_g = tl.load(gk + (row * HV + i_h) * K + o_k, mask=m_k, other=0).to(tl.float32)
        S = S * tl.exp(b_g)[:, None]
    return S


@triton.jit
def l2_unit(x, dtype, EPS: tl.constexpr):
    """A float32 row ``x`` (all of K, 0 past it) L2-normalised and rounded
    to ``dtype``, as l2norm.py's launch stores it, back in float32."""
    return (x * (1.0 / tl.sqrt(tl.sum(x * x, axis=0) + EPS))).to(dtype).to(tl.float32)


@jit(sizes=("T",))
def delta_recurrent_fwd_kernel(
    q,
    k,
    v,
    beta,
    g,
    gk,
    h0,
    cu_seqlens,
    T,
    scale,
    o,
    ht,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    GATE: tl.constexpr,
    USE_H0: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    L2: tl.constexpr,
    EPS: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = i_nh // HV
    i_h = i_nh % HV
    i_hk = i_h // (HV // HK)
    bos, eos = sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    p_state = i_nh.to(tl.int64) * (K * V) + o_k[:, None] * V + o_v[None, :]

    S = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        S += tl.load(h0 + p_state, mask=m_h, other=0).to(tl.float32)
    for row in range(bos, eos):
        b_k = tl.load(k + (row * HK + i_hk) * K + o_k, mask=m_k, other=0).to(tl.float32)
        b_q = tl.load(q + (row * HK + i_hk) * K + o_k, mask=m_k, other=0).to(tl.float32)
        if L2:
            b_k = l2_unit(b_k, k.dtype.element_ty, EPS)
            b_q = l2_unit(b_q, q.dtype.element_ty, EPS)
        b_v = tl.load(v + (row * HV + i_h) * V + o_v, mask=m_v, other=0).to(tl.float32)
        b_beta = tl.load(beta + row * HV + i_h).to(tl.float32)
        S = token_decay(S, g, gk, row, i_h, o_k, m_k, HV, K, GATE)
        u = b_beta * (b_v - tl.sum(S * b_k[:, None], axis=0))
        S += b_k[:, None] * u[None, :]
        b_o = tl.sum(S * b_q[:, None], axis=0) * scale
        tl.store(o + (row * HV + i_h) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
    tl.store(ht + p_state, S, mask=m_h)
