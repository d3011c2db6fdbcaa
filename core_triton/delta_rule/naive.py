"""Float64 reference of the gated delta rule, written as the plain loop over
time of docs/api.md#gated_delta_rule.  No framework: the arrays may be numpy
arrays or float64 torch tensors (``xp=torch``: the tests differentiate it
with autograd, so no hand-derived backward stands in the reference).

For each sequence and value head ``h`` (key head ``h // (HV // HK)``), with
the state ``S`` (``K x V``) starting at ``initial_state`` or zeros, at token
``t``::

    S = exp(g[t]) * S                  (g,  [B, T, HV])
    S = exp(gk[t])[:, None] * S        (gk, [B, T, HV, K])
    u = beta[t] * (v[t] - S^T k[t])
    S = S + outer(k[t], u)
    o[t] = scale * S^T q[t]

``use_qk_l2norm`` first divides q and k by ``sqrt(sum(x**2) + 1e-6)`` over
K (the normalisation of flash-linear-attention and transformers).
"""

from __future__ import annotations

import numpy as np

from core_triton.common.naive_vjp import vjp_ref

L2NORM_EPS = 1e-6


def l2norm(x, xp=np):
    """``x / sqrt(sum(x**2, -1) + 1e-6)``."""
    return x / xp.sqrt((x * x).sum(-1) + L2NORM_EPS)[..., None]


def sequences(batch: int, seq_len: int, cu_seqlens):
    """(batch row, state index, start, end) of every sequence."""
    if cu_seqlens is None:
        return [(b, b, 0, seq_len) for b in range(batch)]
    cu = [int(c) for c in cu_seqlens]
    return [(0, i, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def gated_delta_rule(
    query,
    key,
    value,
    beta,
    g=None,
    gk=None,
    softmax_scale=None,
    initial_state=None,
    cu_seqlens=None,
    use_qk_l2norm=False,
    xp=np,
):
    """``(output [B, T, HV, V], final_state [N, HV, K, V])`` in float64.

    query, key ``[B, T, HK, K]``; value ``[B, T, HV, V]``; beta ``[B, T,
    HV]``; g ``[B, T, HV]`` or gk ``[B, T, HV, K]`` log decays (or
    neither); initial_state ``[N, HV, K, V]``; cu_seqlens a list of ``N+1``
    boundaries (packed input, ``B == 1``).  ``xp``: numpy, or torch for
    float64 tensors."""
    B, T, HK, K = query.shape
    HV, V = value.shape[2], value.shape[3]
    heads = [h // (HV // HK) for h in range(HV)]
    scale = K**-0.5 if softmax_scale is None else softmax_scale
    if use_qk_l2norm:
        query, key = l2norm(query, xp), l2norm(key, xp)
    rows = [[None] * T for _ in range(B)]
    finals = []
    for b, n, bos, eos in sequences(B, T, cu_seqlens):
        S = xp.zeros((HV, K, V), dtype=xp.float64) if initial_state is None else initial_state[n] * 1.0
        for t in range(bos, eos):
            q, k = query[b, t][heads], key[b, t][heads]  # [HV, K]
            if g is not None:
                S = S * xp.exp(g[b, t])[:, None, None]
            if gk is not None:
                S = S * xp.exp(gk[b, t])[:, :, None]
            u = beta[b, t][:, None] * (value[b, t] - xp.einsum("hk,hkv->hv", k, S))
            S = S + k[:, :, None] * u[:, None, :]
            rows[b][t] = scale * xp.einsum("hk,hkv->hv", q, S)
        finals.append(S)
    zero = xp.zeros((HV, V), dtype=xp.float64)
    out = xp.stack([xp.stack([zero if r is None else r for r in row]) for row in rows])
    final = xp.stack(finals) if finals else xp.zeros((0, HV, K, V), dtype=xp.float64)
    return out, final


def delta_rule_ref(
    inputs: dict, softmax_scale=None, cu_seqlens=None, use_qk_l2norm=False, cotangents=None, autodiff=None
):
    """``(output, final_state, grads)`` of :func:`gated_delta_rule` in
    float64 numpy.

    inputs: numpy arrays by argument name (query, key, value, beta and any of
    g, gk, initial_state).  ``grads`` (by name, every input) are those of
    ``sum(output * d_output) + sum(final_state * d_final_state)`` for
    ``cotangents = (d_output, d_final_state)``, computed by ``autodiff``
    (torch; core_triton.common.naive_vjp), else None."""

    def loop(a, xp):
        return gated_delta_rule(
            a["query"], a["key"], a["value"], a["beta"], g=a.get("g"), gk=a.get("gk"),
            softmax_scale=softmax_scale, initial_state=a.get("initial_state"), cu_seqlens=cu_seqlens,
            use_qk_l2norm=use_qk_l2norm, xp=xp,
        )  # fmt: skip

    (out, final), grads = vjp_ref(loop, inputs, cotangents, autodiff)
    return out, final, grads
