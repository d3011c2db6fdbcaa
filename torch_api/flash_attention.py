"""``flash_attention`` for PyTorch (semantics: core_triton.attention.flash);
the op ``twinkernels::flash_attention``.

The forward is one launch; the backward runs the preprocess, dK/dV and dQ
launches, and the bias-gradient launch only when autograd says the bias
needs one (a bias with ``requires_grad=False`` costs no gradient work and
no buffer).  Non-contiguous query/key/value/bias are read through their
strides.
"""

from __future__ import annotations

import torch

from core_triton.attention import flash as core
from core_triton.attention import flash_call
from core_triton.common.checks import check_bool
from core_triton.common.launch import run_named
from torch_api._attention import INDEX, PARAMS, fake_backward, sink_grad
from torch_api._launch import device_constant, info, launch
from torch_api._library import Impl, Param, TorchOp, fake_info

# The op's own arguments: packed input's boundaries after the shared ones.
_OP_PARAMS = (*PARAMS, Param("cu_seqlens", "Tensor?"), Param("cu_seqlens_k", "Tensor?"))


def _plans(a, info_of):
    """``(plans, index, launches)``: the attention's plans, the infos of the
    index arrays it reads and the launches that make them (flash_call)."""
    plans, _, index, launches = flash_call.call_plans(
        info_of(a["query"]), info_of(a["key"]), info_of(a["value"]), info_of(a["cu_seqlens"]),
        info_of(a["cu_seqlens_k"]), {n: info_of(a[n]) for n in INDEX}, info_of(a["softmax_aux"]),
        info_of(a["bias"]), a["sliding_window"], a["causal"], a["logits_soft_cap"], a["softmax_scale"],
    )  # fmt: skip
    return plans, index, launches


_NAMES = tuple(p.name for p in _OP_PARAMS)
_TENSORS = tuple(p.name for p in _OP_PARAMS if p.is_tensor)
# Eager calls repeat the same shapes: each distinct call signature's plans
# and constant index inputs are kept (a call's host time is most of the
# work at small sizes; see torch_api._launch's fast path).
_MEMO_LIMIT = 256
_memo: dict = {}


def _signature(a):
    """What the plans depend on: each tensor's layout, every option, and
    core's plan generation (a test may switch the kernels core plans)."""
    return core.GENERATION, *(
        (v.shape, v.stride(), v.dtype, v.device) if isinstance(v, torch.Tensor) else v
        for v in map(a.get, _NAMES)
    )


def _prepare(a):
    """Plans and launch inputs (index arrays and sinks read with unit stride;
    packed input's segment ids and positions made from its boundaries,
    segment ids' ranges from the ids)."""
    try:
        key = _signature(a)
        plans, constants, ids = _memo[key]
    except TypeError:  # an unhashable option (a list under the custom op): plan it
        plans, constants, ids = _plan_call(a)
    except KeyError:
        plans, constants, ids = _memo[key] = _plan_call(a)
        if len(_memo) > _MEMO_LIMIT:
            _memo.clear()
    inputs = {"q": a["query"], "k": a["key"], "v": a["value"], **constants}
    for name in INDEX:
        if a[name] is not None:
            inputs[name] = a[name].detach().contiguous()
    if ids:
        # Packed input's index arrays from its boundaries, or segment ids'
        # ranges from the ids (core_triton.attention.packed.prepare).
        sources = dict(inputs)
        if a["cu_seqlens"] is not None:
            sources["cu_q"] = a["cu_seqlens"].detach()
            sources["cu_k"] = sources["cu_q"] if a["cu_seqlens_k"] is None else a["cu_seqlens_k"].detach()
        made = run_named(ids, sources, launch)
        inputs.update((n, made[n]) for plan in ids for n in plan.output_names)
    if a["softmax_aux"] is not None:
        inputs["softmax_aux"] = a["softmax_aux"].contiguous()
    if a["bias"] is not None:
        inputs["bias"] = a["bias"]
    return plans, inputs


def _plan_call(a):
    """A call's plans, its constant index inputs (piece offsets, the
    positions a call leaves out) and the launches that make its index
    arrays (packed input, segment ids; else none)."""
    # Planned as launched: index arrays and sinks with unit stride.
    a = {n: (_contiguous(v) if n in (*INDEX, "softmax_aux") else v) for n, v in a.items()}
    plans, index, ids = _plans(a, info)
    q = a["query"]
    has = (index["q_positions"] is not None, index["kv_positions"] is not None)
    return plans, constant_inputs(plans, *has, (q.shape[1], a["key"].shape[1]), q.device), ids


def _forward(a):
    plans, inputs = _prepare(a)
    out, lse = launch(plans.forward, inputs)
    return (out, lse), [], (plans, inputs)


_grad_memo: dict = {}


def _grad_plans(plans, out, dout):
    """The backward's plans (preprocess, dK/dV, dQ) for a cotangent's layout."""
    key = (id(plans), dout.shape, dout.stride(), dout.dtype, out.stride())
    found = _grad_memo.get(key)
    if found is None or found[0] is not plans:
        found = (plans, plans.preprocess(info(out), info(dout)), *plans.grads(info(dout)))
        if len(_grad_memo) >= _MEMO_LIMIT:
            _grad_memo.clear()
        _grad_memo[key] = found
    return found[1:]


def _backward(a, outputs, extras, cotangents, needs, state):
    plans, inputs = _prepare(a) if state is None else state
    out, lse = outputs
    dout, dlse = cotangents
    dout = torch.zeros_like(out) if dout is None else dout.to(out.dtype)
    need = dict(zip(_TENSORS, needs, strict=True))
    steps = (*_grad_plans(plans, out, dout), plans.dbias(info(dout)) if need["bias"] else None)
    dq, dk, dv, db, delta = flash_call.gradients(launch, _cast, steps, inputs, out, lse, dout, dlse)
    sink = a["softmax_aux"]
    dsink = sink_grad(inputs["softmax_aux"], lse, delta).to(sink.dtype) if need["softmax_aux"] else None
    grads = {"query": dq, "key": dk, "value": dv, "softmax_aux": dsink, "bias": db}
    return tuple(map(grads.get, _TENSORS))


def _cast(x, dtype):
    return x.to(dtype)


def _empty(spec, device):
    return torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device=device)


def _fake_forward(a):
    plans, _, _ = _plans(a, fake_info)
    device = a["query"].device
    return tuple(_empty(spec, device) for spec in plans.forward.outputs), []


_OP = TorchOp(
    "flash_attention", _OP_PARAMS, 2, Impl(_forward, _backward, _fake_forward, fake_backward(_TENSORS))
)


def constant_inputs(plans, has_q_positions, has_kv_positions, lengths, device):
    """The index inputs that do not come from the call: the pieces' offsets
    and ``arange`` positions for the side that gives none when the other does."""
    device = torch.device(device)
    idx = {
        "qoff": device_constant(tuple(plans.qoff), torch.int32, device),
        "koff": device_constant(tuple(plans.koff), torch.int32, device),
    }
    given = (True if has_q_positions else None, True if has_kv_positions else None)
    for name, n in core.missing_positions(*lengths, *given).items():
        idx[name] = device_constant(tuple(range(n)), torch.int32, device)
    return idx


def _contiguous(t):
    return None if t is None else t.contiguous()


def flash_attention(
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
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
):
    """Softmax attention.  query ``[B, Tq, HQ, D]``, key ``[B, Tk, H, D]``, value
    ``[B, Tk, H, Dv]`` (one float dtype; ``HQ % H == 0``; D, Dv <= 256) ->
    output ``[B, Tq, HQ, Dv]`` (and ``lse [B, HQ, Tq]`` float32 with
    ``return_lse``).

    Optional, all None/False by default: segment ids int32/int64 ``[B, T]``,
    sinks ``softmax_aux [HQ]`` or ``[HQ, S]``, ``bias [B|1, HQ|1, Tq, Tk]``,
    ``sliding_window`` ``w`` or ``(left, right)``, ``causal``,
    ``logits_soft_cap``, ``softmax_scale`` (default ``D ** -0.5``), positions
    int32/int64 ``[B, T]`` or ``[T]``.  Differentiable in query, key, value,
    softmax_aux and bias; the bias's gradient has its shape and dtype and is
    computed only when ``bias.requires_grad``.

    Packed input: ``cu_seqlens`` int32/int64 ``[N+1]`` (batch 1) gives the
    sequences' boundaries for queries and keys, or for the queries only when
    ``cu_seqlens_k`` gives the keys' own; within a sequence query ``t`` has
    position ``len_k - len_q + t`` and key ``s`` position ``s`` (a causal
    mask aligned at the end), every other option applies per sequence, and a
    token no sequence covers gets output 0.  Not combined with segment ids
    or positions.

    Reference: docs/api.md#flash_attention"""
    return_lse = check_bool(return_lse, "return_lse")
    out, lse = _OP(
        query, key, value, q_segment_ids, kv_segment_ids, softmax_aux, bias, core.window_pair(sliding_window),
        causal, logits_soft_cap, softmax_scale, q_positions, kv_positions, cu_seqlens, cu_seqlens_k,
    )  # fmt: skip
    return (out, lse) if return_lse else out
