"""``chunk_linear_attn`` for PyTorch (semantics: core_triton.chunk_linear_attn)."""

from __future__ import annotations

import torch

from core_triton import chunk_linear_attn as core
from core_triton import run_named
from torch_api._launch import host_values, info, launch
from torch_api.utils import prepare_chunk_offsets

_FLOAT_INPUTS = ("query", "key", "value", "g", "g_gamma", "initial_state")


class _ChunkLinearAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plans, index, names, *tensors):
        floats = dict(zip(names, tensors, strict=True))
        env = run_named(plans.forward, {**floats, **index}, launch)
        residuals = [env[n] for n in plans.residuals]
        ctx.save_for_backward(*tensors, *residuals)
        ctx.plans, ctx.index, ctx.names = plans, index, names
        return env["o"], env["final"]

    @staticmethod
    def backward(ctx, do, dht):
        plans, names = ctx.plans, ctx.names
        saved = ctx.saved_tensors
        floats = dict(zip(names, saved[: len(names)], strict=True))
        residuals = dict(zip(plans.residuals, saved[len(names) :], strict=True))
        # Autograd materialises unused cotangents as zeros.
        do = do.to(floats["query"].dtype).contiguous()
        dht = dht.to(torch.float32).contiguous()
        env = run_named(plans.backward, {**floats, **ctx.index, **residuals, "do": do, "dht": dht}, launch)
        grads = dict(plans.grads)
        out = [env[grads[n]].to(floats[n].dtype) if n in grads else None for n in names]
        return (None, None, None, *out)


def chunk_linear_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor | None = None,
    g_gamma: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    reverse: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated linear attention with scalar gates, computed chunk-parallel.

    query ``[B, T, HQ, K]``, key ``[B, T, H, K]``, value ``[B, T, H, V]``,
    g ``[B, T, H]`` and g_gamma ``[H]`` (log decays), initial_state
    ``[N, H, K, V]``.  Returns ``(output [B, T, HQ, V], final_state [N, H,
    K, V] float32)``; differentiable in every float input.  Non-contiguous
    inputs are copied to contiguous ones.
    """
    given = dict(query=query, key=key, value=value, g=g, g_gamma=g_gamma, initial_state=initial_state)
    plans = core.plans(
        info(query),
        info(key),
        info(value),
        info(g),
        info(g_gamma),
        softmax_scale,
        info(initial_state),
        reverse,
        info(cu_seqlens),
        chunk_size,
        host_values(cu_seqlens),
    )
    names = tuple(n for n in _FLOAT_INPUTS if given[n] is not None)
    index = {}
    if cu_seqlens is not None:
        index["cu_seqlens"] = cu_seqlens
        for name, size in plans.offsets:
            index[name] = prepare_chunk_offsets(cu_seqlens, size)
    tensors = [given[n].contiguous() for n in names]
    return _ChunkLinearAttn.apply(plans, index, names, *tensors)
