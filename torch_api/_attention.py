"""What ``flash_attention`` and ``ring_attention`` share in PyTorch: their
common arguments, the sinks' gradient and the gradients of the fake
backward."""

from __future__ import annotations

import torch

from core_triton.attention import softmax_parts
from torch_api._launch import info, launch
from torch_api._library import Param

# flash_attention's arguments; ring_attention's start with them.
PARAMS = (
    Param("query", "Tensor"),
    Param("key", "Tensor"),
    Param("value", "Tensor"),
    Param("q_segment_ids", "Tensor?"),
    Param("kv_segment_ids", "Tensor?"),
    Param("softmax_aux", "Tensor?"),
    Param("bias", "Tensor?"),
    Param("sliding_window", "int[]?"),
    Param("causal", "bool"),
    Param("logits_soft_cap", "float?"),
    Param("softmax_scale", "float?"),
    Param("q_positions", "Tensor?"),
    Param("kv_positions", "Tensor?"),
)


def contiguous_cast(x, dtype):
    """``x`` in ``dtype``, contiguous: the bindings' ``cast`` for
    core_triton's attention backward, whose dQ kernel reads the lse
    cotangent as a contiguous ``[B, HQ, Tq]`` array (autograd may hand over
    an expanded one)."""
    return x.to(dtype).contiguous()


def sink_grad(sink, lse, delta):
    """The sinks' gradient (core_triton.attention.softmax_parts)."""
    plan = softmax_parts.sink_grad_plan(info(sink), tuple(lse.shape))
    return launch(plan, {"softmax_aux": sink, "lse": lse, "delta": delta.contiguous()})[0]


def fake_backward(tensors: tuple[str, ...]):
    """The :class:`Impl` ``fake_backward`` of an attention op whose tensor
    parameters are ``tensors``: gradients for query, key and value always,
    for the sinks and the bias where given and needed."""
    return lambda a, outputs, extras, cotangents, needs: _fake_grads(a, needs, tensors)


def _fake_grads(a: dict, needs, tensors: tuple[str, ...]) -> tuple:
    need = dict(zip(tensors, needs, strict=True))

    def like(name):
        t = a[name]
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)

    grads = {n: like(n) for n in ("query", "key", "value")}
    for n in ("softmax_aux", "bias"):
        if need[n] and a[n] is not None:
            grads[n] = like(n)
    return tuple(map(grads.get, tensors))
