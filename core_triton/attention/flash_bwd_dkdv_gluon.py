"""Flash attention's dK/dV for Hopper (sm_90) written in Gluon: the plan's
pick for plain and causal half-precision attention at head dim 128 on
sm_90 GPUs (core_triton.attention.flash_tma_plans.gluon_backward), and
with segment ids the first launch of the dK/dV's gated pair (``GATE``:
only the key blocks holding a key whose segment holds every query).

The forward's split (flash_fwd_gluon) for the backward's key side, after
FlashAttention-3's backward: a program owns ``BN`` keys of one (batch, key
head); one producer warp loads their K and V once and then, for each query
head of the group and each query block of ``BM`` rows that can see them,
that block's Q and dO into a ring of ``STAGES`` slots; two consumer warp
groups own ``BN / 2`` keys each and walk the same ring:

    S^T  = K Q^T,   dP^T = V dO^T              (issued together)
    P^T  = exp2(S^T * scale * log2 e - lse * log2 e)   (while dP^T runs)
    dV  += P^T dO,  dK  += dS^T Q              (issued together)
    dS^T = P^T * (dP^T - delta)                (while dV's product runs)

with both products of a block retired before the next block starts (no
accumulator in flight across the loop's back edge: flash_fwd_gluon's
docstring says why).  ``dK`` is scaled by ``scale`` once at the end.  dQ
and ``delta`` come from the dQ launch before it (flash_bwd_dq_gluon or
flash_bwd_dq_kernel).

Inputs as flash_bwd_dkdv_kernel's for plain or causal attention: ``q, do
[B, Tq, HQ, D]``, ``k, v [B, Tk, H, D]`` contiguous bfloat16/float16,
``lse, delta [B, HQ, Tq]`` float32 (``lse`` natural log); outputs ``dk, dv
[B, Tk, H, D]`` in the inputs' dtype.  Causal is top-left aligned (query
``i`` sees keys ``<= i``).  Rows past ``Tq`` read as zeros and their
``lse`` as ``+inf`` (so ``P`` is 0 there); keys past ``Tk`` give rows that
are never stored.  Descriptors per batch, on the device, as the forward's.

Compiled for sm_90 with 168 registers a thread; ptxas keeps its wgmma
asynchronous (no warning C7514; tests/suites/flash_attention.py pins it).
At ``BM`` 64 (the plan's) it spills 96-136 bytes and still ran fastest
on the H200 (bench.probes.gluon_bwd, 39th session): B4 H16 T8k 7437 /
4305 us full / causal against flash_bwd_dkdv_kernel's 8738 / 4492 (``BM``
32: 8381 / 6502).
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
    mbarrier,
    own_rows_and_ring,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
    wgmma_layouts,
)

if AVAILABLE:

    @gluon.jit
    def _walk(Tq, n0, CAUSAL: gl.constexpr, BM: gl.constexpr):
        """The query blocks a key block starting at ``n0`` meets: ``[first,
        end)`` (causal: from the block holding query ``n0`` on)."""
        first = n0 // BM if CAUSAL else 0
        return first, gl.cdiv(Tq, BM)

    @gluon.jit
    def _producer(descs, k_smem, v_smem, q_bufs, do_bufs, bars, n0, h, Tq, HQ: gl.constexpr,
                  H: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr, BM: gl.constexpr):  # fmt: skip
        """One warp: K and V once, then Q and dO of every (query head,
        query block) pair in walk order, each slot reused once both
        consumer groups released it."""
        q_desc, do_desc, k_desc, v_desc = descs
        kv_bar, q_ready, q_empty, do_ready, do_empty = bars
        GROUP: gl.constexpr = HQ // H
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [n0, h * D], kv_bar, k_smem)
        tma.async_copy_global_to_shared(v_desc, [n0, h * D], kv_bar, v_smem)
        first, end = _walk(Tq, n0, CAUSAL, BM)
        i = 0
        for g in range(GROUP):
            col = (h * GROUP + g) * D
            for jb in range(first, end):
                fill_slot(q_desc, [jb * BM, col], q_bufs, q_ready, q_empty, i)
                fill_slot(do_desc, [jb * BM, col], do_bufs, do_ready, do_empty, i)
                i += 1

    @gluon.jit
    def _accumulate(b, h, lo, end, r0, q_bufs, do_bufs, ring, k_rows, v_rows, LSE, DELTA, Tq, qk_scale,
                    HQ: gl.constexpr, H: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr,
                    BM: gl.constexpr, BN: gl.constexpr):  # fmt: skip
        """One consumer group's dK and dV (unscaled) for its keys ``r0 ..
        r0 + BN / 2`` (``k_rows``, ``v_rows``): the query blocks ``[lo,
        end)`` of every query head of key head ``h``'s group, taken from
        the ring (``ring``: Q's and dO's ready and empty barriers).  Returns
        ``(dk, dv)``."""
        q_ready, q_empty, do_ready, do_empty = ring
        STAGES: gl.constexpr = q_bufs.type.shape[0]
        GROUP: gl.constexpr = HQ // H
        ROWS: gl.constexpr = BN // 2
        dtype: gl.constexpr = q_bufs.dtype
        st_layout: gl.constexpr = wgmma_layouts(BM, D)[0]
        acc_layout: gl.constexpr = wgmma_layouts(BM, D)[1]
        op_layout: gl.constexpr = wgmma_layouts(BM, D)[2]
        cols: gl.constexpr = gl.SliceLayout(0, st_layout)
        offs_n = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, st_layout))
        st_zero = gl.zeros([ROWS, BM], gl.float32, st_layout)
        dk = gl.zeros([ROWS, D], gl.float32, acc_layout)
        dv = gl.zeros([ROWS, D], gl.float32, acc_layout)
        i = gl.to_tensor(0)  # the ring's uses so far, carried through both loops
        for g in range(GROUP):
            row = (b * HQ + h * GROUP + g) * Tq
            for jb in range(lo, end):
                slot = i % STAGES
                phase = (i // STAGES) & 1
                q_tile = q_bufs.index(slot)
                do_tile = do_bufs.index(slot)
                mbarrier.wait(q_ready.index(slot), phase)
                st = warpgroup_mma(k_rows, q_tile.permute((1, 0)), st_zero, use_acc=False, is_async=True)
                mbarrier.wait(do_ready.index(slot), phase)
                dpt = warpgroup_mma(v_rows, do_tile.permute((1, 0)), st_zero, use_acc=False, is_async=True)
                offs_m = jb * BM + gl.arange(0, BM, layout=cols)
                valid = offs_m < Tq
                # Rows past Tq: lse +inf, so their probabilities are 0.
                lse2 = gl.load(LSE + row + offs_m, mask=valid, other=float("inf")) * LOG2E
                st = warpgroup_mma_wait(1, deps=(st,))
                pt = gl.exp2(st * qk_scale - lse2[None, :])
                if CAUSAL:
                    # Only the blocks on the diagonal hold a key past a query.
                    if jb * BM < r0 + ROWS:
                        pt = gl.where(offs_n[:, None] <= offs_m[None, :], pt, 0.0)
                p_op = gl.convert_layout(pt.to(dtype), op_layout)
                delta = gl.load(DELTA + row + offs_m, mask=valid, other=0.0)
                dpt = warpgroup_mma_wait(0, deps=(dpt,))
                dv = warpgroup_mma(p_op, do_tile, dv, is_async=True)
                ds_op = gl.convert_layout((pt * (dpt - delta[None, :])).to(dtype), op_layout)
                dk = warpgroup_mma(ds_op, q_tile, dk, is_async=True)
                dv, dk, p_op, ds_op = warpgroup_mma_wait(0, deps=(dv, dk, p_op, ds_op))
                mbarrier.arrive(q_empty.index(slot), count=1)
                mbarrier.arrive(do_empty.index(slot), count=1)
                i += 1
        return dk, dv

    @gluon.jit
    def _consumer(HALF: gl.constexpr, shared, HQ: gl.constexpr, H: gl.constexpr, D: gl.constexpr,
                  CAUSAL: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr):  # fmt: skip
        """One warp group: keys ``n0 + HALF * BN / 2`` on, their dK and dV
        summed over the walk, then stored."""
        k_smem, v_smem, q_bufs, do_bufs, bars, LSE, DELTA, dk_desc, dv_desc, scale, b, h, n0, Tq, Tk = shared
        kv_bar = bars[0]
        ring_bars = bars[1:]  # Q's and dO's ready and empty barriers
        ROWS: gl.constexpr = BN // 2
        dtype: gl.constexpr = q_bufs.dtype
        k_rows = k_smem.slice(HALF * ROWS, ROWS)
        v_rows = v_smem.slice(HALF * ROWS, ROWS)
        r0 = n0 + HALF * ROWS
        first, end = _walk(Tq, n0, CAUSAL, BM)
        mbarrier.wait(kv_bar, 0)
        dk, dv = _accumulate(b, h, first, end, r0, q_bufs, do_bufs, ring_bars, k_rows, v_rows, LSE, DELTA, Tq,
                             scale * LOG2E, HQ, H, D, CAUSAL, BM, BN)  # fmt: skip

        # This group's K and V rows are free now (its products are done; the
        # other group reads only its own): dK and dV leave through them, by
        # TMA stores that drop the rows past Tk (their gradients are their
        # own, never stored).
        k_rows.store((dk * scale).to(dtype))
        v_rows.store(dv.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(dk_desc, [r0, h * D], k_rows)
        tma.async_copy_shared_to_global(dv_desc, [r0, h * D], v_rows)
        tma.store_wait(0)

    @gluon.jit(do_not_specialize=["B", "Tq", "Tk"])
    def flash_bwd_dkdv_gluon_kernel(
        Q,
        K,
        V,
        DO,
        LSE,
        DELTA,
        KRANGE,
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
        GATE: gl.constexpr,
        BM: gl.constexpr,
        BN: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """Grid ``(cdiv(Tk, BN), B * H)``: ``BN`` keys of one (batch, key
        head), the query heads ``h * HQ / H ..`` of its group walked in
        turn.  Launched with ``num_warps`` 4 and ``maxnreg`` 168 (the
        consumers get 240, the producer 24).  ``GATE`` 1: the first launch
        of a gated pair (flash.gated_pair), which runs only the blocks
        holding a key whose segment holds every query (``KRANGE [B, 2,
        Tk]``, segment_ranges' format; any pointer for ``GATE`` 0); the
        others return at once."""
        pid_n = gl.program_id(0)
        pid_bh = gl.program_id(1)
        b = (pid_bh // H).to(gl.int64)
        n0 = pid_n * BN
        args = (Q, K, V, DO, LSE, DELTA, scale, Tq, Tk, DK, DV, b, pid_bh, n0)
        if GATE == 1:
            if gated_block(KRANGE + b * 2 * Tk, n0, Tk, Tq, BN):
                _dkdv_block(args, HQ, H, D, CAUSAL, BM, BN, STAGES)
        else:
            _dkdv_block(args, HQ, H, D, CAUSAL, BM, BN, STAGES)

    @gluon.jit
    def _dkdv_block(args, HQ: gl.constexpr, H: gl.constexpr, D: gl.constexpr, CAUSAL: gl.constexpr,
                    BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):  # fmt: skip
        """dK and dV of keys ``n0 .. n0 + BN`` of batch ``b`` and row
        ``pid_bh`` of the grid (flash_bwd_dkdv_gluon_kernel; ``args``: its
        pointers and sizes, then ``b, pid_bh, n0``)."""
        Q, K, V, DO, LSE, DELTA, scale, Tq, Tk, DK, DV, b, pid_bh, n0 = args
        h = pid_bh % H
        dtype: gl.constexpr = Q.dtype.element_ty
        layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        # One descriptor per batch on its own base: rows past T are zeros.
        descs = grad_inputs(Q, DO, K, V, b, Tq, Tk, HQ, H, D, BM, BN, layout)
        # The outputs half a key block at a time (each consumer group its own).
        dk_desc = batch_rows(DK, b, Tk, H * D, BN // 2, D, layout)
        dv_desc = batch_rows(DV, b, Tk, H * D, BN // 2, D, layout)

        # K and V of the program's keys; Q and dO blocks through the ring.
        k_smem, v_smem, q_bufs, do_bufs, bars = own_rows_and_ring(dtype, BN, BM, D, STAGES, layout)
        shared = (
            k_smem,
            v_smem,
            q_bufs,
            do_bufs,
            bars,
            LSE,
            DELTA,
            dk_desc,
            dv_desc,
            scale,
            b,
            h,
            n0,
            Tq,
            Tk,
        )
        gl.warp_specialize(
            [
                (_consumer, (0, shared, HQ, H, D, CAUSAL, BM, BN)),
                (_consumer, (1, shared, HQ, H, D, CAUSAL, BM, BN)),
                (_producer, (descs, k_smem, v_smem, q_bufs, do_bufs, bars, n0, h, Tq, HQ, H, D, CAUSAL, BM)),
            ],
            [4, 1],
            [240, 24],
        )

    # The launcher must give this kernel global scratch (its descriptors live there).
    flash_bwd_dkdv_gluon_kernel.needs_global_scratch = True
else:  # pragma: no cover
    flash_bwd_dkdv_gluon_kernel = None
