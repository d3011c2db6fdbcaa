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
from core_triton.attention import softmax_parts
from core_triton.common.checks import check_bool
from torch_api._launch import device_constant, info, launch
from torch_api._library import Impl, Param, TorchOp, fake_info

# The op's arguments (ring_attention's start with them).
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
_INDEX = ("q_segment_ids", "kv_segment_ids", "q_positions", "kv_positions")


def _plans(a, info_of):
    plans, _ = core.plans(
        *(info_of(a[n]) for n in ("query", "key", "value", "q_segment_ids", "kv_segment_ids")),
        info_of(a["softmax_aux"]),
        info_of(a["bias"]),
        a["sliding_window"],
        a["causal"],
        a["logits_soft_cap"],
        a["softmax_scale"],
        info_of(a["q_positions"]),
        info_of(a["kv_positions"]),
    )
    return plans


def _prepare(a):
    """Plans and launch inputs (index arrays and sinks read with unit stride)."""
    a = {n: (_contiguous(v) if n in (*_INDEX, "softmax_aux") else v) for n, v in a.items()}
    plans = _plans(a, info)
    q = a["query"]
    idx = index_inputs(plans, *(a[n] for n in _INDEX), (q.shape[1], a["key"].shape[1]), q.device)
    inputs = {"q": q, "k": a["key"], "v": a["value"], **idx}
    if a["softmax_aux"] is not None:
        inputs["softmax_aux"] = a["softmax_aux"]
    if a["bias"] is not None:
        inputs["bias"] = a["bias"]
    return plans, inputs


def _forward(a):
    plans, inputs = _prepare(a)
    out, lse = launch(plans.forward, inputs)
    return (out, lse), [], (plans, inputs)


def _backward(a, outputs, extras, cotangents, needs, state):
    plans, inputs = _prepare(a) if state is None else state
    out, lse = outputs
    dout, dlse = cotangents
    dout = torch.zeros_like(out) if dout is None else dout.to(out.dtype)
    (delta,) = launch(plans.preprocess(info(out), info(dout)), {"o": out, "do": dout})
    # An unused lse (the usual case) arrives as None: nothing to subtract.
    if dlse is not None:
        delta = delta - dlse.float()
    dkdv_plan, dq_plan = plans.grads(info(dout))
    inputs = {**inputs, "do": dout, "lse": lse, "delta": delta}
    dk, dv = launch(dkdv_plan, inputs)
    (dq,) = launch(dq_plan, inputs)
    need = dict(zip((p.name for p in PARAMS if p.is_tensor), needs, strict=True))
    sink = a["softmax_aux"]
    dsink = sink_grad(inputs["softmax_aux"], lse, delta).to(sink.dtype) if need["softmax_aux"] else None
    # Bias shape and dtype, reduced over broadcast dims inside the launch;
    # nothing is launched or allocated when the bias needs no gradient.
    db = launch(plans.dbias(info(dout)), inputs)[0] if need["bias"] else None
    grads = {"query": dq, "key": dk, "value": dv, "softmax_aux": dsink, "bias": db}
    return tuple(grads.get(p.name) for p in PARAMS if p.is_tensor)


def _empty(spec, device):
    return torch.empty(spec.shape, dtype=getattr(torch, spec.dtype), device=device)


def _fake_forward(a):
    plans = _plans(a, fake_info)
    device = a["query"].device
    return tuple(_empty(spec, device) for spec in plans.forward.outputs), []


def _fake_backward(a, outputs, extras, cotangents, needs):
    _plans(a, fake_info)
    need = dict(zip((p.name for p in PARAMS if p.is_tensor), needs, strict=True))

    def like(name):
        t = a[name]
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)

    grads = {n: like(n) for n in ("query", "key", "value")}
    for n in ("softmax_aux", "bias"):
        if need[n] and a[n] is not None:
            grads[n] = like(n)
    return tuple(grads.get(p.name) for p in PARAMS if p.is_tensor)


_OP = TorchOp("flash_attention", PARAMS, 2, Impl(_forward, _backward, _fake_forward, _fake_backward))


def sink_grad(sink, lse, delta):
    """The sinks' gradient (core_triton.attention.softmax_parts)."""
    plan = softmax_parts.sink_grad_plan(info(sink), tuple(lse.shape))
    return launch(plan, {"softmax_aux": sink, "lse": lse, "delta": delta.contiguous()})[0]


def index_inputs(plans, q_segment_ids, kv_segment_ids, q_positions, kv_positions, lengths, device):
    """The index inputs of ``plans`` (see jax_api.flash_attention.index_inputs)."""
    idx = {
        "qoff": device_constant(tuple(plans.qoff), torch.int32, torch.device(device)),
        "koff": device_constant(tuple(plans.koff), torch.int32, torch.device(device)),
    }
    for name, value in (
        ("q_segment_ids", q_segment_ids),
        ("kv_segment_ids", kv_segment_ids),
        ("q_positions", q_positions),
        ("kv_positions", kv_positions),
    ):
        if value is not None:
            idx[name] = value.detach().contiguous()
    for name, n in core.missing_positions(*lengths, q_positions, kv_positions).items():
        idx[name] = torch.arange(n, dtype=torch.int32, device=device)
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

    Reference: docs/api.md#flash_attention"""
    return_lse = check_bool(return_lse, "return_lse")
    out, lse = _OP(
        query, key, value, q_segment_ids, kv_segment_ids, softmax_aux, bias, core.window_pair(sliding_window),
        causal, logits_soft_cap, softmax_scale, q_positions, kv_positions,
    )  # fmt: skip
    return (out, lse) if return_lse else out
