"""Device helpers shared by the chunk-parallel linear-attention kernels.

Layouts (all contiguous, time-first, rows of the flattened ``[B*T]`` axis):
``q [B*T, HQ, K]``, ``k [B*T, H, K]``, ``v [B*T, H, V]``, ``gc [B*T, H]``
(float32 in-chunk cumsum of ``g``).  A token's row is ``b * T + t``
(packed input: ``B == 1``), so every address is ``(row * heads + head) *
dim + feature``, computed in int64.

Chunks of ``BT`` tokens start at each sequence's first token.  Chunk states
live in ``h [NS, H, K, V]``: one *slot* per chunk (batched input:
``slot = b * NT + c`` with ``NS = B * NT``; packed input: ``slot =
chunk_offsets[n] + c``, with ``NS = cdiv(T, BT) + N`` slots, an upper bound
known from shapes alone).  Where a sequence and its chunks lie comes from
core_triton.common.sequences, which clamps both into the tensors.

Gate convention inside a chunk, for both directions: ``b[i]`` is the log
decay from the chunk boundary where the state *enters* (the first token
forward, the last token with ``REVERSE``) to token ``i`` inclusive, and
``b_tot`` that of the whole chunk.  Then, with ``D[i, j] = exp(b[i] -
b[j])`` where ``j`` is visited no later than ``i``,

    S_i     = exp(b[i]) h_in + sum_j D[i, j] k_j v_j^T
    h_out   = exp(b_tot) h_in + sum_j exp(b_tot - b[j]) k_j v_j^T

Forward, ``b`` is the inclusive prefix cumsum of the gates inside the chunk
and "visited no later" means ``j <= i``; reversed, ``b`` is the inclusive
suffix cumsum and it means ``j >= i``.  The foundation's
``chunk_local_cumsum`` (with the same ``reverse``) gives exactly these.
"""

import triton
import triton.language as tl

from core_triton.common.kernel_helpers import dot, dot_acc


@triton.jit
def split_half(x, HALF: tl.constexpr):
    """``(hi, lo)`` in dtype ``HALF`` with ``hi + lo`` equal to float32 ``x``
    to about 16 significant bits (bf16: 8 + 8): a float32 operand of a
    product whose other operand is half precision runs as two
    half-precision products, more exact than one tf32 product (11 bits)
    and without staging float32 operands in shared memory."""
    hi = x.to(HALF)
    lo = (x - hi.to(tl.float32)).to(HALF)
    return hi, lo


@triton.jit
def state_dot(a, s, PRECISION: tl.constexpr, STATE_F32: tl.constexpr):
    """``a @ s`` for a chunk-state tile ``s``: with float32 states, full
    float32 products for float32 ``a`` (``PRECISION`` "ieee"), else ``s``
    split into two of ``a``'s half dtype (split_half); half-precision
    states: ``a``'s half dtype."""
    if STATE_F32:
        if a.dtype == tl.float32:
            out = dot(a, s.to(tl.float32), PRECISION)
        else:
            hi, lo = split_half(s.to(tl.float32), a.dtype)
            out = dot(a, hi, PRECISION) + dot(a, lo, PRECISION)
    else:
        out = dot(a, s.to(a.dtype), PRECISION)
    return out


@triton.jit
def update_dot(a, b, PRECISION: tl.constexpr, STATE_F32: tl.constexpr):
    """``a @ b`` where ``a`` (float32: decay-weighted keys or queries) builds
    a state update: with float32 states, full float32 products for float32
    ``b``, else ``a`` split into two of ``b``'s half dtype (split_half);
    half-precision states: ``a`` rounded to ``b``'s half dtype like the
    tensor cores want."""
    if STATE_F32:
        if b.dtype == tl.float32:
            out = dot(a, b, PRECISION)
        else:
            hi, lo = split_half(a, b.dtype)
            out = dot(hi, b, PRECISION) + dot(lo, b, PRECISION)
    else:
        out = dot(a.to(b.dtype), b, PRECISION)
    return out


@triton.jit
def half_dot_acc(a, b, acc, like, PRECISION: tl.constexpr, IEEE: tl.constexpr):
    """``acc + a @ b``: float32 products for float32 inputs (``IEEE``), else
    one product of both operands rounded to ``like``'s half dtype,
    accumulated into ``acc`` by the tensor cores (no second float32 tile
    held beside ``acc``)."""
    if IEEE:
        out = acc + dot(a, b, PRECISION)
    else:
        out = dot_acc(a.to(like.dtype), b.to(like.dtype), acc)
    return out


@triton.jit
def carry_over_chunk(state, b_kt, b_v, b, b_tot, m_t, scale, SCALED: tl.constexpr, PREC: tl.constexpr,
                     IEEE: tl.constexpr):  # fmt: skip
    """The ``[BK, BV]`` float32 state leaving a chunk, from the one entering
    it: ``exp(b_tot) state + k^T (w * v)`` with ``w`` each token's decay to
    the chunk's end (0 past the chunk, where exp could overflow), times
    ``scale`` with ``SCALED``; one product accumulating in place
    (half_dot_acc), the decay on v's rows (a ``[BT, BV]`` tile, where on k^T
    it would be ``[K, BT]``: k^T goes to the tensor cores as loaded)."""
    w = tl.where(m_t, tl.exp(b_tot - b), 0.0)
    if SCALED:
        w = w * scale
    return half_dot_acc(b_kt, b_v * w[:, None], state * tl.exp(b_tot), b_v, PREC, IEEE)


@triton.jit
def chunk_gates(
    gc,
    g_gamma,
    i_h,
    o_t,
    m_t,
    ts,
    te,
    H: tl.constexpr,
    BT: tl.constexpr,
    USE_G: tl.constexpr,
    USE_GAMMA: tl.constexpr,
    REVERSE: tl.constexpr,
    G_RAW: tl.constexpr = False,
):
    """(b [BT], b_tot) of one chunk (see the module docstring), float32.
    ``g_gamma``'s in-chunk cumsum is ``gamma * (i + 1)`` (reversed:
    ``gamma * (L - i)``), computed here rather than read; so is ``g``'s
    with ``G_RAW`` (``gc`` then points at ``g``)."""
    p = tl.arange(0, BT)
    L = (te - ts).to(tl.int32)
    b = tl.zeros([BT], dtype=tl.float32)
    if USE_G:
        gate = tl.load(gc + o_t * H + i_h, mask=m_t, other=0).to(tl.float32)
        if G_RAW:
            # Rows past the chunk (loaded as 0) end at 0, as a read gc's do.
            gate = tl.where(m_t, tl.cumsum(gate, axis=0, reverse=REVERSE), 0.0)
        b += gate
    if USE_GAMMA:
        gamma = tl.load(g_gamma + i_h).to(tl.float32)
        if REVERSE:
            b += gamma * (L - p).to(tl.float32)
        else:
            b += gamma * (p + 1).to(tl.float32)
        # Past the chunk's end (a short last chunk) the reversed ramp turns
        # positive and exp(b) could overflow; those rows are dropped anyway.
        b = tl.where(m_t, b, 0.0)
    # The whole chunk's decay: b at the token visited last.
    if REVERSE:
        last = 0
    else:
        last = L - 1
    b_tot = tl.sum(tl.where(p == last, b, 0.0), axis=0)
    return b, b_tot


@triton.jit
def intra_decay(b, m_t, BT: tl.constexpr, REVERSE: tl.constexpr, TRANSPOSED: tl.constexpr):
    """``D[i, j] = exp(b[i] - b[j])`` where token ``j`` is visited no later
    than token ``i`` (and both are in the chunk), else 0; ``TRANSPOSED``
    gives ``D^T`` (rows ``j``, columns ``i``), built directly rather than by
    transposing (see the note on ``tl.trans`` in chunk_bwd_dqk.py)."""
    p = tl.arange(0, BT)
    if TRANSPOSED:
        i = p[None, :]
        j = p[:, None]
        diff = b[None, :] - b[:, None]
    else:
        i = p[:, None]
        j = p[None, :]
        diff = b[:, None] - b[None, :]
    if REVERSE:
        keep = j >= i
    else:
        keep = j <= i
    keep = keep & m_t[:, None] & m_t[None, :]
    # Mask before the exp: a dropped entry's difference can be large and
    # positive, and exp() of it would overflow (inf, and a warning under the
    # interpreter) before where() threw it away.  exp(-inf) is exactly 0.
    return tl.exp(tl.where(keep, diff, float("-inf")))
