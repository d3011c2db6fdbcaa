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

Grouped arguments.  The kernels hand their helpers tuples of what travels
together: ``window = (left, right)``, a block's ``id_ranges`` ``(pmin,
pmax, smin, smax)``, pointers, strides, the loops' constexprs.  Triton
passes a tuple's leaves as separate arguments, so the compiled code is what
separate arguments give.  A constexpr inside a tuple stays a compile-time
constant when the tuple is written in the call or bound with an annotation
(``T: tl.constexpr = (...)``) and read back one name at a time (``X:
tl.constexpr = T[i]``).  Compiled Triton (3.6 and 3.9) makes run-time
values of constexprs bound by ``a, b = T`` or ``a = T[i]`` (a string one
fails to compile), and the interpreter makes a tensor of ``a = T[i]``.

Launch order.  Which program owns which block is the constexpr ``ORDER``
of the forward, dQ and dK/dV kernels and the warp-specialised forward,
read through :func:`block_and_row` alone (flash_configs.program_order
picks it, flash_configs.program_grid makes the grid): only the schedule
changes, never a result.
"""

import triton
import triton.language as tl

from core_triton.common.kernel_helpers import hint16

# Stand-in for +-infinity in int32 position arithmetic (|positions| < 2**29).
# Compiled Triton reads module globals only when they are constexpr.
POS_INF_INT = 1 << 30
POS_INF = tl.constexpr(POS_INF_INT)
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)

# The flash kernels' constexpr groups (core_triton.common.runtime.jit's
# ``groups``): the constants a plan sets once a call, by name, which its
# launch packs into two arguments, ``DIMS`` and ``OPTIONS``, in these orders;
# each kernel reads them back by name in the same order (a test checks).
# Launch-level constants (GATE, SPLIT, ORDER, the tiles BM and BN that the
# autotuner sets, EDGE_STAGES) stay arguments of their own.
_DIMS = ("D", "DV", "BD", "BDV")
_OPTIONS = ("CAUSAL", "HAS_WINDOW", "HAS_CAP", "HAS_BIAS", "HAS_SEG", "HAS_RANGE", "POS_MODE", "TEST", "NQP",
            "NKP", "ROW64", "DIV16", "DOT_PREC")  # fmt: skip
FWD_GROUPS = {"DIMS": (*_DIMS, "BS"), "OPTIONS": (*_OPTIONS, "HAS_SINK")}
DKDV_GROUPS = {"DIMS": _DIMS, "OPTIONS": _OPTIONS}
DQ_GROUPS = {"DIMS": _DIMS, "OPTIONS": (*_OPTIONS, "HAS_DLSE")}
DBIAS_GROUPS = {
    "DIMS": _DIMS,
    "OPTIONS": ("CAUSAL", "HAS_WINDOW", "HAS_CAP", "HAS_SEG", "POS_MODE", "NQP", "NKP", "ROW64", "DOT_PREC"),
}


# The strides a flash kernel's DIV16 speaks of, bit ``i`` for the ``i``-th
# (flash_configs.stride_hint_bits sets them): the row strides of q, k, v and
# dO, then the batch and head strides of each, then the output's row, batch
# and head strides (read by the dQ kernel only).  The forward has no dO and
# reads no output: those bits stay 0.  Each name below is its bit's mask.
HINTED = ("qt", "kt", "vt", "dot", "qb", "qh", "kb", "kh", "vb", "vh", "dob", "doh", "ot", "ob", "oh")
(QT, KT, VT, DOT, QB, QH, KB, KH, VB, VH, DOB, DOH, OT, OB, OH) = (
    tl.constexpr(1 << i) for i in range(len(HINTED))
)


@triton.jit
def hinted(stride, DIV16: tl.constexpr, MASK: tl.constexpr):
    """``stride``, a multiple of 16 to the compiler where ``DIV16`` has
    ``MASK``'s bit (kernel_helpers.hint16).  The mask comes first: the
    interpreter passes ``DIV16`` as an int, which takes no constexpr."""
    return hint16(stride, (MASK & DIV16) != 0)


@triton.jit
def hinted_strides(DIV16: tl.constexpr, qt, kt, vt, dot, qb, qh, kb, kh, vb, vh, dob, doh):
    """The strides of :data:`HINTED` in its order, each :func:`hinted` (the
    forward passes 0 for dO's)."""
    return (
        hinted(qt, DIV16, QT), hinted(kt, DIV16, KT), hinted(vt, DIV16, VT), hinted(dot, DIV16, DOT),
        hinted(qb, DIV16, QB), hinted(qh, DIV16, QH), hinted(kb, DIV16, KB), hinted(kh, DIV16, KH),
        hinted(vb, DIV16, VB), hinted(vh, DIV16, VH), hinted(dob, DIV16, DOB), hinted(doh, DIV16, DOH),
    )  # fmt: skip


@triton.jit
def block_and_row(ORDER: tl.constexpr):
    """A flash program's ``(block, row)``: ``block``, its block along the
    sequence it owns (query block; key block for dK/dV), and ``row``, its
    index on the other axis (batch * head; with the dK/dV split, batch *
    key head * splits), under the launch order ``ORDER``
    (flash_configs.program_order; flash_configs.program_grid makes the
    matching grid):

    * 0: grid ``(blocks, rows)``, block = ``program_id(0)``;
    * 1: grid ``(rows, blocks)``, block = ``program_id(1)``;
    * 2: grid ``(rows, blocks)``, block = ``num_programs(1) - 1 -
      program_id(1)``: the last block first;
    * 3: grid ``(blocks, rows)``, block = ``num_programs(0) - 1 -
      program_id(0)``: each (batch, head)'s last block first, heads in turn.

    Why: the GPU starts programs with axis 0 fastest, so under 1 and 2
    every (batch, head) of a block starts before any of the next block.
    With a causal mask the work grows with the query block (and shrinks
    with the key block), so taking the heaviest blocks first leaves the
    light ones to fill the end of the launch."""
    if ORDER == 0:
        block = tl.program_id(0)
        row = tl.program_id(1)
    elif ORDER == 3:
        block = tl.num_programs(0) - 1 - tl.program_id(0)
        row = tl.program_id(1)
    else:
        block = tl.program_id(1)
        row = tl.program_id(0)
        if ORDER == 2:
            block = tl.num_programs(1) - 1 - block
    return block, row


@triton.jit
def row_programs(ORDER: tl.constexpr):
    """How many programs the launch has on the ``row`` axis of
    :func:`block_and_row` (the grid's axis 1 under ``ORDER`` 0 and 3, else 0)."""
    if ORDER == 0 or ORDER == 3:
        n = tl.num_programs(1)
    else:
        n = tl.num_programs(0)
    return n


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
def block_ranges(visible, a, b, off, BLK: tl.constexpr):
    """Blocks of ``BLK`` indices of the piece ``[a, b)`` (positions
    ``index + off``) to visit, anchored at ``a``:

    ``[t0, t1)`` and ``[t2, t3)`` need the elementwise mask, ``[t1, t2)`` are
    fully allowed.  ``visible = (lo_pos, hi_pos, full_lo_pos, full_hi_pos)``:
    allowed positions lie in ``[lo_pos, hi_pos]``; fully allowed blocks
    have every position in ``[full_lo_pos, full_hi_pos]``."""
    lo_pos, hi_pos, full_lo_pos, full_hi_pos = visible
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
def other_range(RANGE, offs, valid, T):
    """The index ranges of the other side's tokens that a block's rows
    (indices ``offs`` of a side of length ``T``) can see, from ``RANGE
    [2T]`` (this batch row; core_triton.attention.segment_ranges gives the
    format): ``(lo, hi, in_lo, in_hi)``.  ``[lo, hi)`` holds every
    token any row can see (empty for a block with no valid or no covered
    row); ``[in_lo, in_hi)`` holds only tokens that every valid row sees
    whatever the positions say (non-empty only when every row's range is
    exact, and all rows share one segment)."""
    lo = tl.load(RANGE + offs, mask=valid, other=0)
    hi = tl.load(RANGE + T + offs, mask=valid, other=0)
    row_exact = lo >= 0
    lo = tl.where(row_exact, lo, -1 - lo)
    exact = tl.min(tl.where(valid, row_exact, True).to(tl.int32), 0) > 0
    in_lo = tl.max(tl.where(valid, lo, 0), 0)
    in_hi = tl.min(tl.where(valid, hi, POS_INF), 0)
    in_hi = tl.where(exact, in_hi, in_lo)
    lo = tl.min(tl.where(valid & (hi > lo), lo, POS_INF), 0)
    hi = tl.max(tl.where(valid, hi, 0), 0)
    return lo, hi, in_lo, in_hi


@triton.jit
def gated_rows(RANGE, offs, valid, T, T_other, GATE: tl.constexpr):
    """The rows of a block (indices ``offs`` of a side of length ``T``) of
    ``GATE``'s kind, for the launches of a gated pair (flash.py's
    ``gated_pair``): 1, the valid rows whose range in ``RANGE [2T]``
    (segment_ranges' format) is exact and holds the whole other side ``[0,
    T_other)``, which attend as without segment ids; 2, the other valid
    rows."""
    lo = tl.load(RANGE + offs, mask=valid, other=-1)
    hi = tl.load(RANGE + T + offs, mask=valid, other=0)
    whole = (lo == 0) & (hi >= T_other)
    if GATE == 1:
        rows = valid & whole
    else:
        rows = valid & (whole == 0)
    return rows


@triton.jit
def clamp_runs(t, lo, hi, BLK: tl.constexpr):
    """Runs ``t = (t0, t1, t2, t3)`` (anchored at 0) cut to the blocks that
    meet ``[lo, hi)``; monotone, so the runs keep their order and their
    block alignment."""
    a = (lo // BLK) * BLK
    b = tl.maximum(((hi + BLK - 1) // BLK) * BLK, 0)
    t0, t1, t2, t3 = t
    return (
        tl.minimum(tl.maximum(t0, a), b),
        tl.minimum(tl.maximum(t1, a), b),
        tl.minimum(tl.maximum(t2, a), b),
        tl.minimum(tl.maximum(t3, a), b),
    )


@triton.jit
def inner_runs(t, in_lo, in_hi, BLK: tl.constexpr):
    """Runs ``t`` whose middle (unmasked) run keeps only the blocks wholly
    inside ``[in_lo, in_hi)``; the blocks it drops join the masked runs
    beside it, so every block stays in exactly one run."""
    a = ((in_lo + BLK - 1) // BLK) * BLK
    b = (in_hi // BLK) * BLK
    t0, t1, t2, t3 = t
    m1 = tl.minimum(tl.maximum(t1, a), t2)
    m2 = tl.maximum(tl.minimum(t2, b), m1)
    return t0, m1, m2, t3


@triton.jit
def range_runs(t, RANGE, offs, valid, T, BLK: tl.constexpr, HAS_RANGE: tl.constexpr):
    """With ranges (``HAS_RANGE``), ``t`` cut by :func:`clamp_runs` to the
    block's range (:func:`other_range`) and its middle run kept to the
    tiles every row sees (:func:`inner_runs`: no segment comparison
    there); else ``t``."""
    if HAS_RANGE:
        lo, hi, in_lo, in_hi = other_range(RANGE, offs, valid, T)
        t = inner_runs(clamp_runs(t, lo, hi, BLK), in_lo, in_hi, BLK)
    return t


@triton.jit
def piece_runs(p, NP: tl.constexpr, chunk, T, OFF, visible, BLK: tl.constexpr, POS_MODE: tl.constexpr):
    """Piece ``p`` of the ``NP`` pieces of a loop's axis (length ``T``):
    ``(end, off, t)``, its end, its offset and ``t = (t0, t1, t2, t3)``.
    Run ``r`` of blocks is ``[t[r], t[r + 1])``: masked edge blocks, fully
    allowed blocks, masked edge blocks (``block_ranges`` of the positions
    ``visible``).  Explicit positions: one masked run, the whole piece."""
    a, end = piece_bounds(p, NP, chunk, T)
    off = tl.load(OFF + p)
    if POS_MODE == 0:
        t = block_ranges(visible, a, end, off, BLK)
    else:
        t = (a, end, end, end)
    return end, off, t


@triton.jit
def value_range(x, valid):
    """``(min, max)`` of ``x`` over its valid entries; ``(POS_INF,
    -POS_INF)`` when none is valid (then min > max)."""
    return tl.min(tl.where(valid, x, POS_INF), 0), tl.max(tl.where(valid, x, -POS_INF), 0)


@triton.jit
def id_ranges(pos, seg, valid, HAS_SEG: tl.constexpr):
    """Ranges of a block's positions and segment ids, ``(pmin, pmax, smin,
    smax)``; without segment ids the position range stands in (no segment
    test reads it)."""
    pmin, pmax = value_range(pos, valid)
    if HAS_SEG:
        smin, smax = value_range(seg, valid)
    else:
        smin, smax = pmin, pmax
    return pmin, pmax, smin, smax


@triton.jit
def block_can_be_allowed(
    qr, kr, window, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SEG: tl.constexpr
):
    """False when no (query, key) pair of two blocks can be allowed, from
    their ``id_ranges`` ``qr`` and ``kr``; ``window = (left, right)``."""
    qmin, qmax, qsmin, qsmax = qr
    kmin, kmax, ksmin, ksmax = kr
    left, right = window
    ok = qmin <= qmax  # a block with no valid row has qmin > qmax
    if CAUSAL:
        ok = ok & (kmin <= qmax)
    if HAS_WINDOW:
        ok = ok & (kmin - qmax <= right) & (qmin - kmax <= left)
    if HAS_SEG:
        ok = ok & (ksmin <= qsmax) & (qsmin <= ksmax)
    return ok


@triton.jit
def allowed_mask(qpos, kpos, qvalid, kvalid, window, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Elementwise ``allowed(i, j)`` (docs/api.md#flash_attention), without segments, for a
    tile whose rows are queries (``qpos``) and columns keys (``kpos``);
    ``window = (left, right)``."""
    left, right = window
    m = qvalid[:, None] & kvalid[None, :]
    if CAUSAL:
        m = m & (kpos[None, :] <= qpos[:, None])
    if HAS_WINDOW:
        d = qpos[:, None] - kpos[None, :]
        m = m & (d <= left) & (-d <= right)
    return m


@triton.jit
def allowed_mask_t(
    kpos, qpos, kvalid, qvalid, window, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr, LIMITS: tl.constexpr
):
    """``allowed_mask`` for a transposed tile: rows are keys, columns
    queries.  ``LIMITS`` (offset positions, for a caller that never stores
    a key row past the end: the dK/dV kernel): one compare of the keys'
    positions with :func:`query_limits`, the keys' validity untested."""
    left, right = window
    if LIMITS:
        klim = kpos if CAUSAL else tl.zeros_like(kpos)
        m = klim[:, None] <= query_limits(qpos, qvalid, CAUSAL)[None, :]
    else:
        m = kvalid[:, None] & qvalid[None, :]
        if CAUSAL:
            m = m & (kpos[:, None] <= qpos[None, :])
    if HAS_WINDOW:
        d = qpos[None, :] - kpos[:, None]
        m = m & (d <= left) & (-d <= right)
    return m


@triton.jit
def query_limits(qpos, qvalid, CAUSAL: tl.constexpr):
    """Offset positions ``qpos`` of a query block with their validity folded
    in, so that one compare ``key_limits[:, None] <= query_limits[None, :]``
    (key limits: ``kpos`` when causal, else 0) is ``qvalid`` (and ``kpos <=
    qpos`` when causal): an invalid row gets the lowest int32 (or -1), which
    offset positions (indices plus a piece's offset) never reach.  Why: on
    sm_90 the valid masks ANDed into every score tile of the dK/dV loop cost
    as much as the rest of its masking (head dim 64: a run masked that way
    took 601 us where the one compare took 414)."""
    if CAUSAL:
        lim = tl.where(qvalid, qpos, -2147483648)
    else:
        lim = tl.where(qvalid, 0, -1)
    return lim


@triton.jit
def mask_scores(
    s,
    row_ids,
    col_ids,
    window,
    MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SEG: tl.constexpr,
    KEY_ROWS: tl.constexpr,
    LIMITS: tl.constexpr,
):
    """``s`` with ``-inf`` where a pair is not allowed: rows are queries and
    columns keys, or the transpose with ``KEY_ROWS``.  ``row_ids = (pos,
    seg, valid)`` of the rows, ``col_ids`` of the columns.  Without ``MASK``
    the block lies wholly inside the allowed positions and the valid rows
    and columns: only segment ids are tested.  ``LIMITS``: with
    ``KEY_ROWS``, validity as :func:`allowed_mask_t` takes it."""
    rpos, rseg, rvalid = row_ids
    cpos, cseg, cvalid = col_ids
    if MASK:
        if KEY_ROWS:
            allowed = allowed_mask_t(rpos, cpos, rvalid, cvalid, window, CAUSAL, HAS_WINDOW, LIMITS)
        else:
            allowed = allowed_mask(rpos, cpos, rvalid, cvalid, window, CAUSAL, HAS_WINDOW)
        if HAS_SEG:
            allowed = allowed & (rseg[:, None] == cseg[None, :])
        s = tl.where(allowed, s, float("-inf"))
    elif HAS_SEG:
        s = tl.where(rseg[:, None] == cseg[None, :], s, float("-inf"))
    return s


@triton.jit
def logits(qk, bias_tile, scaling, HAS_CAP: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Base-2 logits of a tile, and tanh of the capped logits (for the cap's
    derivative; ``qk`` itself when there is no cap).  ``scaling = (scale,
    qk_scale, cap)``, ``qk_scale = scale * LOG2E``; ``bias_tile`` is read
    only with ``HAS_BIAS``."""
    scale, qk_scale, cap = scaling
    t = qk
    if HAS_CAP or HAS_BIAS:
        s = qk * scale
        if HAS_CAP:
            t = tanh(s / cap)
            s = cap * t
        if HAS_BIAS:
            s += bias_tile
        s = s * LOG2E
    else:
        s = qk * qk_scale
    return s, t


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
def block_positions(
    POS_b, SEG_b, OFF, offs, valid, first, last, chunk,
    NP: tl.constexpr, POS_MODE: tl.constexpr, HAS_SEG: tl.constexpr,
):  # fmt: skip
    """Positions and segment ids of a program's own block of indices
    ``offs`` (``first`` to ``last``, across pieces of ``chunk``) with their
    ``id_ranges``: ``(pos, seg, ranges)``.  ``POS_b``/``SEG_b``: this batch
    row of the explicit positions and of the segment ids (read only in the
    modes that have them)."""
    if POS_MODE == 0:
        pos = offset_positions(offs, OFF, chunk, NP)
        pmin = offset_positions(first, OFF, chunk, NP)
        pmax = offset_positions(last, OFF, chunk, NP)
    else:
        pos = tl.load(POS_b + offs, mask=valid, other=0).to(tl.int32)
        pmin, pmax = value_range(pos, valid)
    if HAS_SEG:
        seg = tl.load(SEG_b + offs, mask=valid, other=0).to(tl.int32)
        smin, smax = value_range(seg, valid)
    else:
        seg = pos
        smin, smax = pmin, pmax
    return pos, seg, (pmin, pmax, smin, smax)


@triton.jit
def block_ids(POS_b, SEG_b, offs, valid, off, POS_MODE: tl.constexpr, HAS_SEG: tl.constexpr):
    """Positions and segment ids ``(pos, seg)`` of a block that a loop
    visits: indices ``offs`` of one piece, whose offset is ``off``.  Without
    segment ids the positions stand in."""
    if POS_MODE == 0:
        pos = offs + off
    else:
        pos = tl.load(POS_b + offs, mask=valid, other=0).to(tl.int32)
    if HAS_SEG:
        seg = tl.load(SEG_b + offs, mask=valid, other=0).to(tl.int32)
    else:
        seg = pos
    return pos, seg


@triton.jit
def visible_key_range(qr, window, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Key positions a query block (its ``id_ranges`` ``qr``) can see,
    ``[lo_pos, hi_pos]``, and those every one of its rows sees,
    ``[full_lo, full_hi]``."""
    qmin, qmax, _, _ = qr
    left, right = window
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


@triton.jit
def visible_query_range(kr, window, CAUSAL: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Query positions that can see a key block (its ``id_ranges`` ``kr``),
    ``[lo_pos, hi_pos]``, and those that see every one of its keys,
    ``[full_lo, full_hi]``: the mirror of ``visible_key_range``."""
    kmin, kmax, _, _ = kr
    left, right = window
    lo_pos = -POS_INF
    hi_pos = POS_INF
    full_lo = -POS_INF
    full_hi = POS_INF
    if CAUSAL:
        lo_pos = kmin
        full_lo = kmax
    if HAS_WINDOW:
        lo_pos = tl.maximum(lo_pos, kmin - right)
        hi_pos = kmax + left
        full_lo = tl.maximum(full_lo, kmax - right)
        full_hi = kmin + left
    return lo_pos, hi_pos, full_lo, full_hi
