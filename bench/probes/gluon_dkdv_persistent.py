"""A draft persistent variant of the Gluon dK/dV kernel
(core_triton.attention.flash_bwd_dkdv_gluon), kept beside its probe
(bench.probes.gluon_bwd, variants ``dK/dV pers``) until it has run on a
GPU; no plan takes it.

Why: fitted over the H200's times at B4 H16 T8k and B16 H16 T2k (4096
programs each), a program of the Gluon dK/dV at ``BM`` 64 costs about 14
us besides 1.7 us a query block (K and V's loads, the pipeline's ramp, dK
and dV's stores), about a fifth of the launch at T2k.  As in
bench.probes.gluon_fwd_persistent, ``TILES`` programs share one (batch,
key head) and program ``p`` takes its key blocks ``p, p + TILES, ...``
(causal: the first, heaviest, first), so the set-up is paid once and the
producer loads the next block's K, V and first queries while the
consumers finish the last.

Differences from the one-block kernel: the ring's position runs on across
key blocks; K and V have a pair of barriers (``kv_ready``, and
``kv_empty``, which both consumer groups release once their last products
of a block retired); dK and dV leave from registers (masked stores),
since K's and V's buffers take the next block.  Inputs, outputs and launch
as flash_bwd_dkdv_gluon_kernel's; grid ``(TILES, B * H)``.
"""

from core_triton.attention.flash_bwd_dkdv_gluon import _accumulate, _walk
from core_triton.attention.flash_common import LOG2E
from core_triton.attention.gluon_parts import (
    AVAILABLE,
    fill_slot,
    gl,
    gluon,
    grad_inputs,
    mbarrier,
    ring,
    tma,
    wgmma_layouts,
)

if AVAILABLE:

    @gluon.jit
    def _producer(descs, k_smem, v_smem, q_bufs, do_bufs, bars, first, stride, n_k, h, Tq, HQ: gl.constexpr,
                  H: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr, BM: gl.constexpr,
                  BN: gl.constexpr):  # fmt: skip
        """One warp: for each key block of the program, its K and V once both
        consumer groups are done with the last one's, then Q and dO of every
        (query head, query block) pair that sees it into the ring."""
        q_desc, do_desc, k_desc, v_desc = descs
        kv_ready, kv_empty, q_ready, q_empty, do_ready, do_empty = bars
        GROUP: gl.constexpr = HQ // H
        i = 0
        n = 0
        for t in range(first, n_k, stride):
            n0 = t * BN
            mbarrier.wait(kv_empty, (n & 1) ^ 1)
            mbarrier.expect(kv_ready, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [n0, h * D], kv_ready, k_smem)
            tma.async_copy_global_to_shared(v_desc, [n0, h * D], kv_ready, v_smem)
            lo, end = _walk(Tq, n0, CAUSAL, BM)
            for g in range(GROUP):
                col = (h * GROUP + g) * D
                for jb in range(lo, end):
                    fill_slot(q_desc, [jb * BM, col], q_bufs, q_ready, q_empty, i)
                    fill_slot(do_desc, [jb * BM, col], do_bufs, do_ready, do_empty, i)
                    i += 1
            n += 1

    @gluon.jit
    def _consumer(HALF: gl.constexpr, shared, HQ: gl.constexpr, H: gl.constexpr, D: gl.constexpr,
                  CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):  # fmt: skip
        """One warp group: keys ``HALF * BN / 2`` on of each of the
        program's key blocks in turn, their dK and dV summed over the walk,
        then stored."""
        k_smem, v_smem, q_bufs, do_bufs, bars, LSE, DELTA, DK, DV = shared[:9]
        scale, b, h, first, stride, n_k, Tq, Tk = shared[9:]
        kv_ready, kv_empty = bars[:2]
        ring_bars = bars[2:]  # Q's and dO's ready and empty barriers
        ROWS: gl.constexpr = BN // 2
        dtype: gl.constexpr = q_bufs.dtype
        acc_layout: gl.constexpr = wgmma_layouts(BM, D)[1]
        k_rows = k_smem.slice(HALF * ROWS, ROWS)
        v_rows = v_smem.slice(HALF * ROWS, ROWS)
        out_cols = gl.arange(0, D, layout=gl.SliceLayout(0, acc_layout))
        i = 0
        n = 0
        for t in range(first, n_k, stride):
            n0 = t * BN
            r0 = n0 + HALF * ROWS
            lo, end = _walk(Tq, n0, CAUSAL, BM)
            mbarrier.wait(kv_ready, n & 1)
            dk, dv, i = _accumulate(i, b, h, lo, end, r0, q_bufs, do_bufs, ring_bars, k_rows, v_rows,
                                    LSE, DELTA, Tq, scale * LOG2E, HQ, H, D, CAUSAL, BM, BN)  # fmt: skip
            # Every product of this block has retired: K and V may take the next.
            mbarrier.arrive(kv_empty, count=1)

            keys = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, acc_layout))
            at = ((b * Tk + keys) * (H * D) + h * D)[:, None] + out_cols[None, :]
            keep = (keys < Tk)[:, None]
            gl.store(DK + at, (dk * scale).to(dtype), mask=keep)
            gl.store(DV + at, dv.to(dtype), mask=keep)
            n += 1

    @gluon.jit(do_not_specialize=["B", "Tq", "Tk"])
    def flash_bwd_dkdv_gluon_persistent_kernel(
        Q,
        K,
        V,
        DO,
        LSE,
        DELTA,
        scale,
        B,
        Tq,
        Tk,
        DK,
        DV,
        HQ: gl.constexpr,
        H: gl.constexpr,
        D: gl.constexpr,
        CAUSAL: gl.constexpr,
        BM: gl.constexpr,
        BN: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """Grid ``(TILES, B * H)``: program ``p`` of row ``bh`` takes key
        blocks ``p, p + TILES, ...`` of that (batch, key head), the query
        heads of its group walked in turn.  Launched as the one-block kernel
        (``num_warps`` 4, ``maxnreg`` 168)."""
        first = gl.program_id(0)
        stride = gl.num_programs(0)
        pid_bh = gl.program_id(1)
        b = (pid_bh // H).to(gl.int64)
        h = pid_bh % H
        n_k = gl.cdiv(Tk, BN)
        dtype: gl.constexpr = Q.dtype.element_ty
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        descs = grad_inputs(Q, DO, K, V, b, Tq, Tk, HQ, H, D, BM, BN, layout)
        k_smem = gl.allocate_shared_memory(dtype, [BN, D], layout)
        v_smem = gl.allocate_shared_memory(dtype, [BN, D], layout)
        q_bufs = gl.allocate_shared_memory(dtype, [STAGES, BM, D], layout)
        do_bufs = gl.allocate_shared_memory(dtype, [STAGES, BM, D], layout)
        kv_ready, kv_empty = ring(1)
        q_ready, q_empty = ring(STAGES)
        do_ready, do_empty = ring(STAGES)
        bars = (kv_ready.index(0), kv_empty.index(0), q_ready, q_empty, do_ready, do_empty)
        shared = (
            k_smem,
            v_smem,
            q_bufs,
            do_bufs,
            bars,
            LSE,
            DELTA,
            DK,
            DV,
            scale,
            b,
            h,
            first,
            stride,
            n_k,
            Tq,
            Tk,
        )
        gl.warp_specialize(
            [
                (_consumer, (0, shared, HQ, H, D, CAUSAL, BM, BN)),
                (_consumer, (1, shared, HQ, H, D, CAUSAL, BM, BN)),
                (
                    _producer,
                    (
                        descs,
                        k_smem,
                        v_smem,
                        q_bufs,
                        do_bufs,
                        bars,
                        first,
                        stride,
                        n_k,
                        h,
                        Tq,
                        HQ,
                        H,
                        D,
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
    flash_bwd_dkdv_gluon_persistent_kernel.needs_global_scratch = True
else:  # pragma: no cover
    flash_bwd_dkdv_gluon_persistent_kernel = None
