"""Flash-attention backward through tensor descriptors (TMA on Hopper).

The backward half of issue 15's candidate (see flash_fwd_tma), opt in
(``flash.set_tma_backward``, or ``TWINKERNELS_FLASH_TMA_BWD=1`` before import).
It covers what the tensor-descriptor forward covers (contiguous bfloat16 or
float16 ``q``, ``k``, ``v`` and ``do``, ``D == DV`` in {64, 128}, grouped
heads, causal or not, sinks) and takes the forward's ``lse`` and the usual
``delta = rowsum(o * do)`` (flash_bwd_preprocess_kernel), whichever forward
made them.  Gradients come in the inputs' dtype.  The sinks' gradient is the
bindings' reduction of ``lse`` and ``delta``, as for the main kernels.

Both kernels read tiles through device-side descriptors on ``[B, T, H * D]``
views: rows past ``T`` come back as zeros, which is what they must
contribute (a zero query row and a zero ``do`` row give zero gradient; a
zero key and value row give zero ``dq``), so only the causal diagonal needs
a mask, and stores are clipped at ``T``.

* ``flash_bwd_dkdv_tma_kernel``, grid ``(cdiv(Tk, BN), B * H)``: ``BN`` keys
  of one key head; walks the query blocks of every query head of its group;
  writes ``dk`` and ``dv``.
* ``flash_bwd_dq_tma_kernel``, grid ``(cdiv(Tq, BM), B * HQ)``: ``BM``
  queries of one query head; walks the key blocks; writes ``dq``.
"""

import triton
import triton.language as tl

from core_triton.attention.flash_common import LOG2E
from core_triton.attention.flash_fwd_tma import seq_view
from core_triton.common.kernel_helpers import dot
from core_triton.common.runtime import jit


@triton.jit
def _dkdv_blocks(state, k, v, offs_n, q_desc, do_desc, LSE_bh, DELTA_bh, b, col, lo, hi, Tq, qk_scale,
                 D: tl.constexpr, BM: tl.constexpr, CAUSAL: tl.constexpr, MASK: tl.constexpr,
                 DOT_PREC: tl.constexpr):  # fmt: skip
    """Fold query blocks ``lo, lo + BM, ... < hi`` into ``state = (dk, dv)``
    (float32 ``[BN, D]``, ``dk`` without the softmax scale)."""
    dk, dv = state
    for start in tl.range(lo, hi, BM):
        offs_m = start + tl.arange(0, BM)
        q = q_desc.load([b, start, col]).reshape(BM, D)
        do = do_desc.load([b, start, col]).reshape(BM, D)
        # Rows past Tq: q and do are zeros, and lse = delta = 0 keeps p finite.
        lse = tl.load(LSE_bh + offs_m, mask=offs_m < Tq, other=0.0) * LOG2E
        delta = tl.load(DELTA_bh + offs_m, mask=offs_m < Tq, other=0.0)
        # Transposed scores: keys down, queries across.
        st = dot(k, tl.trans(q), DOT_PREC) * qk_scale
        pt = tl.exp2(st - lse[None, :])
        if MASK and CAUSAL:
            pt = tl.where(offs_m[None, :] >= offs_n[:, None], pt, 0.0)
        dv += dot(pt.to(do.dtype), do, DOT_PREC)
        dpt = dot(v, tl.trans(do), DOT_PREC)
        dst = pt * (dpt - delta[None, :])
        dk += dot(dst.to(q.dtype), q, DOT_PREC)
    return dk, dv


@jit(sizes=("B", "Tq", "Tk"))
def flash_bwd_dkdv_tma_kernel(
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
    HQ,
    H,
    DK,
    DV,
    D: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PREC: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    """``BN`` keys of key head ``h`` of batch ``b`` (``BN`` a multiple of
    ``BM``)."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    group = HQ // H
    n0 = pid_n * BN
    offs_n = n0 + tl.arange(0, BN)
    q_desc = seq_view(Q, B, Tq, HQ, D, BM)
    do_desc = seq_view(DO, B, Tq, HQ, D, BM)
    k_desc = seq_view(K, B, Tk, H, D, BN)
    v_desc = seq_view(V, B, Tk, H, D, BN)
    dk_desc = seq_view(DK, B, Tk, H, D, BN)
    dv_desc = seq_view(DV, B, Tk, H, D, BN)
    k = k_desc.load([b, n0, h * D]).reshape(BN, D)
    v = v_desc.load([b, n0, h * D]).reshape(BN, D)
    qk_scale = scale * LOG2E
    dk = tl.zeros([BN, D], dtype=tl.float32)
    dv = tl.zeros([BN, D], dtype=tl.float32)
    # Causal: query blocks from the one holding row n0; those that start
    # before the key block ends see part of it (mask), the rest all of it.
    if CAUSAL:
        lo = (n0 // BM) * BM
        masked_end = tl.minimum(n0 + BN, Tq)
    else:
        lo = 0
        masked_end = 0
    b64 = b.to(tl.int64)
    for i in range(0, group):
        hq = h * group + i
        LSE_bh = LSE + (b64 * HQ + hq) * Tq
        DELTA_bh = DELTA + (b64 * HQ + hq) * Tq
        col = hq * D
        dk, dv = _dkdv_blocks((dk, dv), k, v, offs_n, q_desc, do_desc, LSE_bh, DELTA_bh, b, col, lo,
                              masked_end, Tq, qk_scale, D, BM, CAUSAL, True, DOT_PREC)  # fmt: skip
        dk, dv = _dkdv_blocks((dk, dv), k, v, offs_n, q_desc, do_desc, LSE_bh, DELTA_bh, b, col,
                              tl.maximum(lo, masked_end), Tq, Tq, qk_scale, D, BM, CAUSAL, False,
                              DOT_PREC)  # fmt: skip
    dk_desc.store([b, n0, h * D], (dk * scale).to(DK.dtype.element_ty).reshape(1, BN, D))
    dv_desc.store([b, n0, h * D], dv.to(DV.dtype.element_ty).reshape(1, BN, D))


@triton.jit
def _dq_blocks(dq, q, do, lse, delta, offs_m, k_desc, v_desc, b, col, lo, hi, Tk, qk_scale,
               D: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr, MASK: tl.constexpr,
               DOT_PREC: tl.constexpr):  # fmt: skip
    """Fold key blocks ``lo, lo + BN, ... < hi`` into ``dq`` (float32 ``[BM,
    D]``, without the softmax scale)."""
    for start in tl.range(lo, hi, BN):
        k = k_desc.load([b, start, col]).reshape(BN, D)
        v = v_desc.load([b, start, col]).reshape(BN, D)
        s = dot(q, tl.trans(k), DOT_PREC) * qk_scale
        p = tl.exp2(s - lse[:, None])
        if MASK:
            offs_n = start + tl.arange(0, BN)
            allowed = (offs_n < Tk)[None, :]
            if CAUSAL:
                allowed = allowed & (offs_n[None, :] <= offs_m[:, None])
            p = tl.where(allowed, p, 0.0)
        dp = dot(do, tl.trans(v), DOT_PREC)
        ds = p * (dp - delta[:, None])
        dq += dot(ds.to(k.dtype), k, DOT_PREC)
    return dq


@jit(sizes=("B", "Tq", "Tk"))
def flash_bwd_dq_tma_kernel(
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
    HQ,
    H,
    DQ,
    D: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_PREC: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    """``BM`` queries of query head ``hq`` of batch ``b`` (``BM`` a multiple
    of ``BN``)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HQ
    hq = pid_bh % HQ
    h = hq // (HQ // H)
    m0 = pid_m * BM
    offs_m = m0 + tl.arange(0, BM)
    q_desc = seq_view(Q, B, Tq, HQ, D, BM)
    do_desc = seq_view(DO, B, Tq, HQ, D, BM)
    dq_desc = seq_view(DQ, B, Tq, HQ, D, BM)
    k_desc = seq_view(K, B, Tk, H, D, BN)
    v_desc = seq_view(V, B, Tk, H, D, BN)
    q = q_desc.load([b, m0, hq * D]).reshape(BM, D)
    do = do_desc.load([b, m0, hq * D]).reshape(BM, D)
    row = (b.to(tl.int64) * HQ + hq) * Tq
    lse = tl.load(LSE + row + offs_m, mask=offs_m < Tq, other=0.0) * LOG2E
    delta = tl.load(DELTA + row + offs_m, mask=offs_m < Tq, other=0.0)
    qk_scale = scale * LOG2E
    dq = tl.zeros([BM, D], dtype=tl.float32)
    # As the forward: whole blocks every row sees, then the masked rest.
    full = (Tk // BN) * BN
    if CAUSAL:
        full = tl.minimum(full, m0)
        end = tl.minimum(Tk, m0 + BM)
    else:
        end = Tk
    col = h * D
    dq = _dq_blocks(dq, q, do, lse, delta, offs_m, k_desc, v_desc, b, col, 0, full, Tk, qk_scale,
                    D, BN, CAUSAL, False, DOT_PREC)  # fmt: skip
    dq = _dq_blocks(dq, q, do, lse, delta, offs_m, k_desc, v_desc, b, col, full, end, Tk, qk_scale,
                    D, BN, CAUSAL, True, DOT_PREC)  # fmt: skip
    dq_desc.store([b, m0, hq * D], (dq * scale).to(DQ.dtype.element_ty).reshape(1, BM, D))


# The launcher must give these kernels global scratch (their descriptors live there).
flash_bwd_dkdv_tma_kernel.needs_global_scratch = True
flash_bwd_dq_tma_kernel.needs_global_scratch = True
