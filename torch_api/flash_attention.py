"""``flash_attention`` for PyTorch (semantics: core_triton.attention.flash).

One ``torch.autograd.Function`` over the forward launch; the backward runs
the preprocess, dK/dV and dQ launches, and the bias-gradient launch only
when ``ctx.needs_input_grad`` says the bias needs one (a bias with
``requires_grad=False`` costs no gradient work and no buffer).
Non-contiguous query/key/value/bias are read through their strides.
"""

from __future__ import annotations

import torch

from core_triton.attention import flash as core
from core_triton.attention import softmax_parts
from torch_api._launch import device_constant, info, launch


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, bias, index, plans):
        inputs = {"q": q, "k": k, "v": v, **index}
        if sink is not None:
            inputs["softmax_aux"] = sink
        if bias is not None:
            inputs["bias"] = bias
        out, lse = launch(plans.forward, inputs)
        # An unused lse (the usual case) then arrives as None, not as zeros
        # that the backward would fill and subtract for nothing.
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, sink, bias, out, lse)
        ctx.index = index
        ctx.plans = plans
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, sink, bias, out, lse = ctx.saved_tensors
        plans = ctx.plans
        if dout is None:
            dout = torch.zeros_like(out)
        dout = dout.to(out.dtype)
        (delta,) = launch(plans.preprocess(info(out), info(dout)), {"o": out, "do": dout})
        if dlse is not None:
            delta = delta - dlse.float()
        dkdv_plan, dq_plan = plans.grads(info(dout))
        inputs = {"q": q, "k": k, "v": v, "do": dout, "lse": lse, "delta": delta, **ctx.index}
        if bias is not None:
            inputs["bias"] = bias
        dk, dv = launch(dkdv_plan, inputs)
        (dq,) = launch(dq_plan, inputs)
        dsink = sink_grad(sink, lse, delta) if ctx.needs_input_grad[3] else None
        # Bias shape and dtype, reduced over broadcast dims inside the launch.
        db = launch(plans.dbias(info(dout)), inputs)[0] if ctx.needs_input_grad[4] else None
        return dq, dk, dv, dsink, db, None, None


def sink_grad(sink, lse, delta):
    """The sinks' gradient (core_triton.attention.softmax_parts)."""
    plan = softmax_parts.sink_grad_plan(info(sink), tuple(lse.shape))
    return launch(plan, {"softmax_aux": sink, "lse": lse, "delta": delta.contiguous()})[0]


def attention_call(plans, query, key, value, softmax_aux, bias, index):
    """Run ``plans`` as a differentiable op; returns ``(out, lse)``."""
    return _Attention.apply(query, key, value, softmax_aux, bias, index, plans)


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
    """Softmax attention.  query ``[B, Tq, HQ, D]``, key ``[B, Tk, H, D]``,
    value ``[B, Tk, H, Dv]`` -> output ``[B, Tq, HQ, Dv]`` (and ``lse [B, HQ,
    Tq]`` float32 with ``return_lse``).  See the spec for every option.
    ``bias [B|1, HQ|1, Tq, Tk]``: its gradient has its shape and dtype, and
    is computed only when it requires one (``bias.requires_grad``)."""
    # Index arrays and sinks are small: the kernels read them with unit stride.
    q_segment_ids, kv_segment_ids = _contiguous(q_segment_ids), _contiguous(kv_segment_ids)
    q_positions, kv_positions = _contiguous(q_positions), _contiguous(kv_positions)
    softmax_aux = _contiguous(softmax_aux)
    plans, return_lse = core.plans(
        info(query),
        info(key),
        info(value),
        info(q_segment_ids),
        info(kv_segment_ids),
        info(softmax_aux),
        info(bias),
        sliding_window,
        causal,
        logits_soft_cap,
        softmax_scale,
        info(q_positions),
        info(kv_positions),
        return_lse,
    )
    idx = index_inputs(
        plans,
        q_segment_ids,
        kv_segment_ids,
        q_positions,
        kv_positions,
        (query.shape[1], key.shape[1]),
        query.device,
    )
    out, lse = attention_call(plans, query, key, value, softmax_aux, bias, idx)
    return (out, lse) if return_lse else out
