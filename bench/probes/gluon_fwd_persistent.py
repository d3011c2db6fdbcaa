"""A draft persistent variant of the Gluon flash forward
(core_triton.attention.flash_fwd_gluon), kept beside its probe
(bench.probes.gluon_flash, variant ``persistent``) until it has run on a
GPU; no plan takes it.

Why: fitted over the H200's times at B4 H16 T8k and B16 H16 T2k (both
4096 programs, 32 waves of one program an SM), a program of the Gluon
forward costs about 7 us besides 1.65 us a key block: barrier set-up, four
descriptors written to global scratch, Q's first load, the pipeline's
ramp, the output's store.  At T2k (16 key blocks a program) that is a
fifth of the launch, where the forward runs at 0.85-0.90 of cuDNN (target
0.90).  Here a program takes several query blocks of one (batch, query
head) in turn: ``TILES`` programs share a row, program ``p`` taking query
blocks ``p, p + TILES, ...`` (causal: counted from the last, heaviest
first), so its set-up is paid once and, while the consumers finish a
block (its last ``P V``, the output), the producer already loads the next
block's Q and keys.

Differences from the one-block kernel: the ring's position runs on across
blocks (``_step``'s ``r``); Q has its own pair of barriers (``q_ready``,
and ``q_empty``, which both consumer groups release after their last
``S`` of a block); the output leaves from registers (masked stores) rather
than through Q's buffer by TMA, since Q's buffer takes the next block's
rows while the consumers still normalise the last.  Everything else
(``_step``, masking only the last key block, the softmax) is the
one-block kernel's.  Plain or causal, no gate.

Inputs and outputs as flash_fwd_gluon_kernel's.  Grid ``(TILES, B *
HQ)``.
"""

from core_triton.attention.flash_common import LOG2E
from core_triton.attention.flash_fwd_gluon import _attend, _finish
from core_triton.attention.gluon_parts import (
    AVAILABLE,
    batch_rows,
    fill_slot,
    gl,
    gluon,
    key_blocks,
    mbarrier,
    ring,
    tma,
    wgmma_layouts,
)

if AVAILABLE:

    @gluon.jit
    def _query_block(t, n_m, CAUSAL: gl.constexpr):
        """The query block of a program's ``t``-th tile index (causal: the
        last block first)."""
        return n_m - 1 - t if CAUSAL else t

    @gluon.jit
    def _producer(descs, q_smem, k_bufs, v_bufs, bars, first, stride, n_m, col_q, col_k, Tk,
                  CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):  # fmt: skip
        """One warp: for each query block of the program, its Q once both
        consumer groups are done with the last one's, then K and V of
        each key block it sees into the ring."""
        q_desc, k_desc, v_desc = descs
        q_ready, q_empty, k_ready, k_empty, v_ready, v_empty = bars
        r = 0
        i = 0
        for t in range(first, n_m, stride):
            m0 = _query_block(t, n_m, CAUSAL) * BM
            # A fresh mbarrier counts as having completed the phase before 0.
            mbarrier.wait(q_empty, (i & 1) ^ 1)
            mbarrier.expect(q_ready, q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [m0, col_q], q_ready, q_smem)
            n_blocks = key_blocks(m0 + BM, Tk, CAUSAL, BN)
            for j in range(n_blocks):
                fill_slot(k_desc, [j * BN, col_k], k_bufs, k_ready, k_empty, r + j)
                fill_slot(v_desc, [j * BN, col_k], v_bufs, v_ready, v_empty, r + j)
            r += n_blocks
            i += 1

    @gluon.jit
    def _consumer(HALF: gl.constexpr, shared, CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                  D: gl.constexpr):  # fmt: skip
        """One warp group: rows ``HALF * BM / 2`` on of each of the
        program's query blocks in turn."""
        (
            q_smem,
            k_bufs,
            v_bufs,
            bars,
            OUT,
            LSE,
            qk_scale,
            first,
            stride,
            n_m,
            out_base,
            width,
            col_q,
            lse_row,
        ) = shared[:14]
        Tq, Tk = shared[14:]
        q_ready, q_empty = bars[:2]
        ROWS: gl.constexpr = BM // 2
        dtype: gl.constexpr = q_smem.dtype
        o_layout: gl.constexpr = wgmma_layouts(BN, D)[1]
        rows_s: gl.constexpr = gl.SliceLayout(1, wgmma_layouts(BN, D)[0])
        q_rows = q_smem.slice(HALF * ROWS, ROWS)
        ring_bufs = (k_bufs, v_bufs, bars[2], bars[3], bars[4], bars[5])
        r = 0
        i = 0
        for t in range(first, n_m, stride):
            m0 = _query_block(t, n_m, CAUSAL) * BM
            r0 = m0 + HALF * ROWS
            n_blocks = key_blocks(m0 + BM, Tk, CAUSAL, BN)
            offs_m = r0 + gl.arange(0, ROWS, layout=rows_s)
            # PINGPONG off: its turns barrier (here q_ready) is never used.
            acc, p_op, m_i, l_i = _attend(r, q_ready, i & 1, q_rows, ring_bufs, offs_m, n_blocks, qk_scale,
                                          Tk, CAUSAL, BN, D, q_ready, HALF, False)  # fmt: skip
            # Every S of this block has retired: Q's buffer may take the next.
            mbarrier.arrive(q_empty, count=1)
            out, lse = _finish(r + n_blocks - 1, ring_bufs, acc, p_op, m_i, l_i)
            gl.store(LSE + lse_row + offs_m, lse, mask=offs_m < Tq)
            rows = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
            at = (
                out_base
                + (rows.to(gl.int64) * width + col_q)[:, None]
                + gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))[None, :]
            )
            gl.store(OUT + at, out.to(dtype), mask=(rows < Tq)[:, None])
            r += n_blocks
            i += 1

    @gluon.jit(do_not_specialize=["B", "Tq", "Tk"])
    def flash_fwd_gluon_persistent_kernel(
        Q,
        K,
        V,
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
        BM: gl.constexpr,
        BN: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """Grid ``(TILES, B * HQ)``: program ``p`` of row ``bh`` takes query
        blocks ``p, p + TILES, ...`` of that (batch, query head).  Launched
        as the one-block kernel (``num_warps`` 4, ``maxnreg`` 168)."""
        gl.static_assert(BM == BN, "the mask is applied to the last key block only")
        first = gl.program_id(0)
        stride = gl.num_programs(0)
        pid_bh = gl.program_id(1)
        b = (pid_bh // HQ).to(gl.int64)
        hq = pid_bh % HQ
        h = hq // (HQ // H)
        n_m = gl.cdiv(Tq, BM)
        dtype: gl.constexpr = Q.dtype.element_ty
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        descs = (
            batch_rows(Q, b, Tq, HQ * D, BM, D, layout),
            batch_rows(K, b, Tk, H * D, BN, D, layout),
            batch_rows(V, b, Tk, H * D, BN, D, layout),
        )
        q_smem = gl.allocate_shared_memory(dtype, [BM, D], layout)
        k_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], layout)
        v_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, D], layout)
        q_ready, q_empty = ring(1)
        k_ready, k_empty = ring(STAGES)
        v_ready, v_empty = ring(STAGES)
        bars = (q_ready.index(0), q_empty.index(0), k_ready, k_empty, v_ready, v_empty)
        out_base = b * Tq * (HQ * D)
        shared = (q_smem, k_bufs, v_bufs, bars, OUT, LSE, scale * LOG2E, first, stride, n_m, out_base, HQ * D,
                  hq * D, (b * HQ + hq) * Tq, Tq, Tk)  # fmt: skip
        gl.warp_specialize(
            [
                (_consumer, (0, shared, CAUSAL, BM, BN, D)),
                (_consumer, (1, shared, CAUSAL, BM, BN, D)),
                (
                    _producer,
                    (
                        descs,
                        q_smem,
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
                ),
            ],
            [4, 1],
            [240, 24],
        )

    # The launcher must give this kernel global scratch (its descriptors live there).
    flash_fwd_gluon_persistent_kernel.needs_global_scratch = True
else:  # pragma: no cover
    flash_fwd_gluon_persistent_kernel = None
