"""``ring_attention`` for PyTorch: flash attention over a sequence sharded
across the ranks of a ``torch.distributed`` group (algorithm:
core_triton.attention.ring; the walk: core_triton.attention.ring_walk);
the op ``twinkernels::ring_attention`` (the group travels by name).
Point-to-point ``isend``/``irecv`` move the key/value shards (and in the
backward their float32 dK/dV accumulators) to the next rank while the
current step's kernels run (torch_api._ring); partial results merge in
float32 by log-sum-exp.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from core_triton.attention import ring as core
from core_triton.attention import ring_walk
from core_triton.attention.flash import AttentionCall, window_pair
from core_triton.attention.flash_options import INDEX
from core_triton.common.checks import check_bool
from core_triton.common.launch import run_named
from torch_api._attention import PARAMS, fake_backward, sink_grad
from torch_api._launch import info, launch
from torch_api._library import Impl, Param, TorchOp, fake_info
from torch_api._ring import Ring, group

# flash_attention's arguments, then the ring's own.
_PARAMS = (*PARAMS, Param("zigzag", "bool"), Param("group_name", "str?"), Param("cu_seqlens", "Tensor?"))
_TENSORS = tuple(p.name for p in _PARAMS if p.is_tensor)


def _plans(a, info_of, n):
    """``(plans, schedule, launches)`` of a call (core.call_plans)."""
    call = AttentionCall.of(a, lambda t, _: info_of(t))
    plans, _, schedule, launches = core.call_plans(call, n, a["zigzag"])
    return plans, schedule, launches


def _prepare(a):
    """Plans, ring, schedule, the queries' index inputs and the key/value
    shard with the index inputs that travel with it."""
    query = a["query"]
    # The ring's launches go through this module's launch (tests watch it).
    ring = Ring(group(a["group_name"]), query.device, lambda plan, inputs: launch(plan, inputs))
    a = {n: (v.detach().contiguous() if n in INDEX and v is not None else v) for n, v in a.items()}
    if a["softmax_aux"] is not None:
        a["softmax_aux"] = a["softmax_aux"].contiguous()
    plans, schedule, launches = _plans(a, info, ring.n)
    mine = lambda: ring.mine(query.shape[1], a["zigzag"])  # noqa: E731
    if launches:
        # Packed input: the global segment ids, then this rank's tokens.
        cu = a["cu_seqlens"].detach()
        made = run_named(launches, {"cu_q": cu, "cu_k": cu}, launch)
        for name in ("q_segment_ids", "kv_segment_ids"):
            a[name] = made[name].index_select(1, mine())
    fixed, moving = ring_walk.split_index(*(a[x] for x in INDEX), mine)
    return a, plans, ring, schedule, fixed, {"k": a["key"], "v": a["value"], **moving}


def _forward(a):
    prepared = _prepare(a)
    a, plans, ring, schedule, fixed, kv = prepared
    out, lse = ring_walk.forward(ring, plans, schedule, a["query"], kv, fixed, a["softmax_aux"], a["bias"])
    # The float32 output is a residual of the backward (its delta); a custom
    # op may not return one tensor twice, so only when the cast copies.
    final = out.to(a["query"].dtype)
    # The eager backward reuses the checks, plans and index arrays.
    return (final, lse), ([] if final is out else [out]), prepared


def _backward(a, outputs, extras, cotangents, needs, state):
    a, plans, ring, schedule, fixed, kv = _prepare(a) if state is None else state
    q, v, sink = a["query"], a["value"], a["softmax_aux"]
    final, lse = outputs
    out = extras[0] if extras else final
    dout, dlse = cotangents
    shape = (*q.shape[:3], v.shape[3])
    dout = (torch.zeros(shape, dtype=q.dtype, device=q.device) if dout is None else dout).to(q.dtype)
    need = dict(zip(_TENSORS, needs, strict=True))
    dq, dk, dv, db, delta = ring_walk.backward(
        ring, plans, schedule, q, kv, fixed, a["bias"], out, lse, dout, dlse, need["bias"]
    )
    dsink = sink_grad(sink, lse, delta).to(sink.dtype) if need["softmax_aux"] else None
    grads = {"query": dq, "key": dk, "value": dv, "softmax_aux": dsink, "bias": db}
    return tuple(grads.get(n) for n in _TENSORS)


def _fake_forward(a):
    _plans(a, fake_info, dist.get_world_size(group(a["group_name"])))  # the checks
    q, v = a["query"], a["value"]
    B, T, HQ, _ = q.shape
    out = torch.empty(B, T, HQ, v.shape[3], dtype=q.dtype, device=q.device)
    lse = torch.empty(B, HQ, T, dtype=torch.float32, device=q.device)
    return (out, lse), ([] if q.dtype == torch.float32 else [torch.empty_like(out, dtype=torch.float32)])


_OP = TorchOp("ring_attention", _PARAMS, 2, Impl(_forward, _backward, _fake_forward, fake_backward(_TENSORS)))


def ring_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    softmax_aux: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    sliding_window: int | tuple[int, int] | None = None,
    causal: bool = False,
    logits_soft_cap: float | None = None,
    softmax_scale: float | None = None,
    q_positions: torch.Tensor | None = None,
    kv_positions: torch.Tensor | None = None,
    return_lse: bool = False,
    zigzag: bool = False,
    axis_name=None,
    group=None,
    cu_seqlens: torch.Tensor | None = None,
):
    """``flash_attention`` over a sequence sharded across devices, called on
    every rank of ``group`` (None: the default ``torch.distributed`` group)
    with the local shards: ``query [B, T_local, HQ, D]``, ``key/value [B,
    T_local, H, D(v)]``, segment ids and positions ``[B, T_local]``, ``bias
    [B|1, HQ|1, T_local, n*T_local]`` (global key order).  Same options and
    defaults as ``flash_attention``; explicit positions are global. ``zigzag``
    (default False): the shards are in the zig-zag layout
    (``zigzag_reorder``). ``cu_seqlens`` (packed input, batch 1): int32/int64
    ``[N+1]`` boundaries of sequences in the global token order (before any
    zig-zag reordering), the same array on every device, shared by queries
    and keys; masks apply per sequence, tokens outside every sequence get
    output 0; not with segment ids or positions. ``axis_name`` is the JAX binding's and must be None
    here.  Returns the local output ``[B, T_local, HQ, Dv]`` (and ``lse [B,
    HQ, T_local]`` float32 with ``return_lse``).

    Reference: docs/api.md#ring_attention"""
    if axis_name is not None:
        raise ValueError("axis_name is for the JAX binding; PyTorch takes group (None: the default group)")
    if not dist.is_initialized():
        raise ValueError("ring_attention needs an initialised torch.distributed process group")
    return_lse = check_bool(return_lse, "return_lse")
    out, lse = _OP(
        query, key, value, q_segment_ids, kv_segment_ids, softmax_aux, bias, window_pair(sliding_window),
        causal, logits_soft_cap, softmax_scale, q_positions, kv_positions, check_bool(zigzag, "zigzag"),
        None if group is None else group.group_name, cu_seqlens,
    )  # fmt: skip
    return (out, lse) if return_lse else out
