"""Forward kernel of the recurrent linear attention.

One program owns one state head of one sequence and a tile of ``BV`` value
columns of its ``K x V`` float32 state (all ``K`` rows, padded to ``BK``),
and walks the sequence token by token (``REVERSE``: last to first)::

    S = S * exp(g[t] + g_gamma) * exp(gk[t])[:, None] * exp(gv[t])[None, :]
    S = S + outer(k[t], v[t])
    o[t, j] = scale * q[t, j] @ S          for the G query heads j of the group

Keeping all of ``K`` in one program means each output element is complete
when written (no partial outputs to sum), and the tile of ``V`` sets the
parallelism: the grid is ``(cdiv(V, BV), N * H)``.

Layouts (contiguous): q ``[B*T, HQ, K]``, k ``[B*T, H, K]``, v ``[B*T, H, V]``,
g ``[B*T, H]``, g_gamma ``[H]``, gk ``[B*T, H, K]``, gv ``[B*T, H, V]``,
h0/ht ``[N, H, K, V]``; o ``[B*T, HQ, V]`` in the input's dtype.  Rows of a
sequence are ``bos .. eos-1`` of the flattened ``B*T`` axis (clamped into
it: core_triton.common.sequences); offsets are
64-bit so tensors past 2**31 elements index correctly.
"""

import triton
import triton.language as tl

from core_triton.common.runtime import jit
from core_triton.common.sequences import sequence_bounds


@triton.jit
def decay_state(
    b_h,
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
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    USE_G: tl.constexpr,
    USE_G_GAMMA: tl.constexpr,
    USE_GK: tl.constexpr,
    USE_GV: tl.constexpr,
):
    """``b_h`` times the decays of token ``row`` (all gates that are given)."""
    if USE_G:
        b_h = b_h * tl.exp(tl.load(g + row * H + i_h).to(tl.float32))
    if USE_G_GAMMA:
        b_h = b_h * tl.exp(b_gamma)
    if USE_GK:
        b_gk = tl.load(gk + row * (H * K) + i_h * K + o_k, mask=m_k, other=0).to(tl.float32)
        b_h = b_h * tl.exp(b_gk)[:, None]
    if USE_GV:
        b_gv = tl.load(gv + row * (H * V) + i_h * V + o_v, mask=m_v, other=0).to(tl.float32)
        b_h = b_h * tl.exp(b_gv)[None, :]
    return b_h


@jit(sizes=("T",))
def recurrent_fwd_kernel(
    q,
    k,
    v,
    g,
    g_gamma,
    gk,
    gv,
    h0,
    cu_seqlens,
    T,
    scale,
    o,
    ht,
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
    i_n = i_nh // H
    i_h = i_nh % H
    HQ: tl.constexpr = H * G
    bos, eos = sequence_bounds(cu_seqlens, i_n, T, IS_VARLEN)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    p_state = i_nh.to(tl.int64) * (K * V) + o_k[:, None] * V + o_v[None, :]

    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_H0:
        b_h += tl.load(h0 + p_state, mask=m_h, other=0).to(tl.float32)
    b_gamma = 0.0
    if USE_G_GAMMA:
        b_gamma = tl.load(g_gamma + i_h).to(tl.float32)

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
        for j in tl.static_range(G):
            i_q = i_h * G + j
            b_q = tl.load(q + row * (HQ * K) + i_q * K + o_k, mask=m_k, other=0).to(tl.float32)
            b_o = tl.sum(b_h * (b_q * scale)[:, None], axis=0)
            tl.store(o + row * (HQ * V) + i_q * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)

    tl.store(ht + p_state, b_h, mask=m_h)
