"""Flash attention's dQ (and ``delta``) for Hopper (sm_90) written in
Gluon: the plan's pick for plain and causal half-precision attention at
head dim 128 on sm_90 GPUs without an ``lse`` cotangent
(core_triton.attention.flash_tma_plans.gluon_backward), and with segment
ids the first launch of the dQ's gated pair (``GATE``: only the query
blocks holding a row whose segment holds every key).

The forward's split (core_triton.attention.flash_fwd_gluon) for the
backward's query side: a program owns ``BM`` query rows of one (batch,
query head); one producer warp loads their Q and dO once, then K and V of
each key block they see into a ring of ``STAGES`` slots; two consumer warp
groups own ``BM / 2`` rows each.  A group first makes its rows' ``delta =
rowsum(dO * O)`` (stored: the dK/dV launch reads it), then walks the keys:

    S  = Q K^T,   dP = dO V^T          (issued together)
    P  = exp2(S * scale * log2 e - lse * log2 e)   (while dP runs)
    dQ += (P * (dP - delta)) K          (retired within the block)

and scales ``dQ`` by ``scale`` once at the end.  Nothing is in flight
across the loop's back edge (flash_fwd_gluon's docstring says why).

Inputs as flash_bwd_dq_kernel's for plain or causal attention without an
``lse`` cotangent: ``q, o, do [B, Tq, HQ, D]``, ``k, v [B, Tk, H, D]``
contiguous bfloat16/float16, ``lse [B, HQ, Tq]`` float32 natural log;
outputs ``dq [B, Tq, HQ, D]`` in the inputs' dtype and ``delta [B, HQ,
Tq]`` float32.  Causal is top-left aligned.  Only the key blocks that
reach past a group's first row (causal) or past ``Tk`` are masked.

Compiled for sm_90 with 168 registers a thread, no spills; ptxas keeps its
wgmma asynchronous (no warning C7514; tests/suites/flash_attention.py pins
it).  On the H200 (bench.probes.gluon_bwd, 39th session; key block, stages):
B4 H16 T8k 4773 / 2534 us full / causal at (128, 2) against
flash_bwd_dq_kernel's 6134 / 3149; (64, 2) and (64, 3) within 3% of it.
"""

from core_triton.attention.flash_common import LOG2E
from core_triton.attention.gluon_parts import (
    AVAILABLE,
    batch_rows,
    fence_async_shared,
    fill_slot,
    gated_block,
    gl,
    gluon,
    grad_inputs,
    key_blocks,
    mbarrier,
    own_rows_and_ring,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
    wgmma_layouts,
)

if AVAILABLE:

    @gluon.jit
    def _producer(descs, q_smem, do_smem, k_bufs, v_bufs, bars, m0, col_q, col_k, Tk,
                  CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):  # fmt: skip
        """One warp: Q and dO once, then K and V of each key block the
        program's rows see into the ring."""
        q_desc, do_desc, k_desc, v_desc = descs
        qd_bar, k_ready, k_empty, v_ready, v_empty = bars
        mbarrier.expect(qd_bar, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [m0, col_q], qd_bar, q_smem)
        tma.async_copy_global_to_shared(do_desc, [m0, col_q], qd_bar, do_smem)
        for j in range(key_blocks(m0 + BM, Tk, CAUSAL, BN)):
            fill_slot(k_desc, [j * BN, col_k], k_bufs, k_ready, k_empty, j)
            fill_slot(v_desc, [j * BN, col_k], v_bufs, v_ready, v_empty, j)

    @gluon.jit
    def _accumulate(qd_bar, q_rows, do_rows, k_bufs, v_bufs, ring, OUT, LSE, DELTA, scale, b, hq, m0, r0, Tq,
                    Tk, HQ: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr, BM: gl.constexpr,
                    BN: gl.constexpr):  # fmt: skip
        """One consumer group's rows ``r0 .. r0 + BM / 2`` of the query block
        at ``m0`` (``q_rows``, ``do_rows``, ready once ``qd_bar`` completes
        its first phase): their delta, stored, then their dQ (unscaled) over
        the key blocks the block sees, taken from the ring (``ring``: K's and
        V's ready and empty barriers)."""
        k_ready, k_empty, v_ready, v_empty = ring
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        ROWS: gl.constexpr = BM // 2
        dtype: gl.constexpr = q_rows.dtype
        s_layout: gl.constexpr = wgmma_layouts(BN, D)[0]
        acc_layout: gl.constexpr = wgmma_layouts(BN, D)[1]
        op_layout: gl.constexpr = wgmma_layouts(BN, D)[2]
        io_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        row_base = (b * HQ + hq) * Tq

        # delta = rowsum(dO * O) from global memory (the output is read nowhere else).
        io_rows = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, io_layout))
        io_cols = gl.arange(0, D, layout=gl.SliceLayout(0, io_layout))
        at = ((b * Tq + io_rows) * (HQ * D) + hq * D)[:, None] + io_cols[None, :]
        io_valid = (io_rows < Tq)[:, None]
        mbarrier.wait(qd_bar, 0)
        o = gl.load(OUT + at, mask=io_valid, other=0.0).to(gl.float32)
        do = do_rows.load(io_layout).to(gl.float32)
        delta_io = gl.sum(o * do, 1)
        gl.store(DELTA + row_base + io_rows, delta_io, mask=io_rows < Tq)
        delta = gl.convert_layout(delta_io, rows_s)

        offs_m = r0 + gl.arange(0, ROWS, layout=rows_s)
        # Rows past Tq: lse +inf, so their probabilities are 0.
        lse2 = gl.load(LSE + row_base + offs_m, mask=offs_m < Tq, other=float("inf")) * LOG2E
        qk_scale = scale * LOG2E
        s_zero = gl.zeros([ROWS, BN], gl.float32, s_layout)
        dq = gl.zeros([ROWS, D], gl.float32, acc_layout)
        n_blocks = key_blocks(m0 + BM, Tk, CAUSAL, BN)
        # This group's rows see key blocks < mine; the program's ring walks
        # the other group's too (causal: the upper group sees more).
        mine = key_blocks(r0 + ROWS, Tk, CAUSAL, BN)
        # Each row sees the keys below `limit`; a block reaching past
        # `bound` holds keys some row of the group must not see.
        limit = gl.minimum(offs_m + 1, Tk) if CAUSAL else gl.full_like(offs_m, 0) + Tk
        bound = gl.minimum(r0 + 1, Tk) if CAUSAL else Tk
        for j in range(n_blocks):
            slot = j % STAGES
            phase = (j // STAGES) & 1
            mbarrier.wait(k_ready.index(slot), phase)
            mbarrier.wait(v_ready.index(slot), phase)
            if j < mine:
                k_tile = k_bufs.index(slot)
                s = warpgroup_mma(q_rows, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
                dp = warpgroup_mma(
                    do_rows, v_bufs.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True
                )
                s = warpgroup_mma_wait(1, deps=(s,))
                p = gl.exp2(s * qk_scale - lse2[:, None])
                # Keys past a row's position (causal) or past Tk: only in
                # the blocks that reach past the group's first row or Tk.
                if (j + 1) * BN > bound:
                    offs_n = j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
                    p = gl.where(offs_n[None, :] < limit[:, None], p, 0.0)
                dp = warpgroup_mma_wait(0, deps=(dp,))
                ds_op = gl.convert_layout((p * (dp - delta[:, None])).to(dtype), op_layout)
                dq = warpgroup_mma(ds_op, k_tile, dq, is_async=True)
                dq, ds_op = warpgroup_mma_wait(0, deps=(dq, ds_op))
            mbarrier.arrive(k_empty.index(slot), count=1)
            mbarrier.arrive(v_empty.index(slot), count=1)
        return dq

    @gluon.jit
    def _consumer(HALF: gl.constexpr, shared, HQ: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr,
                  BM: gl.constexpr, BN: gl.constexpr):  # fmt: skip
        """One warp group: rows ``m0 + HALF * BM / 2`` on; their delta, then
        their dQ over the key blocks they see."""
        q_smem, do_smem, k_bufs, v_bufs, bars, OUT, LSE, dq_desc, DELTA, scale, b, hq, m0, Tq, Tk = shared
        ROWS: gl.constexpr = BM // 2
        dtype: gl.constexpr = q_smem.dtype
        q_rows = q_smem.slice(HALF * ROWS, ROWS)
        do_rows = do_smem.slice(HALF * ROWS, ROWS)
        r0 = m0 + HALF * ROWS
        dq = _accumulate(bars[0], q_rows, do_rows, k_bufs, v_bufs, bars[1:], OUT, LSE, DELTA, scale, b, hq,
                         m0, r0, Tq, Tk, HQ, D, CAUSAL, BM, BN)  # fmt: skip

        # This group's Q rows are free now (its products are done; the other
        # group reads only its own): dQ leaves through them, by a TMA store
        # that drops the rows past Tq.
        q_rows.store((dq * scale).to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dq_desc, [r0, hq * D], q_rows)
        tma.store_wait(0)

    @gluon.jit(do_not_specialize=["B", "Tq", "Tk"])
    def flash_bwd_dq_gluon_kernel(
        Q,
        K,
        V,
        OUT,
        DO,
        LSE,
        QRANGE,
        scale,
        B,
        Tq,
        Tk,
        DQ,
        DELTA,
        HQ: gl.constexpr,
        H: gl.constexpr,
        D: gl.constexpr,
        CAUSAL: gl.constexpr,
        GATE: gl.constexpr,
        BM: gl.constexpr,
        BN: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """Grid ``(cdiv(Tq, BM), B * HQ)``: ``BM`` query rows of one (batch,
        query head), which reads key head ``hq // (HQ // H)``; causal blocks
        last first (they see the most keys).  Launched with ``num_warps`` 4
        and ``maxnreg`` 168 (the consumers get 240, the producer 24).
        ``GATE`` 1: the first launch of a gated pair (flash.gated_pair),
        which runs only the blocks holding a row whose segment holds every
        key (``QRANGE [B, 2, Tq]``, segment_ranges' format; any pointer for
        ``GATE`` 0); the others return at once."""
        pid_m = gl.program_id(0)
        if CAUSAL:
            pid_m = gl.num_programs(0) - 1 - pid_m
        pid_bh = gl.program_id(1)
        b = (pid_bh // HQ).to(gl.int64)
        m0 = pid_m * BM
        args = (Q, K, V, OUT, DO, LSE, scale, Tq, Tk, DQ, DELTA, b, pid_bh, m0)
        if GATE == 1:
            if gated_block(QRANGE + b * 2 * Tq, m0, Tq, Tk, BM):
                _dq_block(args, HQ, H, D, CAUSAL, BM, BN, STAGES)
        else:
            _dq_block(args, HQ, H, D, CAUSAL, BM, BN, STAGES)

    @gluon.jit
    def _dq_block(args, HQ: gl.constexpr, H: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr,
                  BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
        """dQ and delta of query rows ``m0 .. m0 + BM`` of batch ``b`` and
        row ``pid_bh`` of the grid (flash_bwd_dq_gluon_kernel; ``args``: its
        pointers and sizes, then ``b, pid_bh, m0``)."""
        Q, K, V, OUT, DO, LSE, scale, Tq, Tk, DQ, DELTA, b, pid_bh, m0 = args
        hq = pid_bh % HQ
        h = hq // (HQ // H)
        dtype: gl.constexpr = Q.dtype.element_ty
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        # One descriptor per batch on its own base: rows past T are zeros.
        descs = grad_inputs(Q, DO, K, V, b, Tq, Tk, HQ, H, D, BM, BN, layout)
        # dQ half a query block at a time (each consumer group its own).
        dq_desc = batch_rows(DQ, b, Tq, HQ * D, BM // 2, D, layout)

        # Q and dO of the program's rows; K and V blocks through the ring.
        q_smem, do_smem, k_bufs, v_bufs, bars = own_rows_and_ring(dtype, BM, BN, D, STAGES, layout)
        shared = (q_smem, do_smem, k_bufs, v_bufs, bars, OUT, LSE, dq_desc, DELTA, scale, b, hq, m0, Tq, Tk)
        gl.warp_specialize(
            [
                (_consumer, (0, shared, HQ, D, CAUSAL, BM, BN)),
                (_consumer, (1, shared, HQ, D, CAUSAL, BM, BN)),
                (
                    _producer,
                    (descs, q_smem, do_smem, k_bufs, v_bufs, bars, m0, hq * D, h * D, Tk, CAUSAL, BM, BN),
                ),
            ],
            [4, 1],
            [240, 24],
        )

    # The launcher must give this kernel global scratch (its descriptors live there).
    flash_bwd_dq_gluon_kernel.needs_global_scratch = True
else:  # pragma: no cover
    flash_bwd_dq_gluon_kernel = None
