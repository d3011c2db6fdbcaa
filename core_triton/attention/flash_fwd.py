"""Flash-attention forward kernel (FlashAttention-2 online softmax).

One program computes ``BM`` query rows of one (batch, query head) pair,
walking the key blocks the mask allows and keeping a running max ``m``, a
running normaliser ``l`` and an unnormalised output ``acc`` in float32
(base-2 logits, so each ``exp`` is one ``exp2``).  Outputs: ``out [B, Tq,
HQ, Dv]`` (contiguous) and ``lse [B, HQ, Tq]`` float32, the natural-log
normaliser (``-inf`` for a row with no allowed key and no finite sink;
every row with no allowed key gets output 0, and with finite sinks ``lse``
is the log-sum-exp of the sinks alone).  Positions, pieces and block
ranges: see flash_common.

Grid: ``(cdiv(Tq, BM), B * HQ)``, or its transpose (``ORDER``:
flash_common.block_and_row).  Grouped queries: head ``hq`` reads key
head ``hq // group``.  Head dims ``D``/``DV`` are padded to powers of two
``BD``/``BDV`` with masks.  Offsets of a (batch, head) slice are 64-bit;
row offsets inside a slice are 64-bit when the plan sets ``ROW64``.
"""

import triton
import triton.language as tl

from core_triton.attention.flash_common import (
    FWD_GROUPS,
    LN2,
    LOG2E,
    block_and_row,
    block_can_be_allowed,
    block_ids,
    block_positions,
    gated_rows,
    hinted_strides,
    id_ranges,
    load_tile,
    mask_scores,
    piece_runs,
    range_runs,
    store_tile,
    tanh,
    visible_key_range,
)
from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit


@triton.jit
def _fwd_blocks(
    state, qblock, qr, run, ptrs, strides, scaling, window, SIZES, FEATURES, MASK: tl.constexpr, EDGE_STAGES
):
    """Key blocks ``lo, lo + BN, ... < hi`` of the piece of keys ``[.., end)``
    whose offset is ``koff``, ``run = (lo, hi, end, koff)``, folded into the
    online-softmax ``state = (acc [BM, BDV], m_i [BM], l_i [BM])``; returns
    the new state.

    ``qblock = (q [BM, BD], qpos, qseg, qvalid, offs_m)`` (vectors [BM]) is
    the program's query block and ``qr`` its ``id_ranges``; ``ptrs = (K_bh,
    V_bh, KPOS_b, KSEG_b, BIAS_bh)`` point at this (batch, head); ``strides
    = (kt, kd, vt, vd, bias m, bias n)``; ``scaling = (scale, qk_scale,
    cap)``; ``window = (left, right)``.  Compile-time: ``SIZES = (D, DV, BD,
    BDV, BN)``, ``FEATURES = (TEST, CAUSAL, HAS_WINDOW, HAS_CAP, HAS_BIAS,
    HAS_SEG, POS_MODE, ROW64, DOT_PREC,
    HAS_RANGE)``.  ``MASK``: apply the
    position/edge mask; ``TEST``: skip a block when its position or segment
    ranges exclude every pair.  ``EDGE_STAGES``: the pipeline's stages in
    the ranged kernel's masked runs (0: the launch's own)."""
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
    acc, m_i, l_i = state
    q, qpos, qseg, qvalid, offs_m = qblock
    lo, hi, end, koff = run
    K_bh, V_bh, KPOS_b, KSEG_b, BIAS_bh = ptrs
    stride_kt, stride_kd, stride_vt, stride_vd, stride_bm, stride_bn = strides
    scale, qk_scale, cap = scaling
    q_ids = (qpos, qseg, qvalid)
    # A ranged kernel's masked runs (a segment's edge tiles) are one or two
    # tiles: a shorter pipeline there saves its set-up and registers.
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
            offs_d = tl.arange(0, BD)
            offs_dv = tl.arange(0, BDV)
            k = load_tile(
                K_bh + rows[:, None] * stride_kt + offs_d[None, :] * stride_kd,
                kvalid,
                offs_d < D,
                MASK,
                D != BD,
            )
            qk = dot(q, tl.trans(k), DOT_PREC)
            # flash_common.logits, but reading the bias after the scaling:
            # the order of the kernel as it was measured (same arithmetic).
            if HAS_CAP or HAS_BIAS:
                s = qk * scale
                if HAS_CAP:
                    s = cap * tanh(s / cap)
                if HAS_BIAS:
                    cols = (offs_n + koff).to(tl.int64)
                    b_ptrs = BIAS_bh + offs_m.to(tl.int64)[:, None] * stride_bm + cols[None, :] * stride_bn
                    s += load_tile(b_ptrs, qvalid, kvalid, True, MASK).to(tl.float32)
                s = s * LOG2E
            else:
                s = qk * qk_scale
            s = mask_scores(
                s, q_ids, (kpos, kseg, kvalid), window, MASK, CAUSAL, HAS_WINDOW, HAS_SEG, False, False
            )
            m_new = tl.maximum(m_i, tl.max(s, 1))
            if MASK or HAS_SEG or HAS_BIAS:
                # A row with nothing allowed so far keeps m = -inf: shift by 0
                # instead, so that exp2(-inf - -inf) never makes a NaN.
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            else:
                m_use = m_new
            p = tl.exp2(s - m_use[:, None])
            alpha = tl.exp2(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = load_tile(
                V_bh + rows[:, None] * stride_vt + offs_dv[None, :] * stride_vd,
                kvalid,
                offs_dv < DV,
                MASK,
                DV != BDV,
            )
            acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, DOT_PREC)
            m_i = m_new
    return acc, m_i, l_i


@jit(sizes=("Tq", "Tk", "q_chunk", "k_chunk"), groups=FWD_GROUPS)
def flash_fwd_kernel(
    Q,
    K,
    V,
    QOFF,
    KOFF,
    QPOS,
    KPOS,
    QSEG,
    KSEG,
    QRANGE,
    KRANGE,
    SINK,
    BIAS,
    scale_cap,
    window,
    Tq,
    Tk,
    q_chunk,
    k_chunk,
    group,
    HQ,
    n_sink,
    stride_q,
    stride_k,
    stride_v,
    stride_aux,
    OUT_IN,
    LSE_IN,
    OUT,
    LSE,
    DIMS: tl.constexpr,
    OPTIONS: tl.constexpr,
    GATE: tl.constexpr,
    ORDER: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    EDGE_STAGES: tl.constexpr,
):
    # The plan's constants by name (flash_common.FWD_GROUPS; its launch packs them).
    D: tl.constexpr = DIMS[0]
    DV: tl.constexpr = DIMS[1]
    BD: tl.constexpr = DIMS[2]
    BDV: tl.constexpr = DIMS[3]
    BS: tl.constexpr = DIMS[4]
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
    HAS_SINK: tl.constexpr = OPTIONS[13]
    # The logits' scale and soft cap, the window's bounds: one argument each.
    scale, cap = scale_cap
    left, right = window
    # GATE: 0, a launch of its own; 1 or 2, one of a gated pair (flash.py's
    # gated_pair), which skips the blocks without a row of its kind
    # (flash_common.gated_rows) and writes OUT/LSE in full for the others.
    # OUT_IN/LSE_IN: the same buffers as OUT/LSE, passed so that the second
    # launch can alias them; never read.
    # EDGE_STAGES: the pipeline's stages in the ranged kernel's masked runs
    # (_fwd_blocks; 0: the launch's num_stages; flash_configs.edge_stages).
    # DIV16: which strides are multiples of 16 (flash_common.HINTED).  The
    # batch and head strides too: without them a JAX launch cannot prove a
    # tile's base 16-byte aligned, and every K/V load in the loop splits into
    # scalar loads.
    # Each tensor's strides come as one argument (a tuple: Triton specialises
    # its elements one by one, as it would separate arguments).
    stride_qb, stride_qt, stride_qh, stride_qd = stride_q
    stride_kb, stride_kt, stride_kh, stride_kd = stride_k
    stride_vb, stride_vt, stride_vh, stride_vd = stride_v
    (stride_pqb, stride_pkb, stride_sqb, stride_skb, stride_bb, stride_bh, stride_bm, stride_bn,
     stride_sink) = stride_aux  # fmt: skip
    (stride_qt, stride_kt, stride_vt, _, stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, _,
     _) = hinted_strides(DIV16, stride_qt, stride_kt, stride_vt, 0, stride_qb, stride_qh, stride_kb,
                         stride_kh, stride_vb, stride_vh, 0, 0)  # fmt: skip
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
    Q_bh = Q + b64 * stride_qb + hq.to(tl.int64) * stride_qh
    K_bh = K + b64 * stride_kb + h.to(tl.int64) * stride_kh
    V_bh = V + b64 * stride_vb + h.to(tl.int64) * stride_vh
    KPOS_b = KPOS + b64 * stride_pkb
    KSEG_b = KSEG + b64 * stride_skb
    BIAS_bh = BIAS + b64 * stride_bb + hq.to(tl.int64) * stride_bh

    last = tl.minimum(pid_m * BM + BM, Tq) - 1
    qpos, qseg, qr = block_positions(
        QPOS + b64 * stride_pqb, QSEG + b64 * stride_sqb, QOFF, offs_m, qvalid, pid_m * BM, last, q_chunk,
        NQP, POS_MODE, HAS_SEG,
    )  # fmt: skip

    q = load_tile(
        Q_bh + rows[:, None] * stride_qt + offs_d[None, :] * stride_qd, qvalid, offs_d < D, True, D != BD
    )
    qk_scale = scale * LOG2E
    acc = tl.zeros([BM, BDV], dtype=tl.float32)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)

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

    qblock = (q, qpos, qseg, qvalid, offs_m)
    ptrs = (K_bh, V_bh, KPOS_b, KSEG_b, BIAS_bh)
    strides = (stride_kt, stride_kd, stride_vt, stride_vd, stride_bm, stride_bn)
    scaling = (scale, qk_scale, cap)
    for p in tl.static_range(NKP):
        end, koff, t = piece_runs(p, NKP, k_chunk, Tk, KOFF, visible, BN, POS_MODE)
        # Packed input and segment ids: only the key blocks of this block's
        # segments.
        t = range_runs(t, QRANGE_b, offs_m, qvalid, Tq, BN, HAS_RANGE)
        # Three runs of key blocks: edge blocks with the mask, fully allowed
        # blocks without it, edge blocks again (explicit positions: one run,
        # all masked).
        for part in tl.static_range(3 if POS_MODE == 0 else 1):
            acc, m_i, l_i = _fwd_blocks(
                (acc, m_i, l_i),
                qblock,
                qr,
                (t[part], t[part + 1], end, koff),
                ptrs,
                strides,
                scaling,
                (left, right),
                SIZES,
                FEATURES,
                part != 1,
                EDGE_STAGES,
            )

    if HAS_SINK:
        # Sinks join the normaliser once, here, as logits with no value.
        offs_s = tl.arange(0, BS)
        sink = tl.load(SINK + hq * stride_sink + offs_s, mask=offs_s < n_sink, other=float("-inf"))
        sink = sink.to(tl.float32) * LOG2E
        m_f = tl.maximum(m_i, tl.max(sink, 0))
        # -inf sinks on a row with no allowed key leave m = -inf: shift by 0
        # then (exp2(-inf - -inf) would be NaN); the row stays empty.
        m_use = tl.where(m_f == float("-inf"), 0.0, m_f)
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(tl.exp2(sink[None, :] - m_use[:, None]), 1)
        acc = acc * alpha[:, None]
        m_i = m_use
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)

    o_rows = (b64 * Tq + offs_m) * HQ + hq
    store_tile(
        OUT + o_rows[:, None] * DV + offs_dv[None, :],
        out.to(OUT.dtype.element_ty),
        qvalid,
        offs_dv < DV,
        True,
        DV != BDV,
    )
    tl.store(LSE + (b64 * HQ + hq) * Tq + offs_m, lse, mask=qvalid)
