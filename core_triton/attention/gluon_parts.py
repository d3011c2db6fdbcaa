"""Pieces the Gluon kernels share (flash_fwd_gluon, flash_bwd_dq_gluon,
flash_bwd_dkdv_gluon): Gluon itself, imported once (``AVAILABLE`` False,
and the names None, where the installed Triton has no Gluon or another API:
then no plan takes a Gluon kernel), per-batch TMA descriptors, the
mbarriers of a ring of shared slots and the producer's load into one."""

try:  # Gluon is experimental.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    AVAILABLE = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = gl = fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = None
    AVAILABLE = False

if AVAILABLE:

    @gluon.constexpr_function
    def wgmma_layouts(N, D):
        """The layouts of one warp group's products (4 warps, 16-row
        ``wgmma`` steps): the accumulator of a ``[rows, N]`` product (the
        scores), that of a ``[rows, D]`` one (the output or a gradient),
        and the registers' operand of a product into the second (``P`` or
        ``dS`` from registers)."""
        scores = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 16])
        out = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
        return scores, out, gl.DotOperandLayout(operand_index=0, parent=out, k_width=2)

    @gluon.jit
    def key_blocks(r_end, Tk, CAUSAL: gl.constexpr, BN: gl.constexpr):
        """How many key blocks of ``BN`` query rows ``.. r_end - 1`` see
        (causal, top-left aligned: keys up to the last row's own position)."""
        end = gl.minimum(Tk, r_end) if CAUSAL else Tk
        return gl.cdiv(end, BN)

    @gluon.jit
    def batch_rows(
        base, b, T, width: gl.constexpr, block: gl.constexpr, D: gl.constexpr, layout: gl.constexpr
    ):
        """A TMA descriptor over batch ``b``'s rows of ``[B, T, width]``
        (row-major at ``base``), ``[block, D]`` at a time: rows past ``T``
        read as zeros and are dropped from stores, never another batch's."""
        return tma.make_tensor_descriptor(base + b * T * width, [T, width], [width, 1], [block, D], layout)

    @gluon.jit
    def grad_inputs(Q, DO, K, V, b, Tq, Tk, HQ: gl.constexpr, H: gl.constexpr, D: gl.constexpr,
                    BM: gl.constexpr, BN: gl.constexpr, layout: gl.constexpr):  # fmt: skip
        """The backward's input descriptors of batch ``b`` (batch_rows), in
        this order: Q and dO ``[B, Tq, HQ, D]`` ``BM`` rows at a time, K and
        V ``[B, Tk, H, D]`` ``BN`` rows at a time."""
        return (
            batch_rows(Q, b, Tq, HQ * D, BM, D, layout),
            batch_rows(DO, b, Tq, HQ * D, BM, D, layout),
            batch_rows(K, b, Tk, H * D, BN, D, layout),
            batch_rows(V, b, Tk, H * D, BN, D, layout),
        )

    @gluon.jit
    def gate_rows(RANGE, start, T, BLOCK: gl.constexpr, WARPS: gl.constexpr = 4):
        """``(lo, hi)`` of rows ``start .. start + BLOCK`` of a side of length
        ``T`` in ``RANGE [2 T]`` (segment_ranges' format), over ``WARPS``
        warps (the partition's)."""
        offs = start + gl.arange(0, BLOCK, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
        valid = offs < T
        lo = gl.load(RANGE + offs, mask=valid, other=-1)
        hi = gl.load(RANGE + T + offs, mask=valid, other=0)
        return lo, hi

    @gluon.jit
    def gate_open(lo, hi, T_other):
        """Whether the rows of gate_rows' ``(lo, hi)`` hold one whose range
        is exact and holds the whole other side ``[0, T_other)``
        (flash_common.gated_rows, kind 1): the blocks a gated pair's first
        launch runs (flash.gated_pair)."""
        return gl.max(((lo == 0) & (hi >= T_other)).to(gl.int32), 0) > 0

    @gluon.jit
    def gated_block(RANGE, start, T, T_other, BLOCK: gl.constexpr):
        """gate_open of rows ``start .. start + BLOCK`` (4 warps)."""
        lo, hi = gate_rows(RANGE, start, T, BLOCK)
        return gate_open(lo, hi, T_other)

    @gluon.jit
    def ring(STAGES: gl.constexpr, CONSUMERS: gl.constexpr = 2):
        """``(ready, empty)`` mbarriers of a ring of ``STAGES`` slots: one
        arrival (the producer's expected bytes) makes a slot ready, the
        ``CONSUMERS`` consumer groups' make it empty."""
        bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=CONSUMERS)
        return ready, empty

    @gluon.jit
    def own_rows_and_ring(dtype: gl.constexpr, OWN: gl.constexpr, OTHER: gl.constexpr, D: gl.constexpr,
                          STAGES: gl.constexpr, layout: gl.constexpr):  # fmt: skip
        """A backward program's shared memory (flash_bwd_dq_gluon,
        flash_bwd_dkdv_gluon): two inputs' ``[OWN, D]`` rows of its own,
        loaded once under one barrier, and a ring of ``STAGES`` slots of the
        other side's two inputs, ``[OTHER, D]`` each.  Returns ``(own_a,
        own_b, bufs_a, bufs_b, bars)``, ``bars = (own_bar, a_ready, a_empty,
        b_ready, b_empty)``."""
        own_a = gl.allocate_shared_memory(dtype, [OWN, D], layout)
        own_b = gl.allocate_shared_memory(dtype, [OWN, D], layout)
        bufs_a = gl.allocate_shared_memory(dtype, [STAGES, OTHER, D], layout)
        bufs_b = gl.allocate_shared_memory(dtype, [STAGES, OTHER, D], layout)
        own_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(own_bar, count=1)
        a_ready, a_empty = ring(STAGES)
        b_ready, b_empty = ring(STAGES)
        return own_a, own_b, bufs_a, bufs_b, (own_bar, a_ready, a_empty, b_ready, b_empty)

    @gluon.jit
    def fill_slot(desc, coords, bufs, ready, empty, i):
        """The producer's load of a ring's ``i``-th use: wait until slot ``i
        % STAGES`` is empty (both consumer groups released its last use),
        then copy ``desc``'s block at ``coords`` into it, signalling
        ``ready``.  A fresh mbarrier counts as having completed the phase
        before phase 0, so the first pass over the ring does not wait."""
        STAGES: gl.constexpr = bufs.type.shape[0]
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, coords, ready.index(slot), bufs.index(slot))
else:  # pragma: no cover - depends on the installed Triton
    batch_rows = ring = fill_slot = wgmma_layouts = key_blocks = grad_inputs = gated_block = None
    gate_rows = gate_open = None
    own_rows_and_ring = None
