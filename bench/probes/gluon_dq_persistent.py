"""A draft persistent variant of the Gluon dQ kernel
(core_triton.attention.flash_bwd_dq_gluon), kept beside its probe
(bench.probes.gluon_bwd, variants ``dQ pers``) until it has run on a GPU;
no plan takes it.

Why: fitted over the H200's times at B4 H16 T8k and B16 H16 T2k (4096
programs each), a program of the Gluon dQ costs about 8.5 us besides 2.2
us a key block (Q and dO's loads, delta from the output, the pipeline's
ramp, dQ's store), about a third of the launch at T2k.  As in
bench.probes.gluon_fwd_persistent, ``TILES`` programs share one (batch,
query head) and program ``p`` takes its query blocks ``p, p + TILES, ...``
(causal: counted from the last), so the set-up is paid once and the
producer loads the next block's Q, dO and keys while the consumers finish
the last.

Differences from the one-block kernel: the ring's position runs on across
blocks; Q and dO have a pair of barriers (``qd_ready``, and ``qd_empty``,
which both consumer groups release once their last products of a block
retired); dQ leaves from registers (masked stores), since Q's buffer takes
the next block.  Inputs, outputs and launch as flash_bwd_dq_gluon_kernel's;
grid ``(TILES, B * HQ)``.
"""

from bench.probes.gluon_fwd_persistent import _query_block
from core_triton.attention.flash_bwd_dq_gluon import _accumulate
from core_triton.attention.gluon_parts import (
    AVAILABLE,
    fill_slot,
    gl,
    gluon,
    grad_inputs,
    key_blocks,
    mbarrier,
    ring,
    tma,
    wgmma_layouts,
)

if AVAILABLE:

    @gluon.jit
    def _producer(descs, q_smem, do_smem, k_bufs, v_bufs, bars, first, stride, n_m, col_q, col_k, Tk,
                  CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):  # fmt: skip
        """One warp: for each query block of the program, its Q and dO once
        both consumer groups are done with the last one's, then K and V of
        each key block its rows see into the ring."""
        q_desc, do_desc, k_desc, v_desc = descs
        qd_ready, qd_empty, k_ready, k_empty, v_ready, v_empty = bars
        r = 0
        i = 0
        for t in range(first, n_m, stride):
            m0 = _query_block(t, n_m, CAUSAL) * BM
            mbarrier.wait(qd_empty, (i & 1) ^ 1)
            mbarrier.expect(qd_ready, q_desc.block_type.nbytes + do_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [m0, col_q], qd_ready, q_smem)
            tma.async_copy_global_to_shared(do_desc, [m0, col_q], qd_ready, do_smem)
            n_blocks = key_blocks(m0 + BM, Tk, CAUSAL, BN)
            for j in range(n_blocks):
                fill_slot(k_desc, [j * BN, col_k], k_bufs, k_ready, k_empty, r + j)
                fill_slot(v_desc, [j * BN, col_k], v_bufs, v_ready, v_empty, r + j)
            r += n_blocks
            i += 1

    @gluon.jit
    def _consumer(HALF: gl.constexpr, shared, HQ: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr,
                  BM: gl.constexpr, BN: gl.constexpr):  # fmt: skip
        """One warp group: rows ``HALF * BM / 2`` on of each of the
        program's query blocks in turn; their delta, then their dQ."""
        q_smem, do_smem, k_bufs, v_bufs, bars, OUT, LSE, DQ, DELTA = shared[:9]
        scale, b, hq, first, stride, n_m, Tq, Tk = shared[9:]
        qd_ready, qd_empty = bars[:2]
        ROWS: gl.constexpr = BM // 2
        dtype: gl.constexpr = q_smem.dtype
        acc_layout: gl.constexpr = wgmma_layouts(BN, D)[1]
        q_rows = q_smem.slice(HALF * ROWS, ROWS)
        do_rows = do_smem.slice(HALF * ROWS, ROWS)
        r = 0
        i = 0
        for t in range(first, n_m, stride):
            m0 = _query_block(t, n_m, CAUSAL) * BM
            r0 = m0 + HALF * ROWS
            dq = _accumulate(r, qd_ready, i & 1, q_rows, do_rows, k_bufs, v_bufs, bars[2:], OUT, LSE, DELTA,
                             scale, b, hq, m0, r0, Tq, Tk, HQ, D, CAUSAL, BM, BN)  # fmt: skip
            # Every product of this block has retired: Q and dO may take the next.
            mbarrier.arrive(qd_empty, count=1)

            rows = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, acc_layout))
            cols = gl.arange(0, D, layout=gl.SliceLayout(0, acc_layout))
            dq_at = ((b * Tq + rows) * (HQ * D) + hq * D)[:, None] + cols[None, :]
            gl.store(DQ + dq_at, (dq * scale).to(dtype), mask=(rows < Tq)[:, None])
            r += key_blocks(m0 + BM, Tk, CAUSAL, BN)
            i += 1

    @gluon.jit(do_not_specialize=["B", "Tq", "Tk"])
    def flash_bwd_dq_gluon_persistent_kernel(
        Q,
        K,
        V,
        OUT,
        DO,
        LSE,
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
        BM: gl.constexpr,
        BN: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """Grid ``(TILES, B * HQ)``: program ``p`` of row ``bh`` takes query
        blocks ``p, p + TILES, ...`` of that (batch, query head).  Launched
        as the one-block kernel (``num_warps`` 4, ``maxnreg`` 168)."""
        first = gl.program_id(0)
        stride = gl.num_programs(0)
        pid_bh = gl.program_id(1)
        b = (pid_bh // HQ).to(gl.int64)
        hq = pid_bh % HQ
        h = hq // (HQ // H)
        n_m = gl.cdiv(Tq, BM)
        dtype: gl.constexpr = Q.dtype.element_ty
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        descs = grad_inputs(Q, DO, K, V, b, Tq, Tk, HQ, H, D, BM, BN, layout)
        q_smem = gl.allocate_shared_memory(dtype, [BM, D], layout)
        do_smem = gl.allocate_shared_memory(dtype, [BM, D], layout)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], layout)
        qd_ready, qd_empty = ring(1)
        k_ready, k_empty = ring(STAGES)
        v_ready, v_empty = ring(STAGES)
        bars = (qd_ready.index(0), qd_empty.index(0), k_ready, k_empty, v_ready, v_empty)
        shared = (
            q_smem,
            do_smem,
            k_bufs,
            v_bufs,
            bars,
            OUT,
            LSE,
            DQ,
            DELTA,
            scale,
            b,
            hq,
            first,
            stride,
            n_m,
            Tq,
            Tk,
        )
        gl.warp_specialize(
            [
                (_consumer, (0, shared, HQ, D, CAUSAL, BM, BN)),
                (_consumer, (1, shared, HQ, D, CAUSAL, BM, BN)),
                (
                    _producer,
                    (
                        descs,
                        q_smem,
                        do_smem,
                        k_bufs,
                        v_bufs,
                        bars,
                        first,
                        stride,
                        n_m,
                        hq * D,
                        h * D,
                        Tk,
                        CAUSAL,
                        BM,
                        BN,
                    ),
                ),  # fmt: skip
            ],
            [4, 1],
            [240, 24],
        )

    # The launcher must give this kernel global scratch (its descriptors live there).
    flash_bwd_dq_gluon_persistent_kernel.needs_global_scratch = True
else:  # pragma: no cover
    flash_bwd_dq_gluon_persistent_kernel = None
