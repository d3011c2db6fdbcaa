"""Jit helpers shared by the flash-attention forward and backward kernels.

Positions.  The kernels see query and key positions in one of two modes:

* ``POS_MODE == 0`` (offsets): the sequence axis is cut into ``NP`` pieces
  of ``chunk`` tokens (the last piece runs to the end), and the position of
  index ``t`` is ``t + off[piece(t)]``, ``off`` an int32 array of ``NP``
  values that the kernel loads (so a ring can pass traced offsets).  Offsets
  must grow by at least a piece's length from one piece to the next, so
  positions increase with the index: the range of keys a query block can see
  is then a contiguous run of blocks, found in closed form, and blocks fully
  inside the allowed region run without any mask.  ``NP = 1, off = [0]`` is
  the default ``0..T-1``; a ring passes global offsets, and the zig-zag
  layout (two chunks per device) uses ``NP = 2``.
* ``POS_MODE == 1`` (explicit): int32/int64 arrays ``[B, T]`` (batch stride
  0 for ``[T]``), in any order.  Every block is tested (min/max of its
  positions) and skipped when no pair in it can be allowed.

The bias is always read at column ``j + koff[piece(j)]`` (the key's global
index), so a ring step reads its own columns of a bias that spans every key.
"""

import triton
import triton.language as tl

# Stand-in for +-infinity in int32 position arithmetic (|positions| < 2**29).
# Compiled Triton reads module globals only when they are constexpr.
POS_INF_INT = 1 << 30
POS_INF = tl.constexpr(POS_INF_INT)
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def tanh(x):
    """tanh from exp, exact at both tails (exp overflow gives +-1)."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def piece_bounds(p, n_pieces, chunk, T):
    """Index range ``[a, b)`` of piece ``p`` of ``n_pieces``."""
    a = p * chunk
    b = tl.where(p == n_pieces - 1, T, tl.minimum((p + 1) * chunk, T))
    return a, b


@triton.jit
def offset_positions(offs, OFF, chunk, NP: tl.constexpr):
    """Positions ``t + off[piece(t)]`` of the indices ``offs`` (POS_MODE 0),
    and the column offsets of the bias (the same pieces)."""
    pos = offs + tl.load(OFF)
    if NP == 2:
        pos = tl.where(offs >= chunk, offs + tl.load(OFF + 1), pos)
    return pos


@triton.jit
def block_ranges(lo_pos, hi_pos, full_lo_pos, full_hi_pos, a, b, off, BLK: tl.constexpr):
    """Blocks of ``BLK`` indices of the piece ``[a, b)`` (positions
    ``index + off``) to visit, anchored at ``a``:

    ``[t0, t1)`` and ``[t2, t3)`` need the elementwise mask, ``[t1, t2)`` are
    fully allowed.  Allowed positions lie in ``[lo_pos, hi_pos]``; fully
    allowed blocks have every position in ``[full_lo_pos, full_hi_pos]``."""
    lo = tl.minimum(tl.maximum(lo_pos - off, a), b)
    hi = tl.minimum(tl.maximum(hi_pos - off + 1, lo), b)
    f_lo = tl.minimum(tl.maximum(full_lo_pos - off, lo), hi)
    f_hi = tl.minimum(tl.maximum(full_hi_pos - off + 1, f_lo), hi)
    t0 = a + ((lo - a) // BLK) * BLK
    t3 = tl.where(hi > lo, a + ((hi - a + BLK - 1) // BLK) * BLK, t0)
    t1 = tl.minimum(a + ((f_lo - a + BLK - 1) // BLK) * BLK, t3)
    t2 = tl.maximum(a + ((f_hi - a) // BLK) * BLK, t1)
    return t0, t1, t2, t3


@triton.jit
def block_can_be_allowed(
    qmin,
    qmax,
    kmin,
    kmax,
    qsmin,
    qsmax,
    ksmin,
    ksmax,
    left,
    right,
    CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SEG: tl.constexpr,
):
    """False when no (query, key) pair of two blocks can be allowed, from
    the ranges of their positions and segment ids."""
    ok = qmin <= qmax  # a block with no valid row has qmin > qmax
    if CAUSAL:
        ok = ok & (kmin <= qmax)
    if HAS_WINDOW:
        ok = ok & (kmin - qmax <= right) & (qmin - kmax <= left)
    if HAS_SEG:
        ok = ok & (ksmin <= qsmax) & (qsmin <= ksmax)
    return ok


@triton.jit
def allowed_mask(qpos, kpos, qvalid, kvalid, left, right, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Elementwise ``allowed(i, j)`` of the spec, without segments, for a
    tile whose rows are queries (``qpos``) and columns keys (``kpos``)."""
    m = qvalid[:, None] & kvalid[None, :]
    if CAUSAL:
        m = m & (kpos[None, :] <= qpos[:, None])
    if HAS_WINDOW:
        d = qpos[:, None] - kpos[None, :]
        m = m & (d <= left) & (-d <= right)
    return m


@triton.jit
def allowed_mask_t(kpos, qpos, kvalid, qvalid, left, right, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """``allowed_mask`` for a transposed tile: rows are keys, columns queries."""
    m = kvalid[:, None] & qvalid[None, :]
    if CAUSAL:
        m = m & (kpos[:, None] <= qpos[None, :])
    if HAS_WINDOW:
        d = qpos[None, :] - kpos[:, None]
        m = m & (d <= left) & (-d <= right)
    return m


@triton.jit
def load_tile(ptrs, rmask, cmask, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    """A 2-D load masked only where it can go out of bounds."""
    if MASK_ROWS and MASK_COLS:
        return tl.load(ptrs, mask=rmask[:, None] & cmask[None, :], other=0.0)
    elif MASK_ROWS:
        return tl.load(ptrs, mask=rmask[:, None], other=0.0)
    elif MASK_COLS:
        return tl.load(ptrs, mask=cmask[None, :], other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def store_tile(ptrs, value, rmask, cmask, MASK_ROWS: tl.constexpr, MASK_COLS: tl.constexpr):
    if MASK_ROWS and MASK_COLS:
        tl.store(ptrs, value, mask=rmask[:, None] & cmask[None, :])
    elif MASK_ROWS:
        tl.store(ptrs, value, mask=rmask[:, None])
    elif MASK_COLS:
        tl.store(ptrs, value, mask=cmask[None, :])
    else:
        tl.store(ptrs, value)


@triton.jit
def query_block_positions(
    QPOS, QSEG, QOFF, offs_m, qvalid, first, last, q_chunk, b64, stride_pqb, stride_sqb,
    NQP: tl.constexpr, POS_MODE: tl.constexpr, HAS_SEG: tl.constexpr,
):  # fmt: skip
    """Positions and segment ids of a block of queries (rows ``first`` to
    ``last``) with their ranges: ``(qpos, qmin, qmax, qseg, qsmin, qsmax)``.
    Without segment ids the positions stand in (every test passes)."""
    if POS_MODE == 0:
        qpos = offset_positions(offs_m, QOFF, q_chunk, NQP)
        qmin = offset_positions(first, QOFF, q_chunk, NQP)
        qmax = offset_positions(last, QOFF, q_chunk, NQP)
    else:
        qpos = tl.load(QPOS + b64 * stride_pqb + offs_m, mask=qvalid, other=0).to(tl.int32)
        qmin = tl.min(tl.where(qvalid, qpos, POS_INF), 0)
        qmax = tl.max(tl.where(qvalid, qpos, -POS_INF), 0)
    if HAS_SEG:
        qseg = tl.load(QSEG + b64 * stride_sqb + offs_m, mask=qvalid, other=0).to(tl.int32)
        qsmin = tl.min(tl.where(qvalid, qseg, POS_INF), 0)
        qsmax = tl.max(tl.where(qvalid, qseg, -POS_INF), 0)
    else:
        qseg = qpos
        qsmin = qmin
        qsmax = qmax
    return qpos, qmin, qmax, qseg, qsmin, qsmax


@triton.jit
def visible_key_range(qmin, qmax, left, right, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Key positions a query block ``[qmin, qmax]`` can see,
    ``[lo_pos, hi_pos]``, and those every one of its rows sees,
    ``[full_lo, full_hi]``."""
    lo_pos = -POS_INF
    hi_pos = POS_INF
    full_lo = -POS_INF
    full_hi = POS_INF
    if CAUSAL:
        hi_pos = qmax
        full_hi = qmin
    if HAS_WINDOW:
        lo_pos = qmin - left
        hi_pos = tl.minimum(hi_pos, qmax + right)
        full_lo = qmax - left
        full_hi = tl.minimum(full_hi, qmin + right)
    return lo_pos, hi_pos, full_lo, full_hi
