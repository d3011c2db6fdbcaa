"""Flash-attention forward for Hopper (sm_90) written in Gluon.

Gluon (``triton.experimental.gluon``) states what Triton's automatic
warp-specialisation pass guesses at (core_triton.attention.flash_fwd_ws),
after FlashAttention-3's design: one producer warp issues the TMA loads of
Q, K and V into a ring of ``STAGES`` shared buffers, signalled through
mbarriers; two consumer warp groups, 64 query rows each, run their
products as asynchronous ``wgmma`` and their online softmax, each at its
own pace (so one group's softmax runs beside the other's products), and
each releases a K or V slot once its product with it retired (a slot is
free when both did).  Within a group, key block ``j``'s ``Q K_j^T`` and the
previous block's ``P_{j-1} V_{j-1}`` are issued together and the softmax of
``S_j`` runs while the second is on the tensor cores (FlashAttention-3's
intra-warpgroup overlap); both retire within the block, so no accumulator
is in flight across the loop's back edge.  One was, in an earlier
schedule (``P V`` retired a block later): LLVM copied the loop-carried
accumulator there, and ptxas, seeing registers of an in-flight ``wgmma``
read, serialised every ``wgmma`` of the kernel (its warning C7514; 12%
slower).  test_gluon_forward_wgmma_pipelined pins that.
Registers move from the producer to the consumers (``setmaxnreg``): the
launch caps the kernel at 168 registers a thread (12 warps), the producer
keeps 24, the consumers get 240.

Only the last key block of a query block is masked: with ``BM == BN`` the
causal diagonal and the keys past ``Tk`` both fall in it, so every other
block runs without a compare.

Same outputs as ``flash_fwd_kernel`` (``out [B, Tq, HQ, D]`` in the inputs'
dtype, ``lse [B, HQ, Tq]`` float32, natural log).  What it covers (the plan
takes another kernel for anything else): contiguous ``q [B, Tq, HQ, D]``,
``k, v [B, Tk, H, D]`` in bfloat16 or float16, ``D`` 64 or 128 (rows of
128 bytes or more for the 128-byte swizzle; the plan takes 128), grouped
query heads, causal (top-left aligned when ``Tq != Tk``) or not,
``Tq, Tk >= 1``; no sinks, windows or bias.  Segment ids only as a
gated pair's first launch (``GATE``, flash.gated_pair): blocks without a
row whose segment holds every key return at once.  The descriptors
are built on the device, one per batch on the batch's own base, so rows
past ``T`` read as zeros and the output's TMA store drops them: no block
reads or writes another batch's rows.  They live in
Triton's global scratch (``needs_global_scratch``).  Gluon has no
interpreter: the plan never takes this kernel on the CPU.
"""

from core_triton.attention.flash_common import LN2, LOG2E
from core_triton.attention.gluon_parts import (
    AVAILABLE,
    batch_rows,
    fence_async_shared,
    fill_slot,
    gated_block,
    gl,
    gluon,
    key_blocks,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
    wgmma_layouts,
)

if AVAILABLE:

    @gluon.jit
    def _producer(
        q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, bars, m0, col_q, col_k, n_blocks, BN: gl.constexpr
    ):
        """One warp: Q once, then K and V of each key block into the ring,
        each slot reused once the consumers released it."""
        q_bar, k_ready, k_empty, v_ready, v_empty, _ = bars
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [m0, col_q], q_bar, q_smem)
        for j in range(n_blocks):
            fill_slot(k_desc, [j * BN, col_k], k_bufs, k_ready, k_empty, j)
            fill_slot(v_desc, [j * BN, col_k], v_bufs, v_ready, v_empty, j)

    @gluon.jit
    def _softmax_step(s, m_i, l_i, qk_scale, SAFE: gl.constexpr = False):
        """One block of the online softmax on raw scores ``s`` (masked ones
        -inf): the probabilities, the old rows' rescale factor, and the new
        running maximum (log2 units) and normaliser.  ``SAFE``: a row whose
        maximum is still -inf (it has seen no key) shifts by 0, where
        exp2(-inf - -inf) would be NaN (plain attention's rows always see
        key 0)."""
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        m_use = m_new
        if SAFE:
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        p = gl.exp2(s * qk_scale - m_use[:, None])
        alpha = gl.exp2(m_i - m_use)
        l_i = l_i * alpha + gl.sum(p, 1)
        return p, alpha, m_new, l_i

    @gluon.jit
    def _masked(s, j, offs_m, Tk, CAUSAL: gl.constexpr, BN: gl.constexpr):
        """Scores ``s`` of key block ``j`` with the keys a row does not see
        (past its own position when causal, past ``Tk``) at -inf."""
        offs_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s.type.layout))
        if CAUSAL:
            visible = gl.minimum(offs_m + 1, Tk)
            s = gl.where(offs_n[None, :] < visible[:, None], s, float("-inf"))
        else:
            s = gl.where((offs_n < Tk)[None, :], s, float("-inf"))
        return s

    @gluon.jit
    def _step(j, base, MASK: gl.constexpr, q_rows, ring, s_zero, acc, p_op, m_i, l_i, qk_scale, offs_m, Tk,
              CAUSAL: gl.constexpr, BN: gl.constexpr, rows_o: gl.constexpr, turns, HALF: gl.constexpr,
              PINGPONG: gl.constexpr):  # fmt: skip
        """Key block ``j`` of one consumer group, after FlashAttention-3's
        intra-warpgroup overlap: ``S_j = Q K_j^T`` and ``P_{j-1} V_{j-1}``
        issued back to back, the softmax of ``S_j`` while the second runs,
        then the rescale.  On entry ``acc`` holds blocks ``< j - 1`` and
        ``p_op`` is ``P_{j-1}``; both products retire before it returns, so
        no accumulator is in flight across the loop's back edge (where
        LLVM's copies of a loop-carried accumulator made ptxas serialise
        every wgmma of the kernel: warning C7514).  ``PINGPONG``: the two
        groups take turns to issue their products (``turns``, one mbarrier
        each; group 0 first), so one group's softmax runs while the other's
        products do (FlashAttention-3's inter-warpgroup schedule).  ``base``:
        the ring's uses before this query block's key block 0 (a persistent
        program's earlier blocks; 0 for one block a program)."""
        s, acc = _products(base + j, q_rows, ring, s_zero, acc, p_op, turns, HALF, PINGPONG, j)
        if MASK:
            s = _masked(s, j, offs_m, Tk, CAUSAL, BN)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale)
        acc, p_op = _rescale(base + j, ring, acc, p_op, p, alpha, rows_o)
        return acc, p_op, m_i, l_i

    @gluon.jit
    def _products(i, q_rows, ring, s_zero, acc, p_op, turns, HALF: gl.constexpr, PINGPONG: gl.constexpr,
                  j):  # fmt: skip
        """_step's products at the ring's ``i``-th use (key block ``j`` of
        the query block, for ``PINGPONG``'s turns): ``S = Q K_i^T`` issued,
        then ``P V_{i-1}`` on ``acc``; returns ``(S, acc)`` once ``S``
        retired (its K slot released), the second still running."""
        k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty = ring
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        slot = i % STAGES
        prev = (i - 1) % STAGES
        mbarrier.wait(k_ready.index(slot), (i // STAGES) & 1)
        if PINGPONG:
            # A fresh mbarrier counts as having completed the phase before
            # phase 0: group 0's first wait passes at once.
            mbarrier.wait(turns.index(HALF), ((j - 1) & 1) ^ (1 - HALF))
        s = warpgroup_mma(q_rows, k_bufs.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(prev), ((i - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turns.index(1 - HALF), count=1)
        # Products retire in order: this retires S_j, P_{j-1} V_{j-1} runs on.
        s = warpgroup_mma_wait(1, deps=(s,))
        mbarrier.arrive(k_empty.index(slot), count=1)
        return s, acc

    @gluon.jit
    def _rescale(i, ring, acc, p_op, p, alpha, rows_o: gl.constexpr):
        """_step's end: ``P V_{i-1}`` retired (its V slot released), then
        ``acc`` rescaled by ``alpha`` and ``p`` as the next product's
        operand."""
        k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty = ring
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
        mbarrier.arrive(v_empty.index((i - 1) % STAGES), count=1)
        acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
        p_op = gl.convert_layout(p.to(p_op.dtype), p_op.type.layout)
        return acc, p_op

    @gluon.jit
    def _attend(q_bar, q_phase, q_rows, ring, base, offs_m, n_blocks, qk_scale, Tk, CAUSAL: gl.constexpr,
                BN: gl.constexpr, D: gl.constexpr, turns, HALF: gl.constexpr,
                PINGPONG: gl.constexpr):  # fmt: skip
        """One consumer group's rows ``offs_m`` (``q_rows``, ready once
        ``q_bar`` completes phase ``q_phase``) over ``n_blocks`` key blocks,
        the ring's uses from ``base`` on (_step),
        but for the last block's ``P V``
        (:func:`_finish`): block 0's scores and probabilities (masked when
        it is the last), then _step for the others, only the last masked
        (see the module docstring).  Returns ``(acc, p_op, m_i, l_i)``;
        every ``Q K^T`` has retired."""
        k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty = ring
        ROWS: gl.constexpr = q_rows.type.shape[0]
        s_layout: gl.constexpr = wgmma_layouts(BN, D)[0]
        o_layout: gl.constexpr = wgmma_layouts(BN, D)[1]
        p_layout: gl.constexpr = wgmma_layouts(BN, D)[2]
        rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        s_zero = gl.zeros([ROWS, BN], gl.float32, s_layout)

        STAGES: gl.constexpr = k_bufs.type.shape[0]
        first = base % STAGES
        mbarrier.wait(q_bar, q_phase)
        mbarrier.wait(k_ready.index(first), (base // STAGES) & 1)
        s = warpgroup_mma(q_rows, k_bufs.index(first).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        mbarrier.arrive(k_empty.index(first), count=1)
        if n_blocks == 1:
            s = _masked(s, 0, offs_m, Tk, CAUSAL, BN)
        m_i = gl.max(s, 1) * qk_scale
        p = gl.exp2(s * qk_scale - m_i[:, None])
        l_i = gl.sum(p, 1)
        p_op = gl.convert_layout(p.to(q_rows.dtype), p_layout)
        acc = gl.zeros([ROWS, D], gl.float32, o_layout)

        # Nothing is in flight from one block to the next.
        for j in range(1, n_blocks - 1):
            acc, p_op, m_i, l_i = _step(j, base, False, q_rows, ring, s_zero, acc, p_op, m_i, l_i, qk_scale,
                                        offs_m, Tk, CAUSAL, BN, rows_o, turns, HALF, PINGPONG)  # fmt: skip
        if n_blocks > 1:
            acc, p_op, m_i, l_i = _step(n_blocks - 1, base, True, q_rows, ring, s_zero, acc, p_op, m_i, l_i,
                                        qk_scale, offs_m, Tk, CAUSAL, BN, rows_o, turns, HALF,
                                        PINGPONG)  # fmt: skip
        return acc, p_op, m_i, l_i

    @gluon.jit
    def _finish(last, ring, acc, p_op, m_i, l_i):
        """The ring's use ``last`` (the query block's last key block)'s
        ``P V``, then the rows' output ``acc / l`` and ``lse`` (natural
        log)."""
        k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty = ring
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        rows_o: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
        slot = last % STAGES
        mbarrier.wait(v_ready.index(slot), (last // STAGES) & 1)
        acc = warpgroup_mma(p_op, v_bufs.index(slot), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
        mbarrier.arrive(v_empty.index(slot), count=1)
        # Every row (those past Tq too, never stored) sees key 0: l_i > 0.
        return acc / gl.convert_layout(l_i, rows_o)[:, None], (m_i + gl.log2(l_i)) * LN2

    @gluon.jit
    def _consumer(HALF: gl.constexpr, shared, CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                  D: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
        """One warp group, the query rows ``m0 + HALF * BM / 2`` on: the
        products, the softmax and the stores.  Two of these run side by side
        on the same K and V buffers, each at its own pace; ``shared``: what
        both take (buffers, barriers, the output's descriptor, scalars)."""
        q_smem, k_bufs, v_bufs, bars, o_desc, LSE, qk_scale, m0, col_q, lse_row, Tq, Tk, n_blocks = shared
        q_bar, k_ready, k_empty, v_ready, v_empty, turns = bars
        ROWS: gl.constexpr = BM // 2
        dtype: gl.constexpr = q_smem.dtype
        rows_s: gl.constexpr = gl.SliceLayout(1, wgmma_layouts(BN, D)[0])
        q_rows = q_smem.slice(HALF * ROWS, ROWS)
        r0 = m0 + HALF * ROWS
        ring = (k_bufs, v_bufs, k_ready, k_empty, v_ready, v_empty)
        offs_m = r0 + gl.arange(0, ROWS, layout=rows_s)

        acc, p_op, m_i, l_i = _attend(q_bar, 0, q_rows, ring, 0, offs_m, n_blocks, qk_scale, Tk, CAUSAL,
                                      BN, D, turns, HALF, PINGPONG)  # fmt: skip
        out, lse = _finish(n_blocks - 1, ring, acc, p_op, m_i, l_i)
        gl.store(LSE + lse_row + offs_m, lse, mask=offs_m < Tq)
        # These rows of Q's buffer are free (this group's products are done;
        # the other group reads only its own rows): the output leaves through
        # them, and the TMA store drops the rows past Tq.
        q_rows.store(out.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [r0, col_q], q_rows)
        tma.store_wait(0)

    @gluon.jit(do_not_specialize=["B", "Tq", "Tk"])
    def flash_fwd_gluon_kernel(
        Q,
        K,
        V,
        QRANGE,
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
    ):
        """Grid ``(cdiv(Tq, BM), B * HQ)``: ``BM`` query rows of one (batch,
        query head); head ``hq`` reads key head ``hq // (HQ // H)``.  Causal
        query blocks run last block first (they see the most keys).
        Launched with ``num_warps`` 4 (the first consumer group; the second
        and the producer warp are the partitions' own) and ``maxnreg`` 168.
        ``GATE`` 1: the first launch of a gated pair (flash.gated_pair),
        which runs only the blocks holding a row whose segment holds every
        key (``QRANGE [B, 2, Tq]``, segment_ranges' format; any pointer for
        ``GATE`` 0); the others return at once.  ``PINGPONG``: the consumer
        groups take turns to issue their products (_step; it ran no faster
        on the H200, 39th session, so no plan sets it)."""
        gl.static_assert(BM == BN, "the mask is applied to the last key block only")
        pid_m = gl.program_id(0)
        if CAUSAL:
            pid_m = gl.num_programs(0) - 1 - pid_m
        pid_bh = gl.program_id(1)
        b = (pid_bh // HQ).to(gl.int64)
        m0 = pid_m * BM
        args = (Q, K, V, scale, Tq, Tk, OUT, LSE, b, pid_bh, m0)
        if GATE == 1:
            if gated_block(QRANGE + b * 2 * Tq, m0, Tq, Tk, BM):
                _forward_block(args, HQ, H, D, CAUSAL, BM, BN, STAGES, PINGPONG)
        else:
            _forward_block(args, HQ, H, D, CAUSAL, BM, BN, STAGES, PINGPONG)

    @gluon.jit
    def _forward_block(args, HQ: gl.constexpr, H: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr,
                       BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                       PINGPONG: gl.constexpr):  # fmt: skip
        """Query rows ``m0 .. m0 + BM`` of batch ``b`` and row ``pid_bh`` of
        the grid (flash_fwd_gluon_kernel; ``args``: its pointers and sizes,
        then ``b, pid_bh, m0``)."""
        Q, K, V, scale, Tq, Tk, OUT, LSE, b, pid_bh, m0 = args
        hq = pid_bh % HQ
        h = hq // (HQ // H)
        dtype: gl.constexpr = Q.dtype.element_ty
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        # One descriptor per batch on its own base: rows past T are zeros
        # (loads) or dropped (stores), never the next batch's.
        q_desc = batch_rows(Q, b, Tq, HQ * D, BM, D, layout)
        o_desc = batch_rows(OUT, b, Tq, HQ * D, BM // 2, D, layout)
        k_desc = batch_rows(K, b, Tk, H * D, BN, D, layout)
        v_desc = batch_rows(V, b, Tk, H * D, BN, D, layout)

        q_smem = gl.allocate_shared_memory(dtype, [BM, D], layout)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], layout)
        bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
        q_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        mbarrier.init(q_bar, count=1)
        # gluon_parts.ring is this ring, but it initialises K's barriers
        # before V's, which compiles differently: kept as measured.
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            # Both consumer groups release each slot.
            mbarrier.init(k_empty.index(i), count=2)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(v_empty.index(i), count=2)
        if PINGPONG:
            turns = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
            mbarrier.init(turns.index(0), count=1)
            mbarrier.init(turns.index(1), count=1)
        else:
            turns = q_bar  # unused
        bars = (q_bar, k_ready, k_empty, v_ready, v_empty, turns)

        n_blocks = key_blocks(m0 + BM, Tk, CAUSAL, BN)
        col_q = hq * D
        col_k = h * D
        lse_row = (b * HQ + hq) * Tq
        qk_scale = scale * LOG2E
        shared = (q_smem, k_bufs, v_bufs, bars, o_desc, LSE, qk_scale, m0, col_q, lse_row, Tq, Tk, n_blocks)
        gl.warp_specialize(
            [
                (_consumer, (0, shared, CAUSAL, BM, BN, D, PINGPONG)),
                (_consumer, (1, shared, CAUSAL, BM, BN, D, PINGPONG)),
                (
                    _producer,
                    (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, bars, m0, col_q, col_k, n_blocks, BN),
                ),
            ],
            [4, 1],
            [240, 24],
        )

    # The launcher must give this kernel global scratch (its descriptors live there).
    flash_fwd_gluon_kernel.needs_global_scratch = True
else:  # pragma: no cover
    flash_fwd_gluon_kernel = None
