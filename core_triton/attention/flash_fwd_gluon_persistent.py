"""The Gluon flash forward (core_triton.attention.flash_fwd_gluon) as a
persistent kernel: one program an SM, each taking query blocks (tiles) in
turn, so that one tile's prologue and epilogue (its Q load, its first key
blocks, its output store) overlap another's products instead of idling
the SM.  The Gluon forward runs one program an SM (12 warps at 168
registers fill the register file; 16 at 128 with three consumer groups),
so there every tile's set-up is exposed; at T2k causal a tile has eight
key blocks on average.

The producer warp runs ahead across tiles: it loads the next tile's Q into
the other of ``QBUFS`` buffers (freed once every consumer group stored the
output of the tile before through it) and its K and V blocks into the same
ring, whose uses are counted across tiles.  Tiles go (batch, head) by
(batch, head), each one's query blocks last block first (causal: the
heaviest first), dealt out in turns of ``num_programs`` tiles (_tile): the
programs running together share a few heads' keys and values in L2.

The descriptors are built once a program over all batches (``[B, T, HQ *
D]``, a block ``[1, rows, D]``): rows past ``T`` of a batch read as zeros
and are dropped from stores, as the per-batch descriptors of the kernel
beside it do.  Same outputs, coverage and gate (``GATE``, a gated pair's
first launch) as ``flash_fwd_gluon_kernel``.  ``RANGED`` (opt-in,
flash_tma_plans.GLUON_RANGED): the whole of a call with segment ids or
packed rows, the producer handing on each tile's span of key blocks with
its number (core_triton.attention.flash_fwd_gluon_ranged).  ``GROUPS``
3 (head dim 64 without a mask): three consumer groups on tiles of 192
rows, which hide more of the softmax where the products are short.
"""

from core_triton.attention import flash_fwd_gluon, flash_fwd_gluon_ranged
from core_triton.attention.flash_common import LOG2E
from core_triton.attention.gluon_parts import (
    AVAILABLE,
    fence_async_shared,
    gate_open,
    gate_rows,
    gl,
    gluon,
    key_blocks,
    mbarrier,
    ring,
    tma,
    wgmma_layouts,
)

if AVAILABLE:
    # The per-tile work is the kernel's of one program a tile.
    _attend, _finish = flash_fwd_gluon._attend, flash_fwd_gluon._finish

    @gluon.jit
    def _tile(k, first, step, n_m, CAUSAL: gl.constexpr):
        """Tile of program ``first``'s ``k``-th turn (of ``step`` programs),
        and its ``(query block, grid row)``: the tiles go (batch, head) by
        (batch, head), each row's query blocks last first (causal: the
        heaviest), so that the programs running together share the keys
        and values of a few heads in L2; turn ``k`` takes tiles ``k * step``
        on.  Causal: dealt to the programs forward in even turns and
        backward in odd ones, which evens out the work each program gets
        (its sum of key blocks; dealt forward every turn, a program could
        take the heavy end of a row each time, up to 1.4x the mean at T1k).
        Full: forward every turn (every tile has the same work; alternating
        turns ran 0-1% slower on the H200, 46th session)."""
        if CAUSAL:
            t = k * step + gl.where(k % 2 == 0, first, step - 1 - first)
        else:
            t = k * step + first
        return t, n_m - 1 - t % n_m, t // n_m

    @gluon.jit
    def _producer(loads, HQ: gl.constexpr, H: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr,
                  GATE: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, RANGED: gl.constexpr):  # fmt: skip
        """One warp: each tile's Q into its buffer once every group freed
        it, then its K and V blocks into the ring (``loads``: descriptors,
        buffers, barriers, the tiles).  ``GATE`` 1: only the tiles holding
        a row whose range holds every key (gate_open), each one's number
        written beside its Q buffer for the consumers, then -1 (_hand_on).
        ``RANGED``: every tile, with its span of key blocks
        (flash_fwd_gluon_ranged.span) written beside its number."""
        first, n_tiles, step, n_m, Tq, Tk, QRANGE, tile_ids, _ = loads[5]
        used = 0
        n = 0
        if RANGED:
            # Each tile's span is made one tile ahead (_load_tile), once the
            # ring is full and the producer would wait anyway, so that its
            # reads of the ranges never hold back a tile's first keys.
            tile_span = _span_of(loads, 0, HQ, CAUSAL, BM, BN)
        else:
            tile_span = (0, 0, 0, 0, 1)
        for k in range(gl.cdiv(n_tiles, step)):
            t, pid_m, pid_bh = _tile(k, first, step, n_m, CAUSAL)
            if t < n_tiles:
                runs = True
                if GATE == 1:
                    ranges = QRANGE + (pid_bh // HQ).to(gl.int64) * 2 * Tq
                    lo, hi = gate_rows(ranges, pid_m * BM, Tq, BM, 1)
                    runs = gate_open(lo, hi, Tk)
                if runs:
                    tile = (t, pid_m, pid_bh)
                    if not RANGED:
                        tile_span = (0, key_blocks(pid_m * BM + BM, Tk, CAUSAL, BN), 0, 0, 1)
                    used, n, tile_span = _load_tile(loads, tile, tile_span, used, n, HQ, H, D, GATE, BM, BN,
                                                    RANGED, k + 1, CAUSAL)  # fmt: skip
        if GATE == 1 or RANGED:
            q_ready, q_empty = loads[4][:2]
            QBUFS: gl.constexpr = tile_ids.type.shape[0]
            mbarrier.wait(q_empty.index(n % QBUFS), ((n // QBUFS) & 1) ^ 1)
            if RANGED:
                flash_fwd_gluon_ranged.hand_on(tile_ids, n, -1, (0, 0, 0, 0, 1))
            else:
                _hand_on(tile_ids, n, -1)
            mbarrier.arrive(q_ready.index(n % QBUFS), count=1)

    @gluon.jit
    def _span_of(loads, k, HQ: gl.constexpr, CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):
        """flash_fwd_gluon_ranged.span of the producer's tile of turn ``k``
        (a placeholder past the last)."""
        first, n_tiles, step, n_m, Tq, Tk, QRANGE, _, _ = loads[5]
        t, pid_m, pid_bh = _tile(k, first, step, n_m, CAUSAL)
        if t < n_tiles:
            ranges = QRANGE + (pid_bh // HQ).to(gl.int64) * 2 * Tq
            tile_span = flash_fwd_gluon_ranged.span(ranges, pid_m * BM, Tq, Tk, CAUSAL, BM, BN)
        else:
            tile_span = (0, 0, 0, 0, 1)
        return tile_span

    @gluon.jit
    def _hand_on(tile_ids, n, t):
        """Write tile ``t`` as the one of the ``n``-th Q buffer's use, before
        the producer's arrival on its ``q_ready`` (which releases it)."""
        QBUFS: gl.constexpr = tile_ids.type.shape[0]
        one: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
        tile_ids.index(n % QBUFS).store(gl.full([1], t, gl.int32, one))

    @gluon.jit
    def _tile_handed(tile_ids, q_ready, n):
        """A consumer's read of the tile of the ``n``-th Q buffer's use,
        once the producer's arrival on its ``q_ready`` released it (-1: no
        more tiles)."""
        QBUFS: gl.constexpr = tile_ids.type.shape[0]
        mbarrier.wait(q_ready.index(n % QBUFS), (n // QBUFS) & 1)
        group: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
        return gl.max(tile_ids.index(n % QBUFS).load(group), 0)

    @gluon.jit
    def _load_tile(loads, tile, tile_span, used, n, HQ: gl.constexpr, H: gl.constexpr, D: gl.constexpr,
                   GATE: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, RANGED: gl.constexpr, k_next,
                   CAUSAL: gl.constexpr):  # fmt: skip
        """The producer's loads of one tile (``t, pid_m, pid_bh``: _tile's),
        its ``n``-th (Q buffer ``n % QBUFS``), whose key blocks ``j0 .. j0 +
        nb - 1`` (``tile_span``, the first two) are the ring's uses from
        ``used`` on; returns the counts after it and, ``RANGED``, the span
        of the tile of turn ``k_next``, made between this tile's Q and its
        keys (else ``tile_span``)."""
        t, pid_m, pid_bh = tile
        descs, q_bufs, k_bufs, v_bufs, bars, _ = loads
        q_desc, k_desc, v_desc = descs
        q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = bars
        GROUPS: gl.constexpr = BM // q_bufs.type.shape[1]
        QBUFS: gl.constexpr = q_bufs.type.shape[0] // GROUPS
        b = pid_bh // HQ
        hq = pid_bh % HQ
        h = hq // (HQ // H)
        m0 = pid_m * BM
        qb = n % QBUFS
        mbarrier.wait(q_empty.index(qb), ((n // QBUFS) & 1) ^ 1)
        j0, nb = tile_span[0], tile_span[1]
        if GATE == 1:
            _hand_on(loads[5][-2], n, t)
        if RANGED:
            flash_fwd_gluon_ranged.hand_on(loads[5][-2], n, t, tile_span)
        # Each group's rows on their own (a slice of a buffer has no 3-D view).
        ROWS: gl.constexpr = BM // GROUPS
        mbarrier.expect(q_ready.index(qb), GROUPS * q_desc.block_type.nbytes)
        for g in gl.static_range(GROUPS):
            tma.async_copy_global_to_shared(
                q_desc, [b, m0 + g * ROWS, hq * D], q_ready.index(qb),
                q_bufs.index(GROUPS * qb + g).reshape([1, ROWS, D]),
            )  # fmt: skip
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        nxt = tile_span
        for j in range(nb):
            _fill(k_desc, [b, (j0 + j) * BN, h * D], k_bufs, k_ready, k_empty, used + j, BN, D)
            _fill(v_desc, [b, (j0 + j) * BN, h * D], v_bufs, v_ready, v_empty, used + j, BN, D)
            if RANGED:
                if j == gl.minimum(nb, STAGES) - 1:
                    # The ring is full: the producer would wait anyway.
                    nxt = _span_of(loads, k_next, HQ, CAUSAL, BM, BN)
        if RANGED:
            if nb == 0:
                nxt = _span_of(loads, k_next, HQ, CAUSAL, BM, BN)
        return used + nb, n + 1, nxt

    @gluon.jit
    def _fill(desc, coords, bufs, ready, empty, i, BN: gl.constexpr, D: gl.constexpr):
        """gluon_parts.fill_slot through a 3-D descriptor: the slot seen as
        ``[1, BN, D]`` (a reshape of the whole ring to 4-D crashes Triton
        3.6's layout conversion, so the view is taken a slot at a time)."""
        STAGES: gl.constexpr = bufs.type.shape[0]
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, coords, ready.index(slot), bufs.index(slot).reshape([1, BN, D]))

    @gluon.jit
    def _consumer(GROUP: gl.constexpr, shared, HQ: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr,
                  GATE: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, RANGED: gl.constexpr):  # fmt: skip
        """One warp group, rows ``GROUP * ROWS`` on of each tile (``ROWS``
        64, the tile's share of each of its groups): the
        products and softmax (flash_fwd_gluon's _attend and _finish), then
        ``lse`` and the output, stored through its rows of the tile's Q
        buffer, which it then frees.  ``GATE`` 1: the tiles the producer
        hands on (only it reads the ranges).  ``RANGED``: every tile, over
        the span of key blocks handed on with it."""
        first, n_tiles, step, n_m, Tq, Tk, QRANGE, tile_ids, _ = shared[-1]
        used = 0
        n = 0
        q_ready = shared[3][0]
        if GATE == 1:
            # The producer's tiles, as it hands them on.
            t = _tile_handed(tile_ids, q_ready, n)
            while t >= 0:
                pid_m = n_m - 1 - t % n_m
                used, n = _attend_tile(GROUP, shared, pid_m, t // n_m, used, n, Tq, Tk, HQ, D, CAUSAL, BM, BN,
                                       0, False)  # fmt: skip
                t = _tile_handed(tile_ids, q_ready, n)
        elif RANGED:
            t, tile_span = flash_fwd_gluon_ranged.handed(tile_ids, q_ready, n)
            while t >= 0:
                pid_m = n_m - 1 - t % n_m
                used, n = _attend_tile(GROUP, shared, pid_m, t // n_m, used, n, Tq, Tk, HQ, D, CAUSAL, BM, BN,
                                       tile_span, True)  # fmt: skip
                t, tile_span = flash_fwd_gluon_ranged.handed(tile_ids, q_ready, n)
        else:
            for k in range(gl.cdiv(n_tiles, step)):
                t, pid_m, pid_bh = _tile(k, first, step, n_m, CAUSAL)
                if t < n_tiles:
                    used, n = _attend_tile(GROUP, shared, pid_m, pid_bh, used, n, Tq, Tk, HQ, D, CAUSAL,
                                           BM, BN, 0, False)  # fmt: skip

    @gluon.jit
    def _attend_tile(GROUP: gl.constexpr, shared, pid_m, pid_bh, used, n, Tq, Tk, HQ: gl.constexpr,
                     D: gl.constexpr, CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, tile_span,
                     RANGED: gl.constexpr):  # fmt: skip
        """One consumer group's share of one tile, its ``n``-th, whose key
        blocks are the ring's uses from ``used`` on; returns the counts
        after it.  ``RANGED``: the blocks of ``tile_span``
        (flash_fwd_gluon_ranged.span), ids compared outside its run."""
        q_bufs, k_bufs, v_bufs, bars, o_desc, LSE, qk_scale, _ = shared
        q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = bars
        ROWS: gl.constexpr = q_bufs.type.shape[1]
        GROUPS: gl.constexpr = BM // ROWS
        QBUFS: gl.constexpr = q_bufs.type.shape[0] // GROUPS
        dtype: gl.constexpr = q_bufs.dtype
        rows_s: gl.constexpr = gl.SliceLayout(1, wgmma_layouts(BN, D)[0])
        ring = (k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty)
        b = pid_bh // HQ
        hq = pid_bh % HQ
        m0 = pid_m * BM
        r0 = m0 + GROUP * ROWS
        offs_m = r0 + gl.arange(0, ROWS, layout=rows_s)
        if RANGED:
            n_blocks = tile_span[1]
        else:
            n_blocks = key_blocks(m0 + BM, Tk, CAUSAL, BN)
        qb = n % QBUFS
        q_rows = q_bufs.index(GROUPS * qb + GROUP)
        q_phase = (n // QBUFS) & 1
        if RANGED and tile_span[4] != 2:
            # Not a whole tile (flash_fwd_gluon_ranged.span): the ranges'
            # span, masked by the ranges and ids.
            QRANGE = shared[-1][6]
            QSEG, KSEG, stride_qs, stride_ks = shared[-1][-1]
            b64 = b.to(gl.int64)
            own = flash_fwd_gluon_ranged.rows(QRANGE + b64 * 2 * Tq, offs_m, Tq, Tk)
            masks = (own, tile_span, QSEG + b64 * stride_qs, KSEG + b64 * stride_ks)
            acc, p_op, m_i, l_i = flash_fwd_gluon_ranged.attend(
                q_ready.index(qb), q_phase, q_rows, ring, used, offs_m, masks, qk_scale, Tq, Tk, CAUSAL, BN, D
            )  # fmt: skip
            out, lse = flash_fwd_gluon_ranged.finish(used + n_blocks - 1, n_blocks, ring, acc, p_op, m_i, l_i)
        else:
            # Plain attention, or a whole tile (every row sees every key):
            # plain attention's own code (the ranged loop ran 4 to 18%
            # slower on one segment).
            acc, p_op, m_i, l_i = _attend(q_ready.index(qb), q_phase, q_rows, ring, used, offs_m, n_blocks,
                                          qk_scale, Tk, CAUSAL, BN, D, q_ready, GROUP, False)  # fmt: skip
            out, lse = _finish(used + n_blocks - 1, ring, acc, p_op, m_i, l_i)
        gl.store(LSE + pid_bh.to(gl.int64) * Tq + offs_m, lse, mask=offs_m < Tq)
        q_rows.store(out.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [b, r0, hq * D], q_rows.reshape([1, ROWS, D]))
        tma.store_wait(0)
        mbarrier.arrive(q_empty.index(qb), count=1)
        return used + n_blocks, n + 1

    @gluon.jit(do_not_specialize=["stride_qs", "stride_ks", "B", "Tq", "Tk"])
    def flash_fwd_gluon_kernel(
        Q,
        K,
        V,
        QRANGE,
        QSEG,
        KSEG,
        stride_qs,
        stride_ks,
        scale,
        B,
        Tq,
        Tk,
        OUT,
        LSE,
        HQ: gl.constexpr,
        H: gl.constexpr,
        D: gl.constexpr,
        CAUSAL: gl.constexpr,
        GATE: gl.constexpr,
        BM: gl.constexpr,
        BN: gl.constexpr,
        STAGES: gl.constexpr,
        PINGPONG: gl.constexpr = False,
        QBUFS: gl.constexpr = 2,
        RANGED: gl.constexpr = False,
        GROUPS: gl.constexpr = 2,
    ):
        """Grid ``(programs,)``, any number (one an SM is the plan's): the
        ``cdiv(Tq, BM) * B * HQ`` tiles of flash_fwd_gluon_kernel's grid
        dealt out in turn.  Its parameters, ``GATE`` 1 included (a gated
        pair's first launch: the tiles without a row whose segment holds
        every key are skipped; the producer decides, the consumers run what
        it hands on), but ``PINGPONG`` must be False; ``QBUFS``: Q buffers,
        so that the next tile's Q loads while this one runs; ``GROUPS``:
        consumer groups of 64 rows each (``BM == 64 * GROUPS``), 3 only for
        plain attention without a causal mask (launched with maxnreg 128:
        16 warps), else 2 (maxnreg 168, 12 warps)."""
        gl.static_assert(BM == BN or not CAUSAL, "the causal mask is applied to the last key block only")
        gl.static_assert(not PINGPONG, "no PINGPONG")
        gl.static_assert(BM == 64 * GROUPS, "64 rows a consumer group")
        gl.static_assert(GROUPS == 2 or (GROUPS == 3 and GATE == 0 and not RANGED), "3 groups: plain only")
        dtype: gl.constexpr = Q.dtype.element_ty
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        layout3: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=3)
        q_desc = tma.make_tensor_descriptor(
            Q, [B, Tq, HQ * D], [Tq * HQ * D, HQ * D, 1], [1, BM // GROUPS, D], layout3
        )
        o_desc = tma.make_tensor_descriptor(
            OUT, [B, Tq, HQ * D], [Tq * HQ * D, HQ * D, 1], [1, BM // GROUPS, D], layout3
        )
        k_desc = tma.make_tensor_descriptor(K, [B, Tk, H * D], [Tk * H * D, H * D, 1], [1, BN, D], layout3)
        v_desc = tma.make_tensor_descriptor(V, [B, Tk, H * D], [Tk * H * D, H * D, 1], [1, BN, D], layout3)

        # Buffer GROUPS q + g holds group g's rows of the q-th Q buffer.
        q_bufs = gl.allocate_shared_memory(dtype, [GROUPS * QBUFS, BM // GROUPS, D], layout)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], layout)
        bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
        # Q's buffers: ready on the producer's loads, free once every group stored through them.
        q_ready, q_empty = ring(QBUFS, GROUPS)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=GROUPS)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=GROUPS)
        bars = (q_ready, q_empty, k_ready, k_empty, v_ready, v_empty)

        n_m = gl.cdiv(Tq, BM)
        n_tiles = n_m * B * HQ
        first = gl.program_id(0)
        step = gl.num_programs(0)
        qk_scale = scale * LOG2E
        if GATE == 1:
            # Beside each Q buffer, the number of the tile it holds.
            tile_ids = gl.allocate_shared_memory(gl.int32, [QBUFS, 1], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        elif RANGED:
            # Beside each Q buffer, its tile's number and span.
            tile_ids = gl.allocate_shared_memory(gl.int32, [QBUFS, 8], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        else:
            tile_ids = q_ready  # unused
        seg = (QSEG, KSEG, stride_qs, stride_ks)
        tiles = (first, n_tiles, step, n_m, Tq, Tk, QRANGE, tile_ids, seg)
        shared = (q_bufs, k_bufs, v_bufs, bars, o_desc, LSE, qk_scale, tiles)
        loads = ((q_desc, k_desc, v_desc), q_bufs, k_bufs, v_bufs, bars, tiles)
        if GROUPS == 3:
            # FlashAttention-3's split at head dim 64: three consumer groups,
            # the two worker groups at 160 registers and the first (the
            # launch's own warps) at what is left, 168 (maxnreg 128, 16 warps).
            gl.warp_specialize(
                [
                    (_consumer, (0, shared, HQ, D, CAUSAL, GATE, BM, BN, RANGED)),
                    (_consumer, (1, shared, HQ, D, CAUSAL, GATE, BM, BN, RANGED)),
                    (_consumer, (2, shared, HQ, D, CAUSAL, GATE, BM, BN, RANGED)),
                    (_producer, (loads, HQ, H, D, CAUSAL, GATE, BM, BN, RANGED)),
                ],
                [4, 4, 1],
                [160, 160, 24],
            )
        else:
            gl.warp_specialize(
                [
                    (_consumer, (0, shared, HQ, D, CAUSAL, GATE, BM, BN, RANGED)),
                    (_consumer, (1, shared, HQ, D, CAUSAL, GATE, BM, BN, RANGED)),
                    (_producer, (loads, HQ, H, D, CAUSAL, GATE, BM, BN, RANGED)),
                ],
                [4, 1],
                [240, 24],
            )

    flash_fwd_gluon_kernel.needs_global_scratch = True
else:  # pragma: no cover
    flash_fwd_gluon_kernel = None
