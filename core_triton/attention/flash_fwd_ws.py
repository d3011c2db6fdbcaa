"""Flash-attention forward with warp specialisation on Hopper (sm_90).

Triton 3.6 splits a loop written ``tl.range(..., warp_specialize=True)``
into a producer warp group that issues the tensor-descriptor (TMA) loads
of K and V and consumer warp groups that run the products and the softmax,
with register reallocation between them (``setmaxnreg``): the kernel is
launched with ``num_warps`` and runs with 8 more.  What the pass takes
(checked by compiling for sm_90, Triton 3.6): one loop holding every
matrix product of the kernel, 2-D descriptors, no product outside the
loop.  A second loop (the masked diagonal blocks) crashes the pass; a
masked block before or after the loop, or a branch inside it, makes the
pass leave the kernel unspecialised, as does a descriptor store under a
branch; a 3-D descriptor store reshaped from the tile crashes it.  So
every block is masked (causal: one integer compare and select per score
against each row's last visible key; otherwise a per-column bias fused
into the scaling), and the output goes out through masked stores.

Same outputs as ``flash_fwd_kernel`` (``out [B, Tq, HQ, D]`` in the
inputs' dtype, ``lse [B, HQ, Tq]`` float32, natural log), so the backward
kernels take its results as they are.  What it covers (the plan takes the
main kernel for anything else): contiguous ``q [B, Tq, HQ, D]``, ``k [B,
Tk, H, D]``, ``v [B, Tk, H, D]`` in bfloat16 or float16 with ``D`` 64 or
128, grouped query heads, causal (top-left aligned when ``Tq != Tk``, as
the main kernel) or not, attention sinks, ``Tq, Tk >= 1``.

Loads see the tensors as ``[B * T, heads * D]``: a query block past its
batch's last row reads the next batch's rows (or zeros past the end),
whose outputs are never stored; a key block past ``Tk`` would read keys
and values of the next batch, which the mask drops, but where those hold
infinities or NaN, ``0 * NaN`` would still reach this batch's output: so
the plan takes this kernel for several batches only when ``Tk`` is a
multiple of the key block (no block crosses a batch), and the main kernel
otherwise.  Descriptors live in Triton's global
scratch (the launcher gives it: torch ``triton.set_allocator``, JAX
jax_api._compiled).
"""

import triton
import triton.language as tl

from core_triton.attention.flash_common import LN2, LOG2E, block_and_row, gated_rows
from core_triton.common.kernel_helpers import dot, dot_acc
from core_triton.common.runtime import jit

# The mask's score for a dropped key, in the scores' log2 units: finite, so
# a block whose keys a row may not see leaves the running maximum alone
# (every row sees key 0, in the first block, so its maximum is a real score
# from then on) and adds exp2(-1e6 - m) = 0 to its normaliser.  It holds
# while real scores stay above it (|q.k| * scale below about 6.9e5, far past
# any real model's logits, where float32 scores keep no fraction anyway);
# -inf would lift the bound, but has not been checked on the GPU here.
MASKED = tl.constexpr(-1.0e6)


@triton.jit
def rows_view(X, rows, heads, D: tl.constexpr, ROWS: tl.constexpr):
    """A device-side descriptor of a contiguous ``[B, T, heads, D]`` tensor
    seen as ``[B * T, heads * D]`` (``rows = B * T``), in boxes of ``[ROWS,
    D]``: a box at ``[b * T + t, head * D]`` is ``ROWS`` rows of one head.
    (One descriptor per batch, on the batch's own base, gave wrong results
    on the H100 after Triton's warp-specialisation pass, Triton 3.6.)"""
    return tl.make_tensor_descriptor(
        X, shape=[rows, heads * D], strides=[heads * D, 1], block_shape=[ROWS, D]
    )


@jit(sizes=("B", "Tq", "Tk"))
def flash_fwd_ws_kernel(
    Q,
    K,
    V,
    SINK,
    QRANGE,
    scale,
    B,
    Tq,
    Tk,
    HQ,
    H,
    n_sink,
    stride_sink,
    OUT,
    LSE,
    D: tl.constexpr,
    BS: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_SINK: tl.constexpr,
    GATE: tl.constexpr,
    ORDER: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    """Grid ``(cdiv(Tq, BM), B * HQ)`` or its transpose (``ORDER``,
    flash_common.block_and_row): ``BM`` query rows of one (batch, query
    head); head ``hq`` reads key head ``hq // (HQ // H)``.  ``GATE`` 1: the
    first launch of a gated pair (flash.gated_pair), which runs only the
    blocks that hold a row whose segment holds every key (``QRANGE [B, 2
    Tq]``, segment_ranges' format; a placeholder for ``GATE`` 0)."""
    # Causal, the plan asks for ORDER 2 or 3 (flash_configs.program_order):
    # the last query blocks see the most keys, so they start first and the
    # short ones fill the tail of the launch.
    pid_m, pid_bh = block_and_row(ORDER)
    b = pid_bh // HQ
    hq = pid_bh % HQ
    h = hq // (HQ // H)
    m0 = pid_m * BM
    offs_m = m0 + tl.arange(0, BM)
    q_desc = rows_view(Q, B * Tq, HQ, D, BM)
    k_desc = rows_view(K, B * Tk, H, D, BN)
    v_desc = rows_view(V, B * Tk, H, D, BN)
    q = q_desc.load([b * Tq + m0, hq * D])
    qk_scale = scale * LOG2E
    acc = tl.zeros([BM, D], dtype=tl.float32)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    # Causal: each row's keys end at `visible` (exclusive), its own position
    # + 1; else every row's at Tk (a compare of columns only).
    visible = tl.minimum(offs_m + 1, Tk)
    end = tl.minimum(Tk, m0 + BM) if CAUSAL else Tk
    stored = offs_m < Tq
    if GATE == 1:
        # No branch (the pass would leave the kernel unspecialised): a block
        # with no such row walks no key and stores nothing.
        mine = tl.max(gated_rows(QRANGE + b.to(tl.int64) * 2 * Tq, offs_m, stored, Tq, Tk, 1).to(tl.int32), 0)
        end = tl.where(mine > 0, end, 0)
        stored = offs_m < tl.where(mine > 0, Tq, 0)
    kv_row = b * Tk
    col = h * D
    for start in tl.range(0, end, BN, warp_specialize=True):
        k = k_desc.load([kv_row + start, col])
        offs_n = start + tl.arange(0, BN)
        if CAUSAL:
            s = dot(q, tl.trans(k), None) * qk_scale
            s = tl.where(offs_n[None, :] < visible[:, None], s, MASKED)
        else:
            # Keys past Tk as a per-column bias, which joins the scaling in
            # one fused multiply-add per score: the mask costs nothing there
            # (a compare and select per score cost 10-12% of the forward).
            s = dot(q, tl.trans(k), None) * qk_scale + tl.where(offs_n < Tk, 0.0, MASKED)[None, :]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = v_desc.load([kv_row + start, col])
        acc = dot_acc(p.to(v.dtype), v, acc)
        m_i = m_new

    if HAS_SINK:
        # As flash_fwd_kernel: sinks join the normaliser as logits with no value.
        offs_s = tl.arange(0, BS)
        sink = tl.load(SINK + hq * stride_sink + offs_s, mask=offs_s < n_sink, other=float("-inf"))
        sink = sink.to(tl.float32) * LOG2E
        m_f = tl.maximum(m_i, tl.max(sink, 0))
        alpha = tl.exp2(m_i - m_f)
        l_i = l_i * alpha + tl.sum(tl.exp2(sink[None, :] - m_f[:, None]), 1)
        acc = acc * alpha[:, None]
        m_i = m_f
    # Every row (those past Tq too, never stored) sees key 0: l_i > 0, but
    # in a gated block that walked no key (it stores nothing).
    if GATE == 1:
        l_i = tl.where(l_i > 0, l_i, 1.0)
    out = (acc / l_i[:, None]).to(OUT.dtype.element_ty)
    lse = (m_i + tl.log2(l_i)) * LN2
    b64 = b.to(tl.int64)
    offs_d = tl.arange(0, D)
    rows = (b64 * Tq + offs_m) * (HQ * D) + hq * D
    tl.store(OUT + rows[:, None] + offs_d[None, :], out, mask=stored[:, None])
    tl.store(LSE + (b64 * HQ + hq) * Tq + offs_m, lse, mask=stored)


# The launcher must give this kernel global scratch (its descriptors live there).
flash_fwd_ws_kernel.needs_global_scratch = True
