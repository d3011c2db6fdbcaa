"""Flash-attention forward through tensor descriptors (TMA on Hopper).

A candidate fast path for issue 15, opt in (``flash.set_tma_forward``, or
``TWINKERNELS_FLASH_TMA=1`` before import), not the default until the H100
says it pays.  Same outputs as ``flash_fwd_kernel`` (``out [B, Tq, HQ, DV]``
in the inputs' dtype, ``lse [B, HQ, Tq]`` float32, natural log), so the
backward kernels take its results as they are.

What it covers (the plan falls back to ``flash_fwd_kernel`` for anything
else): contiguous ``q [B, Tq, HQ, D]``, ``k [B, Tk, H, D]``, ``v [B, Tk, H,
DV]`` in bfloat16 or float16 with ``D == DV`` in {64, 128}, grouped query
heads, causal or not (top-left aligned when ``Tq != Tk``, as the main
kernel), attention sinks, ``Tq, Tk >= 1``.

Loads and the output store go through device-side tensor descriptors on
3-D views ``[B, T, H * D]`` with ``[1, rows, D]`` boxes: the hardware
zero-fills rows past ``T`` of the batch (never the next batch's rows) and
clips the store, so no tile needs a mask.  Key blocks run in two parts: the
blocks every query row of the program may see, without a mask, then the
blocks that need one (the causal diagonal, the last partial block).

Device-side descriptors live in Triton's global scratch: the launcher must
have an allocator (torch: ``triton.set_allocator``; JAX: jax_api._compiled
passes the scratch as an extra output, where jax-triton 0.3.1 would pass a
null pointer).
"""

import triton
import triton.language as tl

from core_triton.attention.flash_common import LN2, LOG2E
from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit


@triton.jit
def seq_view(X, B, T, heads, D: tl.constexpr, ROWS: tl.constexpr):
    """A device-side descriptor of a contiguous ``[B, T, heads, D]`` tensor
    seen as ``[B, T, heads * D]``, in boxes of ``[1, ROWS, D]``: a box at
    ``[b, t, head * D]`` is ``ROWS`` rows of one head, zeros past ``T`` (the
    batch's own end) and clipped there on a store.  The batch stride is
    64-bit: one batch of a long sequence passes 2**31 elements."""
    row = heads * D
    return tl.make_tensor_descriptor(
        X, shape=[B, T, row], strides=[T.to(tl.int64) * row, row, 1], block_shape=[1, ROWS, D]
    )


@triton.jit
def _tma_blocks(state, q, offs_m, k_desc, v_desc, b, col, lo, hi, Tk, qk_scale,
                D: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr, MASK: tl.constexpr,
                DOT_PREC: tl.constexpr):  # fmt: skip
    """Fold key blocks ``lo, lo + BN, ... < hi`` into the online-softmax
    ``state = (acc, m_i, l_i)``; ``MASK``: drop keys past ``Tk`` and, when
    causal, keys after the query row."""
    acc, m_i, l_i = state
    for start in tl.range(lo, hi, BN):
        k = k_desc.load([b, start, col]).reshape(BN, D)
        s = dot(q, tl.trans(k), DOT_PREC) * qk_scale
        if MASK:
            offs_n = start + tl.arange(0, BN)
            allowed = (offs_n < Tk)[None, :]
            if CAUSAL:
                allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
            s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASK:
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # no NaN from -inf - -inf
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = v_desc.load([b, start, col]).reshape(BN, D)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, DOT_PREC)
        m_i = m_new
    return acc, m_i, l_i


@jit(sizes=("B", "Tq", "Tk"))
def flash_fwd_tma_kernel(
    Q,
    K,
    V,
    SINK,
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
    DOT_PREC: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    """Grid ``(cdiv(Tq, BM), B * HQ)``: ``BM`` query rows of one (batch,
    query head); head ``hq`` reads key head ``hq // (HQ // H)``.  ``BM`` is a
    multiple of ``BN``."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HQ
    hq = pid_bh % HQ
    h = hq // (HQ // H)
    m0 = pid_m * BM
    offs_m = m0 + tl.arange(0, BM)
    q_desc = seq_view(Q, B, Tq, HQ, D, BM)
    k_desc = seq_view(K, B, Tk, H, D, BN)
    v_desc = seq_view(V, B, Tk, H, D, BN)
    o_desc = seq_view(OUT, B, Tq, HQ, D, BM)
    q = q_desc.load([b, m0, hq * D]).reshape(BM, D)
    qk_scale = scale * LOG2E
    acc = tl.zeros([BM, D], dtype=tl.float32)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)

    # Blocks every row of the program sees whole: all full key blocks, or
    # (causal) those before the program's first row.  Then the rest up to
    # the last key a row may see, with the mask.
    full = (Tk // BN) * BN
    if CAUSAL:
        full = tl.minimum(full, m0)
        end = tl.minimum(Tk, m0 + BM)
    else:
        end = Tk
    col = h * D
    acc, m_i, l_i = _tma_blocks((acc, m_i, l_i), q, offs_m, k_desc, v_desc, b, col, 0, full, Tk, qk_scale,
                                D, BN, CAUSAL, False, DOT_PREC)  # fmt: skip
    acc, m_i, l_i = _tma_blocks((acc, m_i, l_i), q, offs_m, k_desc, v_desc, b, col, full, end, Tk, qk_scale,
                                D, BN, CAUSAL, True, DOT_PREC)  # fmt: skip

    if HAS_SINK:
        # As flash_fwd_kernel: sinks join the normaliser as logits with no value.
        offs_s = tl.arange(0, BS)
        sink = tl.load(SINK + hq * stride_sink + offs_s, mask=offs_s < n_sink, other=float("-inf"))
        sink = sink.to(tl.float32) * LOG2E
        m_f = tl.maximum(m_i, tl.max(sink, 0))
        m_use = tl.where(m_f == float("-inf"), 0.0, m_f)
        alpha = tl.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(tl.exp2(sink[None, :] - m_use[:, None]), 1)
        acc = acc * alpha[:, None]
        m_i = m_use
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * LN2)
    o_desc.store([b, m0, hq * D], out.to(OUT.dtype.element_ty).reshape(1, BM, D))
    b64 = b.to(tl.int64)
    tl.store(LSE + (b64 * HQ + hq) * Tq + offs_m, lse, mask=offs_m < Tq)


# The launcher must give this kernel global scratch (its descriptors live there).
flash_fwd_tma_kernel.needs_global_scratch = True
