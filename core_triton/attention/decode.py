"""``decode_attention``: a few new queries against a long KV cache (forward
only), as a split-KV ("flash-decoding") pair of kernels.

Layouts: ``query [B, Tq, HQ, D]`` (Tq 1 to 16); a contiguous cache ``key
[B, S, H, D]``, ``value [B, S, H, Dv]``, or a paged one ``[num_blocks,
page_size, H, D]`` with ``block_table [B, max_blocks]`` int32 (row ``b``'s
token ``s`` lives in page ``block_table[b, s // page_size]`` at slot ``s %
page_size``); ``kv_lens [B]`` int32, the valid length of each row.  Query
``t`` of row ``b`` has position ``kv_lens[b] - Tq + t`` and sees the keys
``s <= `` its position (causal among the new queries, which are the last
``Tq`` entries of the cache), within ``sliding_window`` if given.

Work: grid ``(B * H, splits)``.  A program takes one key/value head, all
``HQ / H`` query heads that read it and all ``Tq`` queries as the rows of
one tile (``BM >= 16`` rows for the tensor cores), and one slice of the
cache: the slices split each row's capacity evenly, so the GPU is full
at ``B = 1``.  Each program writes its slice's normalised partial output
and log-sum-exp (float32); the combine kernel merges the slices with the
sinks, one program per (row, key head).

Bounds: ``kv_lens`` is clamped into ``[0, capacity]`` and every page index
into ``[0, num_blocks)``: whatever the values (they are read on the device
only), no access leaves the tensors.  A query with no allowed key gets
output 0.
"""

from __future__ import annotations

import functools

import triton.language as tl

from core_triton.attention.flash_options import _cap, _window, check_sinks
from core_triton.common import checks
from core_triton.common.kernel_helpers import dot, hint16
from core_triton.common.launch import In, LaunchPlan, OutputSpec, TensorInfo
from core_triton.common.runtime import interpreter_requested, jit
from core_triton.common.utils import cdiv, next_power_of_2

_LOG2E = tl.constexpr(1.4426950408889634)
# Programs to aim for: about two waves of an H100's 132 SMs.
_TARGET_PROGRAMS = 264
# (BN, num_warps, num_stages) of the split kernel on a GPU, for contiguous
# and for paged caches.  The H100 sweep (bench.probes.decode_sweep, GQA 32/8, D128
# bf16) found the candidates within a few percent of each other on
# contiguous caches once loads are vectorised, (128, 8, 3) best or tied in
# four of six cases; on 64-token pages it lost 15% at batch 16 against
# (64, 4, 2) in bench/decode.py, which kept paged caches at the contiguous
# speed.
# When rows x heads alone cannot fill the GPU (the cache is split), each
# program streams a long slice: (64, 4, 3) keeps two programs per SM
# (96 KB of shared memory each) and read 64k-128k caches at batch 1 9-10%
# faster than (128, 8, 3) (one per SM), which stays best when rows x heads
# fill the GPU (batch 64: 5%).
# Paged caches likewise: (64, 8, 3) 2-8% faster than (64, 4, 2) when split
# (batch 1, batch 16 at 4k), 20% slower at batch 64 (bench.probes.decode_sweep paged).
CONFIG = (128, 8, 3)
SPLIT_CONFIG = (64, 4, 3)
PAGED_CONFIG = (64, 4, 2)
PAGED_SPLIT_CONFIG = (64, 8, 3)
# Slices the combine kernel reads at once.
_COMBINE_TILE = 64


def set_config(config: tuple[int, int, int], paged: bool = False, split: bool = False) -> None:
    """Use ``(BN, num_warps, num_stages)`` for contiguous (or ``paged``)
    caches, those ``split`` over several programs per row and head or not,
    from the next call on (plans made before are dropped)."""
    global CONFIG, PAGED_CONFIG, SPLIT_CONFIG, PAGED_SPLIT_CONFIG
    if paged and split:
        PAGED_SPLIT_CONFIG = tuple(config)
    elif paged:
        PAGED_CONFIG = tuple(config)
    elif split:
        SPLIT_CONFIG = tuple(config)
    else:
        CONFIG = tuple(config)
    decode_plans.cache_clear()


# The strides decode_split_kernel hints as multiples of 16 (kernel_helpers.hint16):
# query, key and value caches, each batch (or page), time (or slot) and head.
# Bit i of its DIV16 stands for the i-th (stride_bits sets them).
HINTED = ("qb", "qt", "qh", "kb", "ks", "kh", "vb", "vs", "vh")
(QB, QT, QH, KB, KS, KH, VB, VS, VH) = (tl.constexpr(1 << i) for i in range(len(HINTED)))


def stride_bits(query: TensorInfo, key_cache: TensorInfo, value_cache: TensorInfo) -> int:
    """decode_split_kernel's ``DIV16``: :data:`HINTED`'s bit of each of
    those strides that is a multiple of 16."""
    strides = (*query.strides[:3], *key_cache.strides[:3], *value_cache.strides[:3])
    return sum(1 << HINTED.index(n) for n, st in zip(HINTED, strides, strict=True) if st % 16 == 0)


@jit(sizes=("B", "S_CAP", "PER_SPLIT", "NUM_BLOCKS"))
def decode_split_kernel(
    Q, K, V, KV_LENS, TABLE, SINK,
    B, S_CAP, PER_SPLIT, NUM_BLOCKS, scale, cap, left,
    sqb, sqt, sqh, skb, sks, skh, svb, svs, svh, stb,
    OUT, L_PART,
    H: tl.constexpr, G: tl.constexpr, TQ: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
    PAGED: tl.constexpr, PAGE: tl.constexpr, HAS_CAP: tl.constexpr, HAS_WINDOW: tl.constexpr,
    DOT_PREC: tl.constexpr, DIV16: tl.constexpr,
    FINAL: tl.constexpr, HAS_SINK: tl.constexpr, NS: tl.constexpr, BS: tl.constexpr, HQ: tl.constexpr,
):  # fmt: skip
    """One slice of one row's cache for one key head: ``OUT [B*H, splits, BM,
    DV]`` (normalised within the slice) and ``L_PART [B*H, splits, BM]`` (the
    slice's log-sum-exp, ``-inf`` where it holds no allowed key).  ``FINAL``
    (a single slice per row and head, so there is nothing to combine): ``OUT``
    is the output ``[B, Tq, HQ, Dv]``, with the sinks (``SINK [HQ, NS]``) in
    the normaliser, and the combine launch is saved."""
    # DIV16 has HINTED's bit of each stride that is a multiple of 16 (the
    # mask first: the interpreter passes DIV16 as an int, which takes no
    # constexpr).
    # jax-triton passes ints without Triton's divisibility specialisation;
    # without the hint every cache load splits into scalar loads (measured:
    # the JAX binding ran at a fifth of the PyTorch one's bandwidth).
    sqb = hint16(sqb, (QB & DIV16) != 0)
    sqt = hint16(sqt, (QT & DIV16) != 0)
    sqh = hint16(sqh, (QH & DIV16) != 0)
    skb = hint16(skb, (KB & DIV16) != 0)
    sks = hint16(sks, (KS & DIV16) != 0)
    skh = hint16(skh, (KH & DIV16) != 0)
    svb = hint16(svb, (VB & DIV16) != 0)
    svs = hint16(svs, (VS & DIV16) != 0)
    svh = hint16(svh, (VH & DIV16) != 0)
    # Key heads vary fastest between programs: the programs the GPU runs
    # together read the same cache rows' heads, whole rows of the cache
    # (H * D contiguous elements per token) rather than one head's slice
    # of each.
    bh = tl.program_id(0)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    b = bh // H
    h = bh % H
    rows = tl.arange(0, BM)
    t = rows % TQ
    g = rows // TQ
    row_ok = rows < G * TQ
    L = tl.load(KV_LENS + b).to(tl.int64)
    L = tl.minimum(tl.maximum(L, 0), S_CAP)
    qpos = L - TQ + t
    od = tl.arange(0, BD)
    odv = tl.arange(0, BDV)
    qh = h * G + g
    q_ptr = Q + b.to(tl.int64) * sqb + t[:, None] * sqt + qh[:, None] * sqh + od[None, :]
    q = tl.load(q_ptr, mask=row_ok[:, None] & (od[None, :] < D), other=0.0)
    lo = split.to(tl.int64) * PER_SPLIT
    hi = tl.minimum(lo + PER_SPLIT, L)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BDV], tl.float32)
    for s0 in range(lo, hi, BN):
        s = s0 + tl.arange(0, BN)
        s_ok = s < hi
        if PAGED:
            page = tl.load(TABLE + b.to(tl.int64) * stb + s // PAGE, mask=s_ok, other=0).to(tl.int64)
            page = tl.minimum(tl.maximum(page, 0), NUM_BLOCKS - 1)
            slot = s % PAGE
            k_row = page * skb + slot * sks
            v_row = page * svb + slot * svs
        else:
            k_row = b.to(tl.int64) * skb + s * sks
            v_row = b.to(tl.int64) * svb + s * svs
        k = tl.load(
            K + k_row[None, :] + h * skh + od[:, None], mask=s_ok[None, :] & (od[:, None] < D), other=0.0
        )
        x = dot(q, k, DOT_PREC) * scale
        if HAS_CAP:
            x = cap * (2.0 * tl.sigmoid(2.0 * x / cap) - 1.0)  # cap * tanh(x / cap)
        ok = s_ok[None, :] & row_ok[:, None] & (s[None, :] <= qpos[:, None])
        if HAS_WINDOW:
            ok = ok & (qpos[:, None] - s[None, :] <= left)
        x = tl.where(ok, x, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(x, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2((x - m_safe[:, None]) * _LOG2E)
        alpha = tl.exp2((m_i - m_safe) * _LOG2E)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(
            V + v_row[:, None] + h * svh + odv[None, :], mask=s_ok[:, None] & (odv[None, :] < DV), other=0.0
        )
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, DOT_PREC)
        m_i = m_new
    has = l_i > 0
    lse = tl.where(
        has, tl.where(m_i == float("-inf"), 0.0, m_i) + tl.log(tl.where(has, l_i, 1.0)), float("-inf")
    )
    base = (bh.to(tl.int64) * n_split + split) * BM
    tl.store(L_PART + base + rows, lse)
    if FINAL:
        # The normaliser over the one slice and the sinks, from a common max.
        m_all = m_i
        if HAS_SINK:
            o_s = tl.arange(0, BS)
            sink = tl.load(
                SINK + qh[:, None] * NS + o_s[None, :], mask=row_ok[:, None] & (o_s[None, :] < NS),
                other=float("-inf"),
            ).to(tl.float32)  # fmt: skip
            m_all = tl.maximum(m_all, tl.max(sink, axis=1))
        m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
        keep = tl.exp2((m_i - m_all) * _LOG2E)  # 0 where the slice has no key
        den = l_i * keep
        if HAS_SINK:
            den += tl.sum(tl.exp2((sink - m_all[:, None]) * _LOG2E), axis=1)
        out = acc * (keep / tl.where(den > 0, den, 1.0))[:, None]
        o_ptr = OUT + ((b.to(tl.int64) * TQ + t[:, None]) * HQ + qh[:, None]) * DV + odv[None, :]
        tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & (odv[None, :] < DV))
    else:
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        tl.store(OUT + (base + rows[:, None]) * DV + odv[None, :], out, mask=odv[None, :] < DV)


@jit(sizes=("B", "SPLITS"))
def decode_combine_kernel(
    O_PART, L_PART, SINK, B, SPLITS, OUT,
    H: tl.constexpr, G: tl.constexpr, TQ: tl.constexpr, DV: tl.constexpr, HQ: tl.constexpr,
    BM: tl.constexpr, BDV: tl.constexpr, NS: tl.constexpr, BS: tl.constexpr, HAS_SINK: tl.constexpr,
    SB: tl.constexpr,
):  # fmt: skip
    """``OUT [B, Tq, HQ, Dv]``: the slices merged by their log-sum-exp, the
    sinks (``[HQ, NS]`` logits with no value) in the normaliser.  One
    program per (row of the tile, batch row x key head); it reads ``SB``
    slices' partials at once (a fixed tile, however many slices a call
    has), merging tile after tile online: one dependent load per slice
    made this launch 18 us of a 113 us call at B = 1 (32 slices)."""
    r = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    t = r % TQ
    qh = h * G + r // TQ
    odv = tl.arange(0, BDV)
    m = tl.full([1], float("-inf"), tl.float32)
    if HAS_SINK:
        o_s = tl.arange(0, BS)
        sink = tl.load(SINK + qh * NS + o_s, mask=o_s < NS, other=float("-inf")).to(tl.float32)
        m = tl.maximum(m, tl.max(sink, axis=0))
    z = tl.zeros([1], tl.float32)
    acc = tl.zeros([BDV], tl.float32)
    for s0 in range(0, SPLITS, SB):
        sl = s0 + tl.arange(0, SB)
        base = (bh.to(tl.int64) * SPLITS + sl) * BM + r
        lse = tl.load(L_PART + base, mask=sl < SPLITS, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(lse, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2((m - m_safe) * _LOG2E)
        w = tl.exp2((lse - tl.sum(m_safe)) * _LOG2E)
        o = tl.load(
            O_PART + base[:, None] * DV + odv[None, :],
            mask=(sl[:, None] < SPLITS) & (odv[None, :] < DV),
            other=0.0,
        )
        z = z * alpha + tl.sum(w, axis=0)
        acc = acc * tl.sum(alpha) + tl.sum(w[:, None] * o, axis=0)
        m = m_new
    if HAS_SINK:
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        z += tl.sum(tl.exp2((sink - tl.sum(m_safe)) * _LOG2E), axis=0)
    zs = tl.sum(z)
    out = acc / tl.where(zs > 0, zs, 1.0)
    o_ptr = OUT + ((b.to(tl.int64) * TQ + t) * HQ + qh) * DV + odv
    tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=odv < DV)


def _check(
    query, key, value, kv_lens, block_table, softmax_scale, sliding_window, logits_soft_cap, softmax_aux
):
    for name, x in (("query", query), ("key_cache", key), ("value_cache", value)):
        checks.check_float_tensor(x, name)
        checks.check_rank(x, name, (4,), "4-D")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(
            "query, key_cache and value_cache must share one dtype, "
            f"got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    B, Tq, HQ, D = query.shape
    if not 1 <= Tq <= 16:
        raise ValueError(f"query must hold 1 to 16 new tokens per row (Tq), got {Tq}")
    H = key.shape[2]
    if key.shape[:3] != value.shape[:3] or key.shape[3] != D:
        raise ValueError(
            f"key_cache must be [..., H, {D}] and value_cache share its first three dims, "
            f"got {list(key.shape)} and {list(value.shape)}"
        )
    if H < 1 or HQ % H:
        raise ValueError(f"query heads ({HQ}) must be a multiple of the cache's heads ({H})")
    if D > 256 or value.shape[3] > 256:
        raise ValueError(f"head dims up to 256 are supported, got D={D}, Dv={value.shape[3]}")
    if kv_lens is None or kv_lens.dtype != "int32" or tuple(kv_lens.shape) != (B,):
        got = None if kv_lens is None else f"{kv_lens.dtype} {list(kv_lens.shape)}"
        raise ValueError(f"kv_lens must be int32 [{B}] (one length per row), got {got}")
    if block_table is not None:
        if block_table.dtype != "int32" or block_table.ndim != 2 or block_table.shape[0] != B:
            raise ValueError(
                f"block_table must be int32 [{B}, max_blocks], "
                f"got {block_table.dtype} {list(block_table.shape)}"
            )
        if block_table.shape[1] < 1 or key.shape[0] < 1:
            raise ValueError("a paged cache needs at least one page and one block_table column")
    elif key.shape[0] != B:
        raise ValueError(f"a contiguous cache must be [B={B}, S, H, D], got {list(key.shape)}")
    check_sinks(softmax_aux, HQ)
    checks.check_same_device(
        {
            "query": query,
            "key_cache": key,
            "value_cache": value,
            "kv_lens": kv_lens,
            "block_table": block_table,
        }
    )
    scale = checks.check_scale(softmax_scale)
    return _window(sliding_window), _cap(logits_soft_cap), D**-0.5 if scale is None else scale


def step_inputs(query, key_cache, value_cache, kv_lens, block_table=None, softmax_aux=None) -> dict:
    """The arrays of :func:`decode_plans`' launches by the names they read
    (either framework's arrays; run them with core_triton's ``run_steps``)."""
    inputs = {"q": query, "k": key_cache, "v": value_cache, "kv_lens": kv_lens}
    if block_table is not None:
        inputs["block_table"] = block_table
    if softmax_aux is not None:
        inputs["softmax_aux"] = softmax_aux
    return inputs


@functools.lru_cache(maxsize=256)
def decode_plans(
    query: TensorInfo,
    key_cache: TensorInfo,
    value_cache: TensorInfo,
    kv_lens: TensorInfo,
    block_table: TensorInfo | None = None,
    softmax_scale=None,
    sliding_window=None,
    logits_soft_cap=None,
    softmax_aux: TensorInfo | None = None,
) -> tuple[LaunchPlan, ...]:
    """Check ``decode_attention``'s arguments and plan its launches: the
    split kernel (inputs ``q, k, v, kv_lens, block_table, softmax_aux``;
    outputs ``o_part, l_part``), then the combine (inputs ``o_part, l_part,
    softmax_aux``; output ``out``).  When each row and head takes one slice
    (many rows, or a short cache) the split kernel alone makes ``out``
    (then ``l_part``), and there is no combine.  Either way the first output
    of the last launch is the result."""
    window, cap, scale = _check(
        query, key_cache, value_cache, kv_lens, block_table, softmax_scale, sliding_window, logits_soft_cap,
        softmax_aux,
    )  # fmt: skip
    B, Tq, HQ, D = query.shape
    H, DV = key_cache.shape[2], value_cache.shape[3]
    G = HQ // H
    paged = block_table is not None
    page = key_cache.shape[1] if paged else 1
    capacity = block_table.shape[1] * page if paged else key_cache.shape[1]
    num_blocks = key_cache.shape[0]
    BM = max(16, next_power_of_2(G * Tq))
    if interpreter_requested():
        BN, warps, stages = 16, 4, 2
    elif B * H < _TARGET_PROGRAMS:  # the cache is split: long slices per program
        BN, warps, stages = PAGED_SPLIT_CONFIG if paged else SPLIT_CONFIG
    else:
        BN, warps, stages = PAGED_CONFIG if paged else CONFIG
    BD, BDV = max(16, next_power_of_2(D)), max(16, next_power_of_2(DV))
    # Enough slices to fill the GPU without a part-filled last wave (at most
    # _TARGET_PROGRAMS programs), none shorter than a few key blocks.
    splits = max(1, min(_TARGET_PROGRAMS // (B * H), cdiv(max(capacity, 1), 4 * BN)))
    per_split = cdiv(cdiv(max(capacity, 1), splits), BN) * BN
    splits = cdiv(max(capacity, 1), per_split)
    if paged:
        table_stride = block_table.strides[0]
    else:
        table_stride = 0
    left = 0 if window is None else window[0]
    ns = 1 if softmax_aux is None else (softmax_aux.shape[1] if softmax_aux.ndim == 2 else 1)
    sinks = dict(HAS_SINK=softmax_aux is not None, NS=ns, BS=max(2, next_power_of_2(ns)), HQ=HQ)
    final = splits == 1
    if final:
        outputs = (OutputSpec((B, Tq, HQ, DV), query.dtype), OutputSpec((B * H, 1, BM), "float32"))
        names = ("out", "l_part")
    else:
        outputs = (OutputSpec((B * H, splits, BM, DV), "float32"), OutputSpec((B * H, splits, BM), "float32"))
        names = ("o_part", "l_part")
    split = LaunchPlan(
        kernel=decode_split_kernel,
        grid=(B * H, splits),
        params=(
            In("q"), In("k"), In("v"), In("kv_lens"), In("block_table" if paged else "kv_lens"),
            In("kv_lens" if softmax_aux is None else "softmax_aux"),
            B, capacity, per_split, num_blocks, scale, 1.0 if cap is None else cap, left,
            query.strides[0], query.strides[1], query.strides[2],
            key_cache.strides[0], key_cache.strides[1], key_cache.strides[2],
            value_cache.strides[0], value_cache.strides[1], value_cache.strides[2], table_stride,
        ),
        outputs=outputs,
        output_names=names,
        constexprs=dict(
            H=H, G=G, TQ=Tq, D=D, DV=DV, BM=BM, BN=BN, BD=BD, BDV=BDV, PAGED=paged, PAGE=page,
            HAS_CAP=cap is not None, HAS_WINDOW=window is not None,
            # float32 multiplies exactly (no tf32), as flash attention does.
            DOT_PREC="ieee" if query.dtype == "float32" else "tf32",
            DIV16=stride_bits(query, key_cache, value_cache),
            FINAL=final, **sinks,
        ),
        num_warps=warps,
        num_stages=stages,
    )  # fmt: skip
    if final:
        return (split,)
    n = splits
    combine = LaunchPlan(
        kernel=decode_combine_kernel,
        grid=(G * Tq, B * H),
        params=(In("o_part"), In("l_part"), In("l_part" if softmax_aux is None else "softmax_aux"), B, n),
        outputs=(OutputSpec((B, Tq, HQ, DV), query.dtype),),
        output_names=("out",),
        constexprs=dict(H=H, G=G, TQ=Tq, DV=DV, BM=BM, BDV=BDV, SB=_COMBINE_TILE, **sinks),
        num_warps=4,
        num_stages=1,
    )  # fmt: skip
    return split, combine
