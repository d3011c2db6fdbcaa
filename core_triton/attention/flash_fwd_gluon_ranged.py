"""Segment ids in the persistent Gluon forward (``RANGED``,
core_triton.attention.flash_fwd_gluon_persistent): the whole forward of a
call with segment ids (or packed rows) in one launch after the ranges'
own, where a gated pair (flash.gated_pair) takes two.  Opt-in
(flash_tma_plans.GLUON_RANGED says why).

The producer reads the key ranges of a tile's rows (``QRANGE [B, 2, Tq]``,
segment_ranges' format: exact, or a bound where the key row is unsorted)
and hands the consumers, beside the tile's number, its span (:func:`span`):
the key blocks that meet any row's range (cut at the causal diagonal), the
run of them inside every row's exact range, where all rows see all keys,
and its kind.  A whole tile (every range ``[0, Tk)``: one segment) runs
plain attention's code (the persistent kernel's).  Any other runs
:func:`attend`: plain attention's step inside the run, and outside it a
step that masks by the rows' ranges (inside an exact range every key has
the row's id) and, in a tile with a bound, compares ids too; the last
block takes plain attention's mask as well (the causal diagonal and the
keys past ``Tk`` fall in it, ``BM == BN``).  A row that sees no key gets
``lse = -inf`` and output 0 (the softmax shifts by 0 where its maximum is
still ``-inf``).

Everything is read inside the tensors whatever the ranges hold: spans and
ranges are clamped to ``[0, Tk]``, and the ids' loads are masked to ``Tq``
and ``Tk``.
"""

from core_triton.attention.flash_common import LN2
from core_triton.attention.gluon_parts import (
    AVAILABLE,
    gl,
    gluon,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
    wgmma_layouts,
)

if AVAILABLE:
    from core_triton.attention import flash_fwd_gluon

    _masked, _products, _rescale = (
        flash_fwd_gluon._masked,
        flash_fwd_gluon._products,
        flash_fwd_gluon._rescale,
    )
    _plain_step, _softmax_step = flash_fwd_gluon._step, flash_fwd_gluon._softmax_step

    @gluon.jit
    def _decoded(lo, hi, Tk):
        """A side's ``(lo, hi)`` in segment_ranges' format as ``(lo, hi,
        exact)``: a bound's start decoded, both clamped to ``[0, Tk]``."""
        exact = lo >= 0
        return gl.maximum(gl.where(exact, lo, -1 - lo), 0), gl.minimum(hi, Tk), exact

    @gluon.jit
    def span(RANGE, m0, Tq, Tk, CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
        """``(j0, n, u0, u1, exact)`` of query rows ``m0 .. m0 + BM`` (one
        warp; ``RANGE [2 Tq]``, their batch row's ranges): key blocks ``j0
        .. j0 + n - 1`` meet a row's range (causal: none past the tile's
        last row); blocks ``u0 .. u1 - 1`` lie inside every valid row's
        range, each one exact (none where a row's is a bound or empty, or
        where rows differ); ``exact``: 1 where every valid row's range is,
        2 where each is ``[0, Tk)`` (a whole tile: plain attention's)."""
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
        offs = m0 + gl.arange(0, BM, layout=layout)
        valid = offs < Tq
        lo = gl.load(RANGE + offs, mask=valid, other=0)
        hi = gl.load(RANGE + Tq + offs, mask=valid, other=0)
        lo, hi, exact = _decoded(lo, hi, Tk)
        seen = valid & (hi > lo)
        start = gl.min(gl.where(seen, lo, Tk), 0)
        end = gl.max(gl.where(seen, hi, 0), 0)
        if CAUSAL:
            end = gl.minimum(end, m0 + BM)
        j0 = start // BN
        n = gl.maximum(gl.cdiv(end, BN) - j0, 0)
        all_exact = gl.min(gl.where(valid, exact.to(gl.int32), 1), 0)
        inner_lo = gl.max(gl.where(valid, lo, 0), 0)
        inner_hi = gl.min(gl.where(valid, hi, Tk), 0) * all_exact
        # 2: a whole tile, every row's range exactly [0, Tk).
        kind = all_exact + ((inner_lo == 0) & (inner_hi == Tk)).to(gl.int32)
        return j0, n, gl.cdiv(inner_lo, BN), inner_hi // BN, kind

    @gluon.jit
    def hand_on(words, n, t, tile_span):
        """The producer's note of its ``n``-th tile (``t``, -1 after the
        last) and its span (:func:`span`), beside the tile's Q buffer
        (``words [QBUFS, 8]``), before its arrival on the buffer's
        ``q_ready`` releases it."""
        j0, nb, u0, u1, exact = tile_span
        QBUFS: gl.constexpr = words.type.shape[0]
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
        i = gl.arange(0, 8, layout=layout)
        w = gl.where(i == 0, t, gl.where(i == 1, j0, gl.where(i == 2, nb, gl.where(i == 3, u0, u1))))
        words.index(n % QBUFS).store(gl.where(i == 5, exact, w))

    @gluon.jit
    def handed(words, q_ready, n):
        """A consumer's read of hand_on's tile and span for the ``n``-th Q
        buffer's use, once its ``q_ready`` phase completed: ``(t, (j0, n,
        u0, u1, exact))``."""
        QBUFS: gl.constexpr = words.type.shape[0]
        mbarrier.wait(q_ready.index(n % QBUFS), (n // QBUFS) & 1)
        # Every thread reads all 8 words: the picks below are its own sums
        # (spread over the warps, each was a reduction through shared memory).
        layout: gl.constexpr = gl.BlockedLayout([8], [32], [4], [0])
        w = words.index(n % QBUFS).load(layout)
        i = gl.arange(0, 8, layout=layout)
        t = gl.sum(gl.where(i == 0, w, 0), 0)
        j0 = gl.sum(gl.where(i == 1, w, 0), 0)
        nb = gl.sum(gl.where(i == 2, w, 0), 0)
        u0 = gl.sum(gl.where(i == 3, w, 0), 0)
        u1 = gl.sum(gl.where(i == 4, w, 0), 0)
        exact = gl.sum(gl.where(i == 5, w, 0), 0)
        return t, (j0, nb, u0, u1, exact)

    @gluon.jit
    def rows(QRANGE, offs_m, Tq, Tk):
        """The decoded ranges ``(lo, hi)`` of a consumer group's rows
        ``offs_m`` (``QRANGE [2 Tq]``: their batch row's)."""
        valid = offs_m < Tq
        lo = gl.load(QRANGE + offs_m, mask=valid, other=0)
        hi = gl.load(QRANGE + Tq + offs_m, mask=valid, other=0)
        lo, hi, _ = _decoded(lo, hi, Tk)
        return lo, hi

    @gluon.jit
    def _masked_ids(s, j, own, ids, Tk, BN: gl.constexpr, IDS: gl.constexpr):
        """Scores ``s`` of key block ``j`` with the keys outside each row's
        range at -inf (``own``: :func:`rows`) and, with ``IDS`` (a tile with
        a bound), the keys of other ids (``ids``: the rows' ids and the
        batch row's key ids ``KSEG``; inside an exact range every key has
        the row's id, so one test serves both kinds).  No branch: one in a
        block's step, between its products and its softmax, made ptxas
        retire the ``P V`` in flight before it (15% slower at one
        segment)."""
        lo, hi = own
        q_ids, KSEG = ids
        offs_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s.type.layout))
        seen = (offs_n[None, :] >= lo[:, None]) & (offs_n[None, :] < hi[:, None])
        if IDS:
            k_ids = gl.load(KSEG + offs_n, mask=offs_n < Tk, other=0).to(gl.int32)
            seen = seen & (q_ids[:, None] == k_ids[None, :])
        return gl.where(seen, s, float("-inf"))

    @gluon.jit
    def _step(j, i, LAST: gl.constexpr, q_rows, ring, s_zero, acc, p_op, m_i, l_i, masks, qk_scale, offs_m,
              Tk, CAUSAL: gl.constexpr, BN: gl.constexpr, rows_o: gl.constexpr,
              IDS: gl.constexpr):  # fmt: skip
        """flash_fwd_gluon._step for key block ``j``, the ring's ``i``-th
        use, masked by _masked_ids (``masks = (own, ids)``) and, in the
        tile's ``LAST`` block, by plain attention's mask.  With ``IDS`` the
        previous block's ``P V`` retires before the mask (the keys' ids
        take the registers its operand held: overlapped, ptxas spilled
        hundreds of bytes at head dim 128)."""
        own, ids = masks
        s, acc = _products(i, q_rows, ring, s_zero, acc, p_op, m_i, 0, False, j)
        if IDS:
            k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty = ring
            STAGES: gl.constexpr = k_bufs.type.shape[0]
            acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
            mbarrier.arrive(v_empty.index((i - 1) % STAGES), count=1)
        s = _masked_ids(s, j, own, ids, Tk, BN, IDS)
        if LAST:
            s = _masked(s, j, offs_m, Tk, CAUSAL, BN)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, True)
        if IDS:
            acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
            p_op = gl.convert_layout(p.to(p_op.dtype), p_op.type.layout)
        else:
            acc, p_op = _rescale(i, ring, acc, p_op, p, alpha, rows_o)
        return acc, p_op, m_i, l_i

    @gluon.jit
    def attend(q_bar, q_phase, q_rows, ring, base, offs_m, masks, qk_scale, Tq, Tk, CAUSAL: gl.constexpr,
               BN: gl.constexpr, D: gl.constexpr):  # fmt: skip
        """flash_fwd_gluon._attend over the key blocks of the tile's span
        (``masks = (own, tile_span, QSEG, KSEG)``: :func:`rows`,
        :func:`span`, the batch row's query and key ids), the ring's uses
        from ``base`` on, masked by _masked_ids, the ids compared only
        where the tile has a bound.  With no block the rows keep ``m =
        -inf``, ``l = 0`` (:func:`finish`)."""
        ROWS: gl.constexpr = q_rows.type.shape[0]
        s_layout: gl.constexpr = wgmma_layouts(BN, D)[0]
        o_layout: gl.constexpr = wgmma_layouts(BN, D)[1]
        p_layout: gl.constexpr = wgmma_layouts(BN, D)[2]
        m_i = gl.full([ROWS], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
        p_op = gl.zeros([ROWS, BN], q_rows.dtype, p_layout)
        acc = gl.zeros([ROWS, D], gl.float32, o_layout)
        state = (acc, p_op, m_i, l_i)
        mbarrier.wait(q_bar, q_phase)
        # Two copies of the loop: the ids' registers only in the one that compares them.
        if masks[1][4] == 1:
            state = _run(base, q_rows, ring, state, masks, qk_scale, offs_m, Tq, Tk, CAUSAL, BN, D, False)
        else:
            state = _run(base, q_rows, ring, state, masks, qk_scale, offs_m, Tq, Tk, CAUSAL, BN, D, True)
        return state

    @gluon.jit
    def _run(base, q_rows, ring, state, masks, qk_scale, offs_m, Tq, Tk, CAUSAL: gl.constexpr,
             BN: gl.constexpr, D: gl.constexpr, IDS: gl.constexpr):  # fmt: skip
        """attend's blocks (``IDS``: for a tile with a bound): the first's
        scores and probabilities, then the others, as
        flash_fwd_gluon._attend; the blocks between the first and the last
        in runs, each loop without a branch: masked (_step) before the
        span's unmasked run ``u0 .. u1 - 1``, unmasked inside it (plain
        attention's step), masked after it; the last block masked by the
        ranges and by plain attention's mask."""
        acc, p_op, m_i, l_i = state
        own, tile_span, QSEG, KSEG = masks
        j0, nb, u0, u1, _ = tile_span
        k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty = ring
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        s_layout: gl.constexpr = wgmma_layouts(BN, D)[0]
        rows_o: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
        ROWS: gl.constexpr = q_rows.type.shape[0]
        s_zero = gl.zeros([ROWS, BN], gl.float32, s_layout)
        if IDS:
            q_ids = gl.load(QSEG + offs_m, mask=offs_m < Tq, other=0).to(gl.int32)
        else:
            q_ids = 0  # unused
        per_block = (own, (q_ids, KSEG))
        if nb > 0:
            # No product in flight yet: the branches cost nothing here.
            first = base % STAGES
            mbarrier.wait(k_ready.index(first), (base // STAGES) & 1)
            keys = k_bufs.index(first).permute((1, 0))
            s = warpgroup_mma(q_rows, keys, s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s,))
            mbarrier.arrive(k_empty.index(first), count=1)
            if IDS or (j0 < u0) or (j0 >= u1):
                s = _masked_ids(s, j0, own, (q_ids, KSEG), Tk, BN, IDS)
            if nb == 1:
                s = _masked(s, j0, offs_m, Tk, CAUSAL, BN)
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, True)
            p_op = gl.convert_layout(p.to(q_rows.dtype), p_op.type.layout)
        # Blocks 1 .. nb - 2 (relative to j0) in runs: masked, unmasked, masked.
        end = gl.maximum(nb - 1, 1)
        a = gl.minimum(gl.maximum(u0 - j0, 1), end)
        c = gl.minimum(gl.maximum(u1 - j0, a), end)
        if IDS:
            c = a
        for jj in range(1, a):
            acc, p_op, m_i, l_i = _step(j0 + jj, base + jj, False, q_rows, ring, s_zero, acc, p_op, m_i, l_i,
                                        per_block, qk_scale, offs_m, Tk, CAUSAL, BN, rows_o, IDS)  # fmt: skip
        for jj in range(a, c):
            # Every row sees every key of these blocks: plain attention's step.
            acc, p_op, m_i, l_i = _plain_step(jj, base, False, q_rows, ring, s_zero, acc, p_op, m_i, l_i,
                                              qk_scale, offs_m, Tk, CAUSAL, BN, rows_o, m_i, 0,
                                              False)  # fmt: skip
        for jj in range(c, end):
            acc, p_op, m_i, l_i = _step(j0 + jj, base + jj, False, q_rows, ring, s_zero, acc, p_op, m_i, l_i,
                                        per_block, qk_scale, offs_m, Tk, CAUSAL, BN, rows_o, IDS)  # fmt: skip
        if nb > 1:
            acc, p_op, m_i, l_i = _step(j0 + nb - 1, base + nb - 1, True, q_rows, ring, s_zero, acc, p_op,
                                        m_i, l_i, per_block, qk_scale, offs_m, Tk, CAUSAL, BN, rows_o,
                                        IDS)  # fmt: skip
        return acc, p_op, m_i, l_i

    @gluon.jit
    def finish(last, nb, ring, acc, p_op, m_i, l_i):
        """flash_fwd_gluon._finish after :func:`attend` (``nb`` blocks, the
        last the ring's use ``last``): output 0 and ``lse = -inf`` for a
        row that saw no key."""
        k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty = ring
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        rows_o: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
        if nb > 0:
            slot = last % STAGES
            mbarrier.wait(v_ready.index(slot), (last // STAGES) & 1)
            acc = warpgroup_mma(p_op, v_bufs.index(slot), acc, is_async=True)
            acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
            mbarrier.arrive(v_empty.index(slot), count=1)
        empty = l_i == 0.0
        l_safe = gl.where(empty, 1.0, l_i)
        lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
        return acc / gl.convert_layout(l_safe, rows_o)[:, None], lse
else:  # pragma: no cover
    span = hand_on = handed = rows = attend = finish = None
