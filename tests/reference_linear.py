"""Float64 reference of the linear attention ops with gradients: the loop
of core_triton/linear_attn/naive.py run on float64 torch tensors, so that
autograd gives the reference gradients of the same plain loop."""

from __future__ import annotations

import numpy as np

from core_triton.linear_attn import naive

GRAD_NAMES = ("query", "key", "value", "g", "g_gamma", "gk", "gv", "initial_state")


def linear_attention_ref(
    inputs: dict,
    softmax_scale=None,
    reverse=False,
    cu_seqlens=None,
    d_output=None,
    d_final_state=None,
):
    """The recurrence of docs/api.md#recurrent in float64.

    inputs: numpy arrays by argument name (query, key, value and any of g,
    g_gamma, gk, gv, initial_state).  Returns (output, final_state, grads):
    grads (by name, for every float input given) are those of
    ``sum(output * d_output) + sum(final_state * d_final_state)`` when either
    cotangent is given, else None.
    """
    import torch

    want_grad = d_output is not None or d_final_state is not None
    ts = {
        n: torch.tensor(np.asarray(a, np.float64), requires_grad=want_grad)
        for n, a in inputs.items()
        if a is not None
    }
    out, final = naive.linear_attention_loop(
        torch,
        ts["query"],
        ts["key"],
        ts["value"],
        ts.get("g"),
        ts.get("g_gamma"),
        ts.get("gk"),
        ts.get("gv"),
        softmax_scale,
        ts.get("initial_state"),
        reverse,
        cu_seqlens,
    )
    grads = None
    if want_grad:
        loss = 0.0
        if d_output is not None:
            loss = loss + (out * torch.tensor(np.asarray(d_output, np.float64))).sum()
        if d_final_state is not None:
            loss = loss + (final * torch.tensor(np.asarray(d_final_state, np.float64))).sum()
        names = list(ts)
        gs = torch.autograd.grad(loss, [ts[n] for n in names], allow_unused=True)
        grads = {
            n: (np.zeros(ts[n].shape) if gr is None else gr.numpy()) for n, gr in zip(names, gs, strict=True)
        }
    return out.detach().numpy(), final.detach().numpy(), grads
