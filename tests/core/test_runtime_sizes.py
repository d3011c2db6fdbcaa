"""No compile-time constant follows a size that changes between calls.

Packed training changes the sequence length and the number of packed
sequences every step (and batched training its length now and then).  A
block size, a loop count or a specialised int that followed them would
compile a new kernel each time (500 packed documents once compiled for more
than 14 minutes).  Here every op's plans are built for three different
lengths and numbers of sequences, and each launch must be the same kernel
specialisation: the same constexprs, warps and stages, and the same value
for every int argument that the kernel does not list as a run-time size
(``core_triton.common.runtime.jit``).  Only grids and run-time sizes may differ.
Flash attention is checked for its lengths only (``Tq``, ``Tk`` and the
piece lengths are run-time sizes): its stride arguments, some of which
follow the lengths, are still specialised by PyTorch's launcher on
divisibility by 16 (at most two variants each, none when heads x head dim
is a multiple of 16), and on the GPU its head dims 65-128 take one of two
measured tile configs by key length.
The GPU tests (tests/*/test_compile_once.py) count real compilations."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from core_triton.attention import flash as flash_attention
from core_triton.attention import flash_tma_plans
from core_triton.common.launch import In, LaunchPlan, TensorInfo
from core_triton.common.utils import contiguous_strides
from core_triton.cumsum import chunk_global as chunk_global_cumsum
from core_triton.cumsum import chunk_local as chunk_local_cumsum
from core_triton.linear_attn import chunk as chunk_linear_attn
from core_triton.linear_attn import recurrent

# (seq_len, number of packed sequences) with every divisibility by 16 mixed,
# and a length of 1 (no stride fact may hold at length 1 only).  No count of
# sequences is 1: jax-triton makes an int equal to 1 a constant (a JAX-only
# second variant for a call with one packed sequence).
# (20000, 3): few sequences, many chunks, where the chunk state passes
# split over the sequence (state_split.py).
SIZES = [(100, 3), (4096, 64), (6001, 2000), (1, 2), (20000, 3)]
H, K, V = 4, 64, 48


def _info(shape, dtype="bfloat16"):
    return TensorInfo(tuple(shape), dtype, contiguous_strides(shape))


def _signature(plan: LaunchPlan):
    kernel = plan.kernel
    while not hasattr(kernel, "runtime_sizes") and hasattr(kernel, "fn"):
        kernel = kernel.fn  # an autotuner around the kernel
    names = kernel.arg_names
    sizes = set(getattr(kernel, "runtime_sizes", ()))
    fixed = tuple(
        (names[i], p)
        for i, p in enumerate(plan.params)
        if not isinstance(p, In) and names[i] not in sizes and not isinstance(p, float)
    )
    return (
        kernel.fn.__name__,
        fixed,
        tuple(sorted(plan.constexprs.items())),
        plan.num_warps,
        plan.num_stages,
        tuple(o.dtype for o in plan.outputs),
    )


def _launches(op: str, T: int, N: int, packed: bool) -> list[LaunchPlan]:
    B = 1 if packed else N
    cu = _info((N + 1,), "int32") if packed else None
    q, k, v = _info((B, T, 2 * H, K)), _info((B, T, H, K)), _info((B, T, H, V))
    g, gamma, h0 = _info((B, T, H)), _info((H,), "float32"), _info((N, H, K, V), "float32")
    if op == "recurrent":
        gk, gv = _info((B, T, H, K)), _info((B, T, H, V))
        p = recurrent.plans(q, k, v, g, gamma, gk, gv, None, h0, False, cu)
        return [*p.forward, *p.backward]
    if op == "recurrent_g_gamma":
        p = recurrent.plans(q, k, v, None, gamma, None, None, None, h0, True, cu)
        return [*p.forward, *p.backward]
    if op == "chunk":
        p = chunk_linear_attn.plans(q, k, v, g, gamma, None, h0, False, cu, 64)
        return [*p.forward, *p.backward]
    if op == "chunk_reverse":
        p = chunk_linear_attn.plans(q, k, v, g, None, None, None, True, cu, 128)
        return [*p.forward, *p.backward]
    if op == "flash":
        causal = N % 2 == 0
        kv = _info((B, T + 7, H, K))
        bias = _info((1, 2 * H, T, T + 7))
        p, _ = flash_attention.plans(q, kv, kv, bias=bias, causal=causal, softmax_aux=_info((2 * H,)))
        grads = (s for dlse in (False, True) for g in p.grads(q, q, dlse) for s in g)
        return [*p.forward, *grads, p.dbias(q)]
    head_first = op.endswith("_head_first")
    # Scalar gates too: their per-token size of 1 makes the batch (and a
    # head-first layout's head) stride 1 at length 1 only.
    x = _info((B, H, T, 32) if head_first else (B, T, 1), "float32")
    if op.startswith("local_cumsum"):
        p = chunk_local_cumsum.plans(x, 64, cu_seqlens=cu, head_first=head_first)
    else:
        p = chunk_global_cumsum.plans(x, reverse=True, cu_seqlens=cu, head_first=head_first)
    return [*p.forward, *p.backward(x)]


OPS = [
    "recurrent",
    "recurrent_g_gamma",
    "chunk",
    "chunk_reverse",
    "local_cumsum",
    "global_cumsum",
    "local_cumsum_head_first",
    "global_cumsum_head_first",
]


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "batched"])
@pytest.mark.parametrize("op", OPS)
def test_one_specialisation_for_every_size(op, packed):
    # Per kernel: a size may choose other kernels (the chunk state passes
    # split over the sequence at batch 1 and long sequences), but a kernel
    # it launches has one specialisation whatever the size.
    # it launches has one specialisation whatever the size (per launch of
    # it: one call may launch a kernel twice, specialised two ways).
    seen: dict[tuple[str, int], set] = {}
    for T, N in SIZES:
        count: dict[str, int] = {}
        for sig in map(_signature, _launches(op, T, N, packed)):
            nth = count[sig[0]] = count.get(sig[0], -1) + 1
            seen.setdefault((sig[0], nth), set()).add(repr(sig))
    for (kernel, nth), sigs in seen.items():
        assert len(sigs) == 1, f"{op}: {kernel} (launch {nth}) specialises differently: {sorted(sigs)}"
    if op.startswith("chunk") and packed:
        assert ("state_split_carry_kernel", 0) in seen, "no size exercised the split state passes"


def test_flash_lengths_are_run_time_sizes():
    for p in _launches("flash", 100, 2, False):
        kernel = p.kernel
        while not hasattr(kernel, "runtime_sizes") and hasattr(kernel, "fn"):
            kernel = kernel.fn
        if kernel.fn.__name__ == "flash_bwd_split_sum_kernel":  # dK/dV's split partials' sum
            assert {"n_k", "n_v", "splits"} <= set(kernel.runtime_sizes)
            continue
        assert {"Tq"} <= set(kernel.runtime_sizes), kernel.fn.__name__
        if "Tk" in kernel.arg_names:
            assert {"Tk", "q_chunk", "k_chunk"} <= set(kernel.runtime_sizes), kernel.fn.__name__


def test_a_size_left_as_a_constant_is_caught():
    # The check itself: a plan whose constexpr follows T must fail it.
    a, b = (_launches("chunk", T, 3, True)[1] for T in (100, 200))
    bad = LaunchPlan(a.kernel, a.grid, a.params, a.outputs, {**a.constexprs, "BT": 100})
    assert _signature(a) == _signature(b) and _signature(bad) != _signature(a)
    # And an int argument (T here) that the kernel does not declare a size.
    undeclared = SimpleNamespace(arg_names=a.kernel.arg_names, fn=a.kernel.fn, runtime_sizes=("NT", "NS"))
    a, b = (dataclasses.replace(p, kernel=undeclared) for p in (a, b))
    assert _signature(a) != _signature(b)


def test_fixed_order_sums_pass_no_size_equal_to_one():
    # jax-triton makes an int argument equal to 1 a constant (another
    # compiled variant): the two passes of head_sum never pass one, whatever
    # the number of rows (sequences times value tiles for d_g_gamma).
    from core_triton.common.reductions import head_sum_plans

    for rows in (2, 3, 5, 64, 257, 6000, 10**6):
        first, second = head_sum_plans("x", rows, 3, "float32", "out", interpreted=False)
        for p in (first, second):
            assert all(v >= 2 for v in p.params[1:]), (rows, p.params)
        assert first.grid[1] >= 2 and second.grid[1] == 1


def test_ws_forward_has_one_specialisation_for_every_size():
    # The warp-specialised forward (forced on; head dim 128, bf16): batch
    # and lengths are run-time sizes (the descriptors take them as values),
    # so a new length or batch reuses the kernel.  Several batches take it
    # only with whole key blocks (flash_fwd_ws), so the keys here have them.
    before = flash_tma_plans.WS_FORWARD
    flash_attention.set_ws_forward("on")
    try:
        seen = []
        for T, N in SIZES:
            Tk = T if N == 1 else -(-T // 128) * 128  # the GPU's key blocks (128) and the interpreter's
            q, kv = _info((N, T, 2 * H, 128), "bfloat16"), _info((N, Tk, H, 128), "bfloat16")
            p, _ = flash_attention.plans(q, kv, kv, causal=True)
            assert p.forward[0].kernel is flash_tma_plans.flash_fwd_ws_kernel, (T, N)
            seen.append(_signature(p.forward[0]))
        assert all(s == seen[0] for s in seen), seen
    finally:
        flash_attention.set_ws_forward(before)
