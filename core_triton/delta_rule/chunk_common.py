"""Device helpers of the chunk-parallel delta-rule kernels.

Layouts (contiguous, time-first, rows of the flattened ``[B*T]`` axis):
``q, k [B*T, HK, K]``, ``v [B*T, HV, V]``, ``beta [B*T, HV]``, ``gc [B*T,
HV]`` (scalar gates) or ``[B*T, HV, K]`` (per-channel gates): the
inclusive cumsum of the log decays inside each chunk (float32), so that
``b[i] - b[j]`` is the log decay from token ``j`` to token ``i`` of a
chunk.  Per-chunk matrices (``aqk``, ``gkk``, ``tinv``, and the backward's
``dp``/``dg``) are ``[B*T, HV, BT]``: row ``i`` of a chunk holds its ``BT``
columns ``j`` (chunk-local).  Chunks and their state slots are those of
core_triton.common.sequences.

Decays are only ever formed as ``exp(b[i] - b[j])`` with token ``j`` no
later than token ``i`` (at most 1), never as ``exp(-b[j])``, which
overflows for strong gates.  Per-channel gates cannot factor the pairwise
product ``sum_k a_i[k] c_j[k] exp(b_i[k] - b_j[k])`` into one matrix
product; blocks of ``BC`` rows do: for rows of block ``I`` and columns of
an earlier block, through the log decay ``b_r`` of block ``I``'s first
row, ``exp(b_i - b_r) * exp(b_r - b_j)`` (both at most 1).  The diagonal
blocks go through their middle row ``m`` the same way (diagonal_split):
``exp(b_i - b_m)`` then lies on both sides of 1, so only where every
``|b_i - b_m|`` of the block's K tile is at most ``DIAG_SPLIT`` (both
factors normal float32 numbers, their products finite); a block with
stronger decays is summed column by column, exactly as before.
"""

import triton
import triton.language as tl

from core_triton.common.kernel_helpers import dot
from core_triton.common.sequences import chunk_of_slot, sequence_chunks

# The largest |b_i - b_m| a diagonal block takes as a product through its
# middle row: exp(+-60) lies well inside float32's normal range (exp(+-87)),
# so the factors and the products of the kept (i >= j) pairs neither
# overflow nor lose precision to subnormals.  Decays of about 7.5 a token in
# some channel (over half a 16-row block) pass it; those blocks take the
# column loop.
DIAG_SPLIT = tl.constexpr(60.0)


@triton.jit
def slot_chunk(cu_seqlens, chunk_offsets, i_s, i_bh, T, N, n_iter, NT, NS, HK: tl.constexpr,
               HV: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr):  # fmt: skip
    """What a program of chunk slot ``i_s`` and batch row x value head
    ``i_bh`` takes (the per-chunk kernels): ``(i_h, i_hk, ts, te, slot)``,
    its value head, key head, its chunk's rows ``[ts, te)`` (empty for a
    spare slot of packed input) and the chunk's state slot
    (core_triton.common.sequences.chunk_of_slot)."""
    i_b = i_bh // HV
    i_h = i_bh % HV
    _, _, _, ts, te, slot = chunk_of_slot(
        cu_seqlens, chunk_offsets, i_s, i_b, T, N, n_iter, NT, NS, BT, IS_VARLEN
    )
    return i_h, i_h // (HV // HK), ts, te, slot


@triton.jit
def rows_tile(p, o_t, m_t, H: tl.constexpr, i_h, D: tl.constexpr, o_d, m_d):
    """``[len(o_t), len(o_d)]`` tile of ``p[row, i_h, d]`` (a ``[rows, H,
    D]`` tensor), 0 where masked."""
    return tl.load(p + (o_t[:, None] * H + i_h) * D + o_d[None, :], mask=m_t[:, None] & m_d[None, :], other=0)


@triton.jit
def rows_tile_t(p, o_t, m_t, H: tl.constexpr, i_h, D: tl.constexpr, o_d, m_d):
    """The same tile transposed, ``[len(o_d), len(o_t)]``, loaded as such
    (no ``tl.trans`` of a product: see linear_attn/chunk_bwd_dqk.py)."""
    return tl.load(p + (o_t[None, :] * H + i_h) * D + o_d[:, None], mask=m_d[:, None] & m_t[None, :], other=0)


@triton.jit
def decayed_keys_t(k, gc, b_r, o_j, m_j, HK: tl.constexpr, HV: tl.constexpr, i_hk, i_h,
                   K: tl.constexpr, o_k, m_k):  # fmt: skip
    """``(k_j * exp(b_r - b_j))^T [BK, len(o_j)]`` float32: rows ``o_j``'s
    keys decayed to a later row ``r`` (log decay ``b_r [BK]``), transposed
    for a product's right side; 0 where masked."""
    b_bjt = rows_tile_t(gc, o_j, m_j, HV, i_h, K, o_k, m_k)
    b_kjt = rows_tile_t(k, o_j, m_j, HK, i_hk, K, o_k, m_k).to(tl.float32)
    return b_kjt * tl.exp(tl.where(m_j[None, :], b_r[:, None] - b_bjt, 0.0))


@triton.jit
def diagonal_split(gc, b_b, m_t, ts, te, I, i_h, HV: tl.constexpr, K: tl.constexpr,
                   BC: tl.constexpr, o_k, m_k):  # fmt: skip
    """For the diagonal block ``I`` of a chunk (rows ``m_t`` of it inside the
    chunk, their log decays ``b_b [BC, BK]`` on this K tile): ``(fits, b_m,
    e, f)`` with ``b_m [BK]`` the log decay of the block's middle row (kept
    inside the chunk), ``e = exp(b_t - b_m)`` and ``f = exp(b_m - b_t)``
    ``[BC, BK]`` (1 past the chunk's end), so that ``e_i * f_j = exp(b_i -
    b_j)``; ``fits``: every ``|b_t - b_m|`` is at most ``DIAG_SPLIT``, else
    the factors (clamped there) are not to be used."""
    r = tl.minimum(ts + I * BC + BC // 2, te - 1)
    b_m = tl.load(gc + (r * HV + i_h) * K + o_k, mask=m_k, other=0)
    d = tl.where(m_t[:, None], b_b - b_m[None, :], 0.0)
    fits = tl.max(tl.max(tl.abs(d), axis=1), axis=0) <= DIAG_SPLIT
    return fits, b_m, tl.exp(tl.minimum(d, DIAG_SPLIT)), tl.exp(tl.minimum(-d, DIAG_SPLIT))


@triton.jit
def diagonal_columns(
    q, k, gc, b_q, b_ki, b_bi, acc_q, acc_k, ts, te, i_h, i_hk,
    J, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, o_k, m_i,
):  # fmt: skip
    """``acc_q``, ``acc_k`` plus diagonal block ``J``'s ``P`` and ``G`` on
    this K tile, summed column by column (``exp(b_i - b_j)`` per channel
    formed for rows ``i >= j`` only): the blocks whose decays are too strong
    for chunk_common.diagonal_split."""
    o_c = tl.arange(0, BC)
    # Column by column: exp(b_i - b_j) per channel, rows i >= j.
    for jj in range(0, BC):
        row_j = ts + J * BC + jj
        m_kj = o_k < tl.where(row_j < te, K, 0)  # (a vector test: the interpreter refuses a scalar in a mask)
        b_kj = tl.load(k + (row_j * HK + i_hk) * K + o_k, mask=m_kj, other=0).to(tl.float32)
        b_bj = tl.load(gc + (row_j * HV + i_h) * K + o_k, mask=m_kj, other=0)
        seen = (o_c >= jj) & m_i
        e = tl.exp(tl.where(seen[:, None], b_bi - b_bj[None, :], float("-inf")))
        col = o_c[None, :] == jj
        acc_q += tl.where(col, tl.sum(b_q * b_kj[None, :] * e, axis=1)[:, None], 0.0)
        acc_k += tl.where(col, tl.sum(b_ki * b_kj[None, :] * e, axis=1)[:, None], 0.0)
    return acc_q, acc_k


@triton.jit
def diagonal_tile(
    q, k, gc, b_q, b_ki, b_bi, acc_q, acc_k, ts, te, i_h, i_hk, I, o_i, m_i,
    HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BC: tl.constexpr, o_k, m_k, PREC: tl.constexpr,
):  # fmt: skip
    """``acc_q``, ``acc_k`` plus diagonal block ``I``'s ``P`` and ``G`` on
    this K tile (rows ``o_i``; their ``q``, ``k`` and log decays ``b_q``,
    ``b_ki``, ``b_bi`` ``[BC, BK]`` float32): products through the block's
    middle row where diagonal_split allows them, else diagonal_columns.
    Unmasked: the caller keeps the lower triangle."""
    fits, b_m, e_i, _ = diagonal_split(gc, b_bi, m_i, ts, te, I, i_h, HV, K, BC, o_k, m_k)
    if fits:
        # f transposed, from transposed loads (no tl.trans in registers).
        b_bt = rows_tile_t(gc, o_i, m_i, HV, i_h, K, o_k, m_k)
        f_t = tl.exp(tl.minimum(tl.where(m_i[None, :], b_m[:, None] - b_bt, 0.0), DIAG_SPLIT))
        b_kjt = rows_tile_t(k, o_i, m_i, HK, i_hk, K, o_k, m_k).to(tl.float32) * f_t
        acc_q += dot(b_q * e_i, b_kjt, PREC)
        acc_k += dot(b_ki * e_i, b_kjt, PREC)
    else:
        acc_q, acc_k = diagonal_columns(q, k, gc, b_q, b_ki, b_bi, acc_q, acc_k, ts, te, i_h, i_hk,
                                        I, HK, HV, K, BC, o_k, m_i)  # fmt: skip
    return acc_q, acc_k


@triton.jit
def unit_lower_inverse(L, BC: tl.constexpr, EXACT: tl.constexpr):
    """``(I + L)^-1`` of a strictly lower triangular ``[BC, BC]`` float32
    tile.

    ``EXACT`` (float32 inputs): forward substitution, row ``i`` of the
    inverse is ``e_i - sum_j L[i, j] T[j, :]`` over the rows above it.
    Otherwise (half inputs) the product ``(I - L)(I + L^2)(I + L^4)...``
    (``L^BC = 0``): ``2 (log2(BC) - 1)`` float32 products instead of ``BC -
    1`` dependent steps with two cross-warp sums each (H100, B4 T4k HV32
    K=V=128 bf16: the forward's intra kernel 0.41 ms against 0.46 for scalar
    gates, 2.48 against 2.93 for per-channel ones).  Its partial sums grow
    where keys repeat (for ``L`` near all ones below the diagonal, up to
    about 2^(BC-2) times the inverse's entries), so it can lose about 1e-3
    there: below the half inputs' own rounding and the tf32 products that
    use the inverse (tests: ``test_repeated_keys_half_precision``)."""
    r = tl.arange(0, BC)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    if EXACT:
        inv = eye
        for i in range(1, BC):
            l_row = tl.sum(tl.where(r[:, None] == i, L, 0.0), axis=0)
            new = tl.where(r == i, 1.0, 0.0) - tl.sum(l_row[:, None] * inv, axis=0)
            inv = tl.where(r[:, None] == i, new[None, :], inv)
    else:
        inv = eye - L
        power = L
        for s in tl.static_range(1, 6):
            if (1 << s) < BC:
                power = dot(power, power, "ieee")
                inv = inv + dot(inv, power, "ieee")
    return inv


@triton.jit
def state_tile(
    cu_seqlens,
    chunk_offsets,
    seq_order,
    T,
    NT,
    NS,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """What a program of a chunk walk (grid ``(V tiles, sequences x value
    heads)``: chunk_fwd_walk.py, chunk_fwd_state.py, chunk_bwd_state.py)
    walks: ``(i_h, bos, eos, slot0, n_chunks, o_k, o_v, m_k, m_v, m_kv,
    off_kv, state_row)``, its value head, its sequence's rows and chunk slots
    (core_triton.common.sequences), and its ``[BK, BV]`` tile of the
    ``[K, V]`` state (all of K): offsets, masks, offsets inside a state and
    the first element of its row of ``[N, HV, K, V]`` states.

    Packed input: grid row ``i`` takes sequence ``seq_order[i // HV]``
    (sequences longest first: sequences.sequence_order_kernel), so that
    the walks of the longest sequences start first and the GPU's last wave
    holds short ones (H100, B1 T32k in 16 documents of 64 to 6528 tokens:
    in index order the walks of the longest started in the middle of the
    launch)."""
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_h = i_nh % HV
    if IS_VARLEN:
        # (clamped: a walk stays in its tensors whatever the order holds)
        i_n = tl.load(seq_order + i_nh // HV)
        i_n = tl.minimum(tl.maximum(i_n, 0), tl.num_programs(1) // HV - 1)
    else:
        i_n = i_nh // HV
    bos, eos, slot0, n_chunks = sequence_chunks(cu_seqlens, chunk_offsets, i_n, T, NT, NS, BT, IS_VARLEN)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    off_kv = o_k[:, None].to(tl.int64) * V + o_v[None, :]
    state_row = (i_n * HV + i_h).to(tl.int64) * K * V
    return i_h, bos, eos, slot0, n_chunks.to(tl.int32), o_k, o_v, m_k, m_v, m_kv, off_kv, state_row
