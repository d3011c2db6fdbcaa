"""Float64 reference of ``gated_delta_rule`` with gradients: the plain loop
of core_triton/delta_rule/naive.py run on float64 torch tensors, so that
autograd gives the reference gradients of the same loop (no hand-derived
backward)."""

from __future__ import annotations

import numpy as np

from core_triton.delta_rule import naive


def delta_rule_ref(inputs: dict, softmax_scale=None, cu_seqlens=None, use_qk_l2norm=False, cotangents=None):
    """``(output, final_state, grads)`` in float64 numpy.

    inputs: numpy arrays by argument name (query, key, value, beta and any of
    g, gk, initial_state).  ``grads`` (by name, every input) are those of
    ``sum(output * d_output) + sum(final_state * d_final_state)`` for
    ``cotangents = (d_output, d_final_state)``, else None."""
    import torch

    want = cotangents is not None
    ts = {n: torch.tensor(np.asarray(a, np.float64), requires_grad=want) for n, a in inputs.items()}
    out, final = naive.gated_delta_rule(
        ts["query"],
        ts["key"],
        ts["value"],
        ts["beta"],
        g=ts.get("g"),
        gk=ts.get("gk"),
        softmax_scale=softmax_scale,
        initial_state=ts.get("initial_state"),
        cu_seqlens=cu_seqlens,
        use_qk_l2norm=use_qk_l2norm,
        xp=torch,
    )
    grads = None
    if want:
        d_out, d_final = (torch.tensor(np.asarray(c, np.float64)) for c in cotangents)
        loss = (out * d_out).sum() + (final * d_final).sum()
        names = list(ts)
        gs = torch.autograd.grad(loss, [ts[n] for n in names], allow_unused=True)
        grads = {n: np.zeros(ts[n].shape) if g is None else g.numpy() for n, g in zip(names, gs, strict=True)}
    return out.detach().numpy(), final.detach().numpy(), grads
