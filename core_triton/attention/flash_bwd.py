"""Flash-attention backward kernels (FlashAttention-2, no atomics).

Given the forward's ``lse [B, HQ, Tq]`` (natural log, ``-inf`` for empty
rows) and ``delta = rowsum(dO * O) [B, HQ, Tq]`` float32 (less the ``lse``
cotangent when there is one; the dQ kernel makes it), the probabilities are
recomputed block by block as
``p = exp(s - lse)`` and

    dV += p^T dO,   dP = dO V^T,   dS = p * (dP - delta),
    dQ += scale * dS' K,   dK += scale * dS'^T Q,   dbias = sum dS,

with ``dS' = dS * (1 - tanh^2)`` under a logits soft cap.  Because ``lse``
comes in from outside and ``delta`` from the output, a ring passes the
*global* ``lse`` and output (so every step's ``delta`` is the global one)
and each (query shard, key shard) pair gives its exact share of the
gradients.

* ``flash_bwd_dq_kernel`` (first): one program owns ``BM`` queries of one
  (batch, query head) and walks the key blocks, as the forward does; it
  also writes ``delta`` for its rows (from the ``o`` and ``dO`` tiles, less
  ``dlse``), which the launches after it read.  Grid ``(cdiv(Tq, BM),
  B*HQ)`` or its transpose (``ORDER``, flash_common.block_and_row).
* ``flash_bwd_dkdv_kernel``: one program owns ``BN`` keys of one (batch,
  key head) and walks the query blocks that can see them, for every query
  head of its group (grouped-query dK/dV are summed in registers).  Grid
  ``(cdiv(Tk, BN), B*H*splits)`` or its transpose (``ORDER``).  With few
  such programs (one sequence, few key heads) the group's query heads are
  split among ``splits`` programs per key block, each writing float32
  partial sums ``[splits, B, Tk, H, D]``, and ``flash_bwd_split_sum_kernel``
  adds them up in a fixed order.
* ``flash_bwd_dbias_kernel`` (only when the bias needs a gradient): one
  program owns a ``BM x BN`` tile of one ``(b, h)`` slice of the bias and
  sums ``dS`` over the batches and heads that the bias is broadcast over,
  in registers and in a fixed order (no atomics: the same bits every run
  and in both bindings).  Output: the bias's own shape ``[Bb, Hb, Tq, Tk]``
  in its dtype, never a float32 ``[B, HQ, Tq, Tk]`` buffer.  Grid
  ``(cdiv(Tq, BM), cdiv(Tk, BN), Bb*Hb)``.

Transposed tiles (``[keys, queries]``) are computed directly as
``dot(k, trans(q))``; no matrix-multiply result is ever transposed (Triton
3.4-3.7 miscompile that on Hopper).
"""

import triton
import triton.language as tl

from core_triton.attention.flash_common import (
    DBIAS_GROUPS,
    DKDV_GROUPS,
    DQ_GROUPS,
    LOG2E,
    OB,
    OH,
    OT,
    allowed_mask,
    block_and_row,
    block_can_be_allowed,
    block_ids,
    block_positions,
    gated_rows,
    hinted,
    hinted_strides,
    id_ranges,
    load_tile,
    logits,
    mask_scores,
    offset_positions,
    piece_runs,
    range_runs,
    row_programs,
    store_tile,
    visible_key_range,
    visible_query_range,
)
from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit


@triton.jit
def _dkdv_blocks(
    state, kblock, kr, run, ptrs, strides, scaling, window, SIZES, FEATURES, MASK: tl.constexpr, EDGE_STAGES
):
    """Query blocks ``lo, lo + BM, ... < hi`` of the piece of queries ``[..,
    end)`` whose offset is ``qoff``, ``run = (lo, hi, end, qoff)``, against
    this program's keys, added to ``state = (dk [BN, BD], dv [BN, BDV])``
    (float32); returns the new state.

    ``kblock = (k [BN, BD], v [BN, BDV], kpos, kseg, kvalid, kcols)``
    (vectors [BN]; ``kcols`` the keys' bias columns, int64) and ``kr`` its
    ``id_ranges``; ``ptrs = (Q_bh, DO_bh, LSE_bh, DELTA_bh, QPOS_b, QSEG_b,
    BIAS_bh)`` point at this (batch, query head); ``strides = (qt, qd, dot,
    dod, bias m, bias n)``; ``scaling``, ``window``, ``FEATURES`` and
    ``MASK`` as in the forward's ``_fwd_blocks``; ``SIZES = (D, DV, BD,
    BDV, BM)``."""
    # Constexprs are named one by one, with the annotation: ``a, b = T``
    # or ``a = T[i]`` would make run-time values of them.
    D: tl.constexpr = SIZES[0]
    DV: tl.constexpr = SIZES[1]
    BD: tl.constexpr = SIZES[2]
    BDV: tl.constexpr = SIZES[3]
    BM: tl.constexpr = SIZES[4]
    TEST: tl.constexpr = FEATURES[0]
    CAUSAL: tl.constexpr = FEATURES[1]
    HAS_WINDOW: tl.constexpr = FEATURES[2]
    HAS_CAP: tl.constexpr = FEATURES[3]
    HAS_BIAS: tl.constexpr = FEATURES[4]
    # With ranges (FEATURES[9]) the unmasked middle run holds only tiles
    # whose pairs share one segment (flash_common.range_runs): no ids there.
    HAS_SEG: tl.constexpr = FEATURES[5] and (MASK or not FEATURES[9])
    POS_MODE: tl.constexpr = FEATURES[6]
    ROW64: tl.constexpr = FEATURES[7]
    DOT_PREC: tl.constexpr = FEATURES[8]
    # Offset positions, masked: the queries' validity folds into their
    # positions (flash_common.allowed_mask_t's LIMITS) and a partial block's
    # rows past the end read the piece's last row (in bounds, no load mask;
    # the score mask drops them).  Keys past the end need no mask here: loaded as
    # zeros, each key row's gradients depend on that row alone, and those
    # rows are never stored.  Explicit positions may take any int32: masks
    # as before.
    LIMITS: tl.constexpr = MASK and POS_MODE == 0
    LOAD_MASK: tl.constexpr = MASK and POS_MODE != 0
    dk, dv = state
    k, v, kpos, kseg, kvalid, kcols = kblock
    lo, hi, end, qoff = run
    Q_bh, DO_bh, LSE_bh, DELTA_bh, QPOS_b, QSEG_b, BIAS_bh = ptrs
    stride_qt, stride_qd, stride_dot, stride_dod, stride_bm, stride_bn = strides
    k_ids = (kpos, kseg, kvalid)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    # A ranged kernel's masked runs (a segment's edge tiles) are one or two
    # tiles: a shorter pipeline there (EDGE_STAGES; 0: the launch's own)
    # saves its set-up and registers.
    STAGES: tl.constexpr = EDGE_STAGES if MASK and FEATURES[9] and EDGE_STAGES > 0 else None
    for start in tl.range(lo, hi, BM, num_stages=STAGES):
        offs_m = start + tl.arange(0, BM)
        qvalid = offs_m < end
        qpos, qseg = block_ids(QPOS_b, QSEG_b, offs_m, qvalid, qoff, POS_MODE, HAS_SEG)
        go = True
        if TEST:
            qr = id_ranges(qpos, qseg, qvalid, HAS_SEG)
            go = block_can_be_allowed(qr, kr, window, CAUSAL, HAS_WINDOW, HAS_SEG)
        if go:
            rows = offs_m.to(tl.int64) if ROW64 else offs_m
            if LIMITS:
                rows = tl.minimum(rows, tl.maximum(end - 1, 0))
            q = load_tile(
                Q_bh + rows[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                qvalid,
                offs_d < D,
                LOAD_MASK,
                D != BD,
            )
            do = load_tile(
                DO_bh + rows[:, None] * stride_dot + offs_dv[None, :] * stride_dod,
                qvalid,
                offs_dv < DV,
                LOAD_MASK,
                DV != BDV,
            )
            if LOAD_MASK:
                lse = tl.load(LSE_bh + offs_m, mask=qvalid, other=0.0)
                delta = tl.load(DELTA_bh + offs_m, mask=qvalid, other=0.0)
            else:
                lse = tl.load(LSE_bh + rows)
                delta = tl.load(DELTA_bh + rows)
            if MASK or HAS_SEG or HAS_BIAS:
                # An empty row has lse = -inf: +inf makes its p exactly 0.
                # (Unmasked blocks without ids or bias allow every pair: no
                # row of theirs is empty.)
                lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
            else:
                lse2 = lse * LOG2E
            qk_t = dot(k, tl.trans(q), DOT_PREC)  # [BN, BM]
            bias_t = qk_t
            if HAS_BIAS:
                m64 = offs_m.to(tl.int64)
                b_ptrs = BIAS_bh + kcols[:, None] * stride_bn + m64[None, :] * stride_bm
                bias_t = load_tile(b_ptrs, kvalid, qvalid, True, MASK).to(tl.float32)
            s_t, t_t = logits(qk_t, bias_t, scaling, HAS_CAP, HAS_BIAS)
            s_t = mask_scores(
                s_t, k_ids, (qpos, qseg, qvalid), window, MASK, CAUSAL, HAS_WINDOW, HAS_SEG, True, LIMITS
            )
            p_t = tl.exp2(s_t - lse2[None, :])
            dv += dot(p_t.to(do.dtype), do, DOT_PREC)
            dp_t = dot(v, tl.trans(do), DOT_PREC)
            ds_t = p_t * (dp_t - delta[None, :])
            if HAS_CAP:
                ds_t = ds_t * (1.0 - t_t * t_t)
            dk += dot(ds_t.to(q.dtype), q, DOT_PREC)
    return dk, dv


@jit(sizes=("Tq", "Tk", "q_chunk", "k_chunk", "splits"), groups=DKDV_GROUPS)
def flash_bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    QOFF,
    KOFF,
    QPOS,
    KPOS,
    QSEG,
    KSEG,
    QRANGE,
    KRANGE,
    BIAS,
    scale_cap,
    window,
    Tq,
    Tk,
    q_chunk,
    k_chunk,
    group,
    H,
    splits,
    stride_q,
    stride_k,
    stride_v,
    stride_do,
    stride_aux,
    DK_IN,
    DV_IN,
    DK_OUT,
    DV_OUT,
    DIMS: tl.constexpr,
    OPTIONS: tl.constexpr,
    GATE: tl.constexpr,
    SPLIT: tl.constexpr,
    ORDER: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    EDGE_STAGES: tl.constexpr,
):
    # The plan's constants by name (flash_common.DKDV_GROUPS; its launch packs them).
    D: tl.constexpr = DIMS[0]
    DV: tl.constexpr = DIMS[1]
    BD: tl.constexpr = DIMS[2]
    BDV: tl.constexpr = DIMS[3]
    CAUSAL: tl.constexpr = OPTIONS[0]
    HAS_WINDOW: tl.constexpr = OPTIONS[1]
    HAS_CAP: tl.constexpr = OPTIONS[2]
    HAS_BIAS: tl.constexpr = OPTIONS[3]
    HAS_SEG: tl.constexpr = OPTIONS[4]
    HAS_RANGE: tl.constexpr = OPTIONS[5]
    POS_MODE: tl.constexpr = OPTIONS[6]
    TEST: tl.constexpr = OPTIONS[7]
    NQP: tl.constexpr = OPTIONS[8]
    NKP: tl.constexpr = OPTIONS[9]
    ROW64: tl.constexpr = OPTIONS[10]
    DIV16: tl.constexpr = OPTIONS[11]
    DOT_PREC: tl.constexpr = OPTIONS[12]
    # The logits' scale and soft cap, the window's bounds: one argument each.
    scale, cap = scale_cap
    left, right = window
    # GATE: 0, a launch of its own; 1 or 2, one of a gated pair (flash.py's
    # gated_pair), which skips the blocks without a row of its kind
    # (flash_common.gated_rows) and writes DK_OUT/DV_OUT in full for the others.
    # DK_IN/DV_IN: the same buffers as DK_OUT/DV_OUT, passed so that the second
    # launch can alias them; never read.
    # DIV16: which strides are multiples of 16 (flash_common.HINTED; the
    # batch and head strides align tile bases for JAX launches, as in the
    # forward).
    # Each tensor's strides come as one argument (flash_fwd_kernel).
    stride_qb, stride_qt, stride_qh, stride_qd = stride_q
    stride_kb, stride_kt, stride_kh, stride_kd = stride_k
    stride_vb, stride_vt, stride_vh, stride_vd = stride_v
    stride_dob, stride_dot, stride_doh, stride_dod = stride_do
    stride_pqb, stride_pkb, stride_sqb, stride_skb, stride_bb, stride_bh, stride_bm, stride_bn = stride_aux
    stride_qt, stride_kt, stride_vt, stride_dot, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, \
        stride_vh, stride_dob, stride_doh = hinted_strides(
            DIV16, stride_qt, stride_kt, stride_vt, stride_dot, stride_qb, stride_qh, stride_kb, stride_kh,
            stride_vb, stride_vh, stride_dob, stride_doh,
        )  # fmt: skip
    # ORDER: which program takes which key block (flash_common.block_and_row).
    pid_n, second = block_and_row(ORDER)
    # SPLIT (1 or 2): ``second`` is (batch, key head, split), and split ``s`` of
    # ``splits`` takes its share of the group's query heads and writes its
    # own float32 partial sums (flash_bwd_split_sum_kernel adds them); 2: the
    # share is one head (splits == group), a constant, so that the loop over
    # the share compiles away: a loop of a run-time count around the query
    # walk's three runs kept ~80 more registers live on sm_90 and cost the
    # Llama shape's launch about 15% (bench.probes.dkdv_bisect, flag G).
    # SPLIT 0: the outputs are dK/dV themselves, in the gradients' dtype, and
    # the kernel is compiled as if there were no split (sm_90, head dim 128,
    # the split's indices kept live spilled 608 bytes against 296).
    if SPLIT:
        split = second % splits
        pid_bh = second // splits
        if SPLIT == 2:
            per_split: tl.constexpr = 1
        else:
            per_split = group // splits
        g0 = split * per_split
    else:
        pid_bh = second
        per_split = group
        g0 = 0
    b = pid_bh // H
    h = pid_bh % H
    b64 = b.to(tl.int64)
    HQ = H * group

    offs_n = pid_n * BN + tl.arange(0, BN)
    kvalid = offs_n < Tk
    KRANGE_b = KRANGE + b64 * 2 * Tk
    if GATE != 0:
        # A block with no row of this launch's kind has nothing to do.
        if tl.max(gated_rows(KRANGE_b, offs_n, kvalid, Tk, Tq, GATE).to(tl.int32), 0) == 0:
            return
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    rows = offs_n.to(tl.int64) if ROW64 else offs_n
    kcols = offset_positions(offs_n, KOFF, k_chunk, NKP).to(tl.int64)
    last = tl.minimum(pid_n * BN + BN, Tk) - 1
    kpos, kseg, kr = block_positions(
        KPOS + b64 * stride_pkb, KSEG + b64 * stride_skb, KOFF, offs_n, kvalid, pid_n * BN, last, k_chunk,
        NKP, POS_MODE, HAS_SEG,
    )  # fmt: skip
    K_bh = K + b64 * stride_kb + h.to(tl.int64) * stride_kh
    V_bh = V + b64 * stride_vb + h.to(tl.int64) * stride_vh
    k = load_tile(
        K_bh + rows[:, None] * stride_kt + offs_d[None, :] * stride_kd, kvalid, offs_d < D, True, D != BD
    )
    v = load_tile(
        V_bh + rows[:, None] * stride_vt + offs_dv[None, :] * stride_vd, kvalid, offs_dv < DV, True, DV != BDV
    )
    dk = tl.zeros([BN, BD], dtype=tl.float32)
    dv = tl.zeros([BN, BDV], dtype=tl.float32)
    qk_scale = scale * LOG2E

    visible = visible_query_range(kr, (left, right), CAUSAL, HAS_WINDOW)
    # The kernel's constexprs as the loop helper takes them (named with the
    # annotation: a plain assignment would make run-time values of them).
    SIZES: tl.constexpr = (D, DV, BD, BDV, BM)
    FEATURES: tl.constexpr = (
        TEST,
        CAUSAL,
        HAS_WINDOW,
        HAS_CAP,
        HAS_BIAS,
        HAS_SEG,
        POS_MODE,
        ROW64,
        DOT_PREC,
        HAS_RANGE,
    )

    kblock = (k, v, kpos, kseg, kvalid, kcols)
    strides = (stride_qt, stride_qd, stride_dot, stride_dod, stride_bm, stride_bn)
    scaling = (scale, qk_scale, cap)
    window = (left, right)
    # From 0: with a constant share of one the loop folds away.
    for i in range(0, per_split):
        hq = (h * group + g0 + i).to(tl.int64)
        Q_bh = Q + b64 * stride_qb + hq * stride_qh
        DO_bh = DO + b64 * stride_dob + hq * stride_doh
        LSE_bh = LSE + (b64 * HQ + hq) * Tq
        DELTA_bh = DELTA + (b64 * HQ + hq) * Tq
        QPOS_b = QPOS + b64 * stride_pqb
        QSEG_b = QSEG + b64 * stride_sqb
        BIAS_bh = BIAS + b64 * stride_bb + hq * stride_bh
        for p in tl.static_range(NQP):
            end, qoff, t = piece_runs(p, NQP, q_chunk, Tq, QOFF, visible, BM, POS_MODE)
            # Packed input and segment ids: only the query blocks of this
            # block's segments.
            t = range_runs(t, KRANGE_b, offs_n, kvalid, Tk, BM, HAS_RANGE)
            qptrs = (Q_bh, DO_bh, LSE_bh, DELTA_bh, QPOS_b, QSEG_b, BIAS_bh)
            # Three runs of blocks: edge blocks with the mask, fully allowed ones
            # without it, edge blocks again (explicit positions: one masked
            # run).
            for part in tl.static_range(3 if POS_MODE == 0 else 1):
                dk, dv = _dkdv_blocks(
                    (dk, dv), kblock, kr, (t[part], t[part + 1], end, qoff), qptrs, strides, scaling, window,
                    SIZES, FEATURES, part != 1, EDGE_STAGES,
                )  # fmt: skip

    dk = dk * scale
    if SPLIT:
        # Outputs [splits, B, Tk, H, D]; B from the grid (B * H * splits
        # programs on the second axis).  The split is read again from the
        # program's index rather than kept live through the loops.
        _, again = block_and_row(ORDER)
        batches = row_programs(ORDER) // (H * splits)
        out_rows = (((again % splits).to(tl.int64) * batches + b64) * Tk + offs_n) * H + h
    else:
        out_rows = (b64 * Tk + offs_n) * H + h
    store_tile(
        DK_OUT + out_rows[:, None] * D + offs_d[None, :],
        dk.to(DK_OUT.dtype.element_ty),
        kvalid,
        offs_d < D,
        True,
        D != BD,
    )
    store_tile(
        DV_OUT + out_rows[:, None] * DV + offs_dv[None, :],
        dv.to(DV_OUT.dtype.element_ty),
        kvalid,
        offs_dv < DV,
        True,
        DV != BDV,
    )


@jit(sizes=("n_k", "n_v", "splits"))
def flash_bwd_split_sum_kernel(DK_PART, DV_PART, n_k, n_v, splits, DK_OUT, DV_OUT, BLOCK: tl.constexpr):
    """dK ``[B, Tk, H, D]`` and dV ``[B, Tk, H, DV]`` (``n_k`` and ``n_v``
    elements, the gradients' dtype) as the sums of the dK/dV kernel's
    float32 partials ``[splits, B, Tk, H, D]`` / ``[..., DV]``, added in
    split order (the same bits every run).  Grid ``(cdiv(max(n_k, n_v),
    BLOCK), 2)``: axis 1 picks dK or dV."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if tl.program_id(1) == 0:
        _split_sum(DK_PART, DK_OUT, offs, n_k, splits)
    else:
        _split_sum(DV_PART, DV_OUT, offs, n_v, splits)


@triton.jit
def _split_sum(PART, OUT, offs, n, splits):
    valid = offs < n
    acc = tl.load(PART + offs, mask=valid, other=0.0)
    part = PART + offs
    for _ in range(1, splits):
        # One split's n elements on: a pointer step, never an int32 product.
        part += n
        acc += tl.load(part, mask=valid, other=0.0)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=valid)


@triton.jit
def _dq_blocks(
    dq, qblock, qr, run, ptrs, strides, scaling, window, SIZES, FEATURES, MASK: tl.constexpr, EDGE_STAGES
):
    """Key blocks of ``run`` against this program's queries, added to ``dq
    [BM, BD]`` (float32), which it returns.  ``qblock = (q [BM, BD], do [BM,
    BDV], lse2, delta, qpos, qseg, qvalid, offs_m)`` (vectors [BM]; ``lse2``
    the base-2 normaliser, ``+inf`` for an empty row); the other arguments
    as in the forward's ``_fwd_blocks``."""
    # Constexprs are named one by one, with the annotation: ``a, b = T``
    # or ``a = T[i]`` would make run-time values of them.
    D: tl.constexpr = SIZES[0]
    DV: tl.constexpr = SIZES[1]
    BD: tl.constexpr = SIZES[2]
    BDV: tl.constexpr = SIZES[3]
    BN: tl.constexpr = SIZES[4]
    TEST: tl.constexpr = FEATURES[0]
    CAUSAL: tl.constexpr = FEATURES[1]
    HAS_WINDOW: tl.constexpr = FEATURES[2]
    HAS_CAP: tl.constexpr = FEATURES[3]
    HAS_BIAS: tl.constexpr = FEATURES[4]
    # With ranges (FEATURES[9]) the unmasked middle run holds only tiles
    # whose pairs share one segment (flash_common.range_runs): no ids there.
    HAS_SEG: tl.constexpr = FEATURES[5] and (MASK or not FEATURES[9])
    POS_MODE: tl.constexpr = FEATURES[6]
    ROW64: tl.constexpr = FEATURES[7]
    DOT_PREC: tl.constexpr = FEATURES[8]
    q, do, lse2, delta, qpos, qseg, qvalid, offs_m = qblock
    lo, hi, end, koff = run
    K_bh, V_bh, KPOS_b, KSEG_b, BIAS_bh = ptrs
    stride_kt, stride_kd, stride_vt, stride_vd, stride_bm, stride_bn = strides
    q_ids = (qpos, qseg, qvalid)
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    # A ranged kernel's masked runs (a segment's edge tiles) are one or two
    # tiles: a shorter pipeline there (EDGE_STAGES; 0: the launch's own)
    # saves its set-up and registers.
    STAGES: tl.constexpr = EDGE_STAGES if MASK and FEATURES[9] and EDGE_STAGES > 0 else None
    for start in tl.range(lo, hi, BN, num_stages=STAGES):
        offs_n = start + tl.arange(0, BN)
        kvalid = offs_n < end
        kpos, kseg = block_ids(KPOS_b, KSEG_b, offs_n, kvalid, koff, POS_MODE, HAS_SEG)
        go = True
        if TEST:
            kr = id_ranges(kpos, kseg, kvalid, HAS_SEG)
            go = block_can_be_allowed(qr, kr, window, CAUSAL, HAS_WINDOW, HAS_SEG)
        if go:
            rows = offs_n.to(tl.int64) if ROW64 else offs_n
            k = load_tile(
                K_bh + rows[:, None] * stride_kt + offs_d[None, :] * stride_kd,
                kvalid,
                offs_d < D,
                MASK,
                D != BD,
            )
            v = load_tile(
                V_bh + rows[:, None] * stride_vt + offs_dv[None, :] * stride_vd,
                kvalid,
                offs_dv < DV,
                MASK,
                DV != BDV,
            )
            qk = dot(q, tl.trans(k), DOT_PREC)
            bias = qk
            if HAS_BIAS:
                cols = (offs_n + koff).to(tl.int64)
                b_ptrs = BIAS_bh + offs_m.to(tl.int64)[:, None] * stride_bm + cols[None, :] * stride_bn
                bias = load_tile(b_ptrs, qvalid, kvalid, True, MASK).to(tl.float32)
            s, t = logits(qk, bias, scaling, HAS_CAP, HAS_BIAS)
            s = mask_scores(
                s, q_ids, (kpos, kseg, kvalid), window, MASK, CAUSAL, HAS_WINDOW, HAS_SEG, False, False
            )
            p = tl.exp2(s - lse2[:, None])
            dp = dot(do, tl.trans(v), DOT_PREC)
            ds = p * (dp - delta[:, None])
            if HAS_CAP:
                ds = ds * (1.0 - t * t)
            dq += dot(ds.to(k.dtype), k, DOT_PREC)
    return dq


@jit(sizes=("Tq", "Tk", "q_chunk", "k_chunk"), groups=DQ_GROUPS)
def flash_bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    OUT,
    QOFF,
    KOFF,
    QPOS,
    KPOS,
    QSEG,
    KSEG,
    QRANGE,
    KRANGE,
    BIAS,
    scale_cap,
    window,
    Tq,
    Tk,
    q_chunk,
    k_chunk,
    group,
    HQ,
    DLSE,
    stride_q,
    stride_k,
    stride_v,
    stride_do,
    stride_aux,
    stride_o,
    DQ_IN,
    DELTA_IN,
    DQ_OUT,
    DELTA_OUT,
    DIMS: tl.constexpr,
    OPTIONS: tl.constexpr,
    GATE: tl.constexpr,
    ORDER: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    EDGE_STAGES: tl.constexpr,
):
    # The plan's constants by name (flash_common.DQ_GROUPS; its launch packs them).
    D: tl.constexpr = DIMS[0]
    DV: tl.constexpr = DIMS[1]
    BD: tl.constexpr = DIMS[2]
    BDV: tl.constexpr = DIMS[3]
    CAUSAL: tl.constexpr = OPTIONS[0]
    HAS_WINDOW: tl.constexpr = OPTIONS[1]
    HAS_CAP: tl.constexpr = OPTIONS[2]
    HAS_BIAS: tl.constexpr = OPTIONS[3]
    HAS_SEG: tl.constexpr = OPTIONS[4]
    HAS_RANGE: tl.constexpr = OPTIONS[5]
    POS_MODE: tl.constexpr = OPTIONS[6]
    TEST: tl.constexpr = OPTIONS[7]
    NQP: tl.constexpr = OPTIONS[8]
    NKP: tl.constexpr = OPTIONS[9]
    ROW64: tl.constexpr = OPTIONS[10]
    DIV16: tl.constexpr = OPTIONS[11]
    DOT_PREC: tl.constexpr = OPTIONS[12]
    HAS_DLSE: tl.constexpr = OPTIONS[13]
    # The logits' scale and soft cap, the window's bounds: one argument each.
    scale, cap = scale_cap
    left, right = window
    # GATE: 0, a launch of its own; 1 or 2, one of a gated pair (flash.py's
    # gated_pair), which skips the blocks without a row of its kind
    # (flash_common.gated_rows) and writes DQ_OUT/DELTA_OUT in full for the
    # others.  DQ_IN/DELTA_IN: the same buffers as DQ_OUT/DELTA_OUT, passed
    # so that the second launch can alias them; never read.
    # This kernel makes the backward's delta (rowsum(out * dout), less the
    # lse cotangent DLSE where HAS_DLSE) from the tiles it loads anyway and
    # writes it for the dK/dV and bias-gradient launches after it: no
    # launch of its own, and dout is read once less (out once, as before).
    # DIV16: which strides are multiples of 16 (flash_common.HINTED; the
    # batch and head strides align tile bases for JAX launches, as in the
    # forward).
    # Each tensor's strides come as one argument (flash_fwd_kernel).
    stride_qb, stride_qt, stride_qh, stride_qd = stride_q
    stride_kb, stride_kt, stride_kh, stride_kd = stride_k
    stride_vb, stride_vt, stride_vh, stride_vd = stride_v
    stride_dob, stride_dot, stride_doh, stride_dod = stride_do
    stride_pqb, stride_pkb, stride_sqb, stride_skb, stride_bb, stride_bh, stride_bm, stride_bn = stride_aux
    stride_ob, stride_ot, stride_oh, stride_od = stride_o
    stride_qt, stride_kt, stride_vt, stride_dot, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, \
        stride_vh, stride_dob, stride_doh = hinted_strides(
            DIV16, stride_qt, stride_kt, stride_vt, stride_dot, stride_qb, stride_qh, stride_kb, stride_kh,
            stride_vb, stride_vh, stride_dob, stride_doh,
        )  # fmt: skip
    # ORDER: which program takes which query block (flash_common.block_and_row).
    pid_m, pid_bh = block_and_row(ORDER)
    b = pid_bh // HQ
    hq = pid_bh % HQ
    h = hq // group
    b64 = b.to(tl.int64)

    offs_m = pid_m * BM + tl.arange(0, BM)
    qvalid = offs_m < Tq
    QRANGE_b = QRANGE + b64 * 2 * Tq
    if GATE != 0:
        # A block with no row of this launch's kind has nothing to do.
        if tl.max(gated_rows(QRANGE_b, offs_m, qvalid, Tq, Tk, GATE).to(tl.int32), 0) == 0:
            return
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    rows = offs_m.to(tl.int64) if ROW64 else offs_m
    last = tl.minimum(pid_m * BM + BM, Tq) - 1
    qpos, qseg, qr = block_positions(
        QPOS + b64 * stride_pqb, QSEG + b64 * stride_sqb, QOFF, offs_m, qvalid, pid_m * BM, last, q_chunk,
        NQP, POS_MODE, HAS_SEG,
    )  # fmt: skip
    q = load_tile(
        Q
        + b64 * stride_qb
        + hq.to(tl.int64) * stride_qh
        + rows[:, None] * stride_qt
        + offs_d[None, :] * stride_qd,
        qvalid,
        offs_d < D,
        True,
        D != BD,
    )
    do = load_tile(
        DO
        + b64 * stride_dob
        + hq.to(tl.int64) * stride_doh
        + rows[:, None] * stride_dot
        + offs_dv[None, :] * stride_dod,
        qvalid,
        offs_dv < DV,
        True,
        DV != BDV,
    )
    row_base = (b64 * HQ + hq) * Tq
    lse = tl.load(LSE + row_base + offs_m, mask=qvalid, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
    stride_ob = hinted(stride_ob, DIV16, OB)
    stride_ot = hinted(stride_ot, DIV16, OT)
    stride_oh = hinted(stride_oh, DIV16, OH)
    o = load_tile(
        OUT + b64 * stride_ob + hq.to(tl.int64) * stride_oh + rows[:, None] * stride_ot
        + offs_dv[None, :] * stride_od,
        qvalid, offs_dv < DV, True, DV != BDV,
    )  # fmt: skip
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if HAS_DLSE:
        delta -= tl.load(DLSE + row_base + offs_m, mask=qvalid, other=0.0)
    tl.store(DELTA_OUT + row_base + offs_m, delta, mask=qvalid)
    K_bh = K + b64 * stride_kb + h.to(tl.int64) * stride_kh
    V_bh = V + b64 * stride_vb + h.to(tl.int64) * stride_vh
    KPOS_b = KPOS + b64 * stride_pkb
    KSEG_b = KSEG + b64 * stride_skb
    BIAS_bh = BIAS + b64 * stride_bb + hq.to(tl.int64) * stride_bh
    dq = tl.zeros([BM, BD], dtype=tl.float32)
    qk_scale = scale * LOG2E

    visible = visible_key_range(qr, (left, right), CAUSAL, HAS_WINDOW)
    # The kernel's constexprs as the loop helper takes them (named with the
    # annotation: a plain assignment would make run-time values of them).
    SIZES: tl.constexpr = (D, DV, BD, BDV, BN)
    FEATURES: tl.constexpr = (
        TEST,
        CAUSAL,
        HAS_WINDOW,
        HAS_CAP,
        HAS_BIAS,
        HAS_SEG,
        POS_MODE,
        ROW64,
        DOT_PREC,
        HAS_RANGE,
    )

    qblock = (q, do, lse2, delta, qpos, qseg, qvalid, offs_m)
    ptrs = (K_bh, V_bh, KPOS_b, KSEG_b, BIAS_bh)
    strides = (stride_kt, stride_kd, stride_vt, stride_vd, stride_bm, stride_bn)
    scaling = (scale, qk_scale, cap)
    window = (left, right)
    for p in tl.static_range(NKP):
        end, koff, t = piece_runs(p, NKP, k_chunk, Tk, KOFF, visible, BN, POS_MODE)
        # Packed input and segment ids: only the key blocks of this block's
        # segments.
        t = range_runs(t, QRANGE_b, offs_m, qvalid, Tq, BN, HAS_RANGE)
        # Three runs of blocks: edge blocks with the mask, fully allowed ones
        # without it, edge blocks again (explicit positions: one masked
        # run).
        for part in tl.static_range(3 if POS_MODE == 0 else 1):
            dq = _dq_blocks(
                dq, qblock, qr, (t[part], t[part + 1], end, koff), ptrs, strides, scaling, window, SIZES,
                FEATURES, part != 1, EDGE_STAGES,
            )  # fmt: skip

    dq = dq * scale
    out_rows = (b64 * Tq + offs_m) * HQ + hq
    store_tile(
        DQ_OUT + out_rows[:, None] * D + offs_d[None, :],
        dq.to(DQ_OUT.dtype.element_ty),
        qvalid,
        offs_d < D,
        True,
        D != BD,
    )


@triton.jit
def _tile_positions(OFF, POS_b, offs, valid, chunk, NP: tl.constexpr, POS_MODE: tl.constexpr):
    """Positions of the indices ``offs`` of one batch row (see
    flash_common: piece offsets, or an explicit array)."""
    if POS_MODE == 0:
        pos = offset_positions(offs, OFF, chunk, NP)
    else:
        pos = tl.load(POS_b + offs, mask=valid, other=0).to(tl.int32)
    return pos


@jit(sizes=("Tq", "Tk", "q_chunk", "k_chunk", "NB"), groups=DBIAS_GROUPS)
def flash_bwd_dbias_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    QOFF,
    KOFF,
    QPOS,
    KPOS,
    QSEG,
    KSEG,
    QRANGE,
    KRANGE,
    BIAS,
    scale_cap,
    window,
    Tq,
    Tk,
    q_chunk,
    k_chunk,
    group,
    HQ,
    NB,
    NH,
    stride_q,
    stride_k,
    stride_v,
    stride_do,
    stride_aux,
    DB_OUT,
    DIMS: tl.constexpr,
    OPTIONS: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    """``dbias [Bb, Hb, Tq, Tk]`` (the bias's shape; ``Tk`` local keys, read
    from the bias at their global columns ``j + koff``): program ``(m, n,
    z)`` owns rows ``m*BM..`` and columns ``n*BN..`` of slice ``z = bb*Hb +
    bh`` and sums ``dS = p * (dP - delta)`` over the ``NB`` batches and
    ``NH`` query heads that share it (``NB`` is B for a batch-broadcast
    bias, else 1; ``NH`` likewise), batch-major, in float32 registers.
    ``dS`` is recomputed (two matrix products per pair) rather than stored
    by the dK/dV kernel: a broadcast bias would otherwise need a float32
    ``[B, HQ, Tq, Tk]`` buffer.  Pairs whose tile has no allowed entry are
    skipped; every element is written once."""
    # The plan's constants by name (flash_common.DBIAS_GROUPS; its launch packs them).
    D: tl.constexpr = DIMS[0]
    DV: tl.constexpr = DIMS[1]
    BD: tl.constexpr = DIMS[2]
    BDV: tl.constexpr = DIMS[3]
    CAUSAL: tl.constexpr = OPTIONS[0]
    HAS_WINDOW: tl.constexpr = OPTIONS[1]
    HAS_CAP: tl.constexpr = OPTIONS[2]
    HAS_SEG: tl.constexpr = OPTIONS[3]
    POS_MODE: tl.constexpr = OPTIONS[4]
    NQP: tl.constexpr = OPTIONS[5]
    NKP: tl.constexpr = OPTIONS[6]
    ROW64: tl.constexpr = OPTIONS[7]
    DOT_PREC: tl.constexpr = OPTIONS[8]
    # The logits' scale and soft cap, the window's bounds: one argument each.
    scale, cap = scale_cap
    left, right = window
    # Each tensor's strides come as one argument (flash_fwd_kernel).
    stride_qb, stride_qt, stride_qh, stride_qd = stride_q
    stride_kb, stride_kt, stride_kh, stride_kd = stride_k
    stride_vb, stride_vt, stride_vh, stride_vd = stride_v
    stride_dob, stride_dot, stride_doh, stride_dod = stride_do
    stride_pqb, stride_pkb, stride_sqb, stride_skb, stride_bb, stride_bh, stride_bm, stride_bn = stride_aux
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_z = tl.program_id(2)
    Hb = HQ // NH
    bb = pid_z // Hb
    bh = pid_z % Hb
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    qvalid = offs_m < Tq
    kvalid = offs_n < Tk
    offs_d = tl.arange(0, BD)
    offs_dv = tl.arange(0, BDV)
    m64 = offs_m.to(tl.int64)
    qrows = m64 if ROW64 else offs_m
    krows = offs_n.to(tl.int64) if ROW64 else offs_n
    kcols = offset_positions(offs_n, KOFF, k_chunk, NKP).to(tl.int64)
    # The bias tile is the same for every pair summed here: load it once.
    b_ptrs = (
        BIAS
        + bb.to(tl.int64) * stride_bb
        + bh.to(tl.int64) * stride_bh
        + m64[:, None] * stride_bm
        + kcols[None, :] * stride_bn
    )
    bias = load_tile(b_ptrs, qvalid, kvalid, True, True).to(tl.float32)
    qk_scale = scale * LOG2E
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for i in range(0, NB * NH):
        b = (bb + i // NH).to(tl.int64)
        hq = (bh + i % NH).to(tl.int64)
        h = hq // group
        qpos = _tile_positions(QOFF, QPOS + b * stride_pqb, offs_m, qvalid, q_chunk, NQP, POS_MODE)
        kpos = _tile_positions(KOFF, KPOS + b * stride_pkb, offs_n, kvalid, k_chunk, NKP, POS_MODE)
        allowed = allowed_mask(qpos, kpos, qvalid, kvalid, (left, right), CAUSAL, HAS_WINDOW)
        if HAS_SEG:
            qseg = tl.load(QSEG + b * stride_sqb + offs_m, mask=qvalid, other=0)
            kseg = tl.load(KSEG + b * stride_skb + offs_n, mask=kvalid, other=0)
            allowed = allowed & (qseg.to(tl.int32)[:, None] == kseg.to(tl.int32)[None, :])
        # Exact skip: a tile the mask removes contributes 0 (causal: half).
        if tl.max(tl.max(allowed.to(tl.int32), 1), 0) > 0:
            q = load_tile(
                Q + b * stride_qb + hq * stride_qh + qrows[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                qvalid,
                offs_d < D,
                True,
                D != BD,
            )
            do = load_tile(
                DO
                + b * stride_dob
                + hq * stride_doh
                + qrows[:, None] * stride_dot
                + offs_dv[None, :] * stride_dod,
                qvalid,
                offs_dv < DV,
                True,
                DV != BDV,
            )
            k = load_tile(
                K + b * stride_kb + h * stride_kh + krows[:, None] * stride_kt + offs_d[None, :] * stride_kd,
                kvalid,
                offs_d < D,
                True,
                D != BD,
            )
            v = load_tile(
                V + b * stride_vb + h * stride_vh + krows[:, None] * stride_vt + offs_dv[None, :] * stride_vd,
                kvalid,
                offs_dv < DV,
                True,
                DV != BDV,
            )
            row = (b * HQ + hq) * Tq
            lse = tl.load(LSE + row + offs_m, mask=qvalid, other=0.0)
            delta = tl.load(DELTA + row + offs_m, mask=qvalid, other=0.0)
            # An empty row has lse = -inf: +inf makes its p exactly 0.
            lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
            s, _ = logits(dot(q, tl.trans(k), DOT_PREC), bias, (scale, qk_scale, cap), HAS_CAP, True)
            p = tl.exp2(tl.where(allowed, s, float("-inf")) - lse2[:, None])
            dp = dot(do, tl.trans(v), DOT_PREC)
            acc += p * (dp - delta[:, None])
    out = DB_OUT + (pid_z.to(tl.int64) * Tq + m64)[:, None] * Tk + offs_n[None, :]
    store_tile(out, acc.to(DB_OUT.dtype.element_ty), qvalid, kvalid, True, True)
