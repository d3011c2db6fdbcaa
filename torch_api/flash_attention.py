"""``flash_attention`` for PyTorch (semantics: core_triton.attention.flash);
the op ``twinkernels::flash_attention`` (its plans and launch inputs:
torch_api._flash).

The forward is one launch; the backward runs the dQ launch (which also
makes delta) and the dK/dV launch, and the bias-gradient launch only when
autograd says the bias needs one (a bias with ``requires_grad=False`` costs
no gradient work and no buffer).  Non-contiguous query/key/value/bias are
read through their strides.
"""

from __future__ import annotations

import torch

from core_triton.attention import flash as core
from core_triton.attention import flash_call
from core_triton.common.checks import check_bool
from core_triton.common.launch import run_steps
from torch_api._attention import contiguous_cast, fake_backward, sink_grad
from torch_api._flash import OP_PARAMS, call_plans, grad_plans, prepare
from torch_api._launch import info, launch
from torch_api._library import Impl, TorchOp, fake_info

_TENSORS = tuple(p.name for p in OP_PARAMS if p.is_tensor)


def _forward(a):
    plans, inputs = prepare(a)
    out, lse = run_steps(plans.forward, inputs, launch)
    return (out, lse), [], (plans, inputs)


def _backward(a, outputs, extras, cotangents, needs, state):
    plans, inputs = prepare(a) if state is None else state
    out, lse = outputs
    dout, dlse = cotangents
    dout = torch.zeros_like(out) if dout is None else dout.to(out.dtype)
    need = dict(zip(_TENSORS, needs, strict=True))
    dbias = plans.dbias(info(dout)) if need["bias"] else None
    steps = (*grad_plans(plans, out, dout, dlse is not None), dbias)
    dq, dk, dv, db, delta = flash_call.gradients(launch, contiguous_cast, steps, inputs, out, lse, dout, dlse)
    sink = a["softmax_aux"]
    dsink = sink_grad(inputs["softmax_aux"], lse, delta).to(sink.dtype) if need["softmax_aux"] else None
    grads = {"query": dq, "key": dk, "value": dv, "softmax_aux": dsink, "bias": db}
    return tuple(map(grads.get, _TENSORS))


def _empty(spec, device):
    return torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device=device)


def _fake_forward(a):
    plans, _, _ = call_plans(a, fake_info)
    device = a["query"].device
    return tuple(_empty(spec, device) for spec in plans.forward[-1].outputs), []


def _inference(a):
    """The outputs of a call autograd does not record: the same launches,
    outside ``autograd.Function`` (its bookkeeping and the argument checks
    were over a third of a small no-grad call's host time)."""
    return _forward(a)[0]


_OP = TorchOp(
    "flash_attention",
    OP_PARAMS,
    2,
    Impl(_forward, _backward, _fake_forward, fake_backward(_TENSORS), _inference),
)


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
