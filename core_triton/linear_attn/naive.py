"""Float64 reference for (gated) linear attention, written as the loop over
time of docs/api.md#recurrent, for the tests and the demo.  No framework:
the loop runs on numpy arrays, or on float64 tensors of an autodiff module
the caller hands in, whose autograd gives its gradients
(:func:`linear_attention_ref`, core_triton.common.naive_vjp), so that no
hand-derived backward stands in the reference."""

from __future__ import annotations

import numpy as np

from core_triton.common.naive_vjp import vjp_ref


def _sequences(batch, seq_len, cu_seqlens):
    """(batch row, state index, start, end) of every sequence."""
    if cu_seqlens is None:
        return [(b, b, 0, seq_len) for b in range(batch)]
    cu = [int(c) for c in cu_seqlens]
    return [(0, i, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def linear_attention_loop(t, q, k, v, g, g_gamma, gk, gv, scale, h0, reverse, cu_seqlens):
    """``(output, final_state)`` of the recurrence of docs/api.md#recurrent,
    token by token, in float64: ``t`` is numpy or torch (the arrays' module;
    tests differentiate it with torch autograd)."""
    B, T, HQ, K = q.shape
    H, V = k.shape[2], v.shape[-1]
    G = HQ // H
    scale = K**-0.5 if scale is None else scale
    seqs = _sequences(B, T, cu_seqlens)
    N = len(seqs)
    rows = [[None] * T for _ in range(B)]
    finals = []
    for b, n, bos, eos in seqs:
        S = h0[n] * 1.0 if h0 is not None else t.zeros((H, K, V), dtype=t.float64)
        order = range(eos - 1, bos - 1, -1) if reverse else range(bos, eos)
        for i in order:
            decay = t.ones((H, K, V), dtype=t.float64)
            if g is not None:
                decay = decay * t.exp(g[b, i])[:, None, None]
            if g_gamma is not None:
                decay = decay * t.exp(g_gamma)[:, None, None]
            if gk is not None:
                decay = decay * t.exp(gk[b, i])[:, :, None]
            if gv is not None:
                decay = decay * t.exp(gv[b, i])[:, None, :]
            S = S * decay + k[b, i][:, :, None] * v[b, i][:, None, :]
            Sq = t.stack([S[h // G] for h in range(HQ)])  # [HQ, K, V]
            rows[b][i] = scale * t.einsum("hk,hkv->hv", q[b, i], Sq)
        finals.append(S)
    for b in range(B):
        for i in range(T):
            if rows[b][i] is None:  # tokens outside every sequence cannot occur; keep shapes
                rows[b][i] = t.zeros((HQ, V), dtype=t.float64)
    out = t.stack([t.stack(r) for r in rows])
    final = t.stack(finals) if finals else t.zeros((N, H, K, V), dtype=t.float64)
    return out, final


def lightning_g_gamma(num_heads: int, layer_idx: int, num_layers: int) -> np.ndarray:
    """The per-head decay of lightning attention (docs/api.md#lightning_attn), ``[H]`` float64."""
    h = np.arange(num_heads, dtype=np.float64)
    return -(8.0 / num_heads) * (1.0 - layer_idx / num_layers) * h


def linear_attention_ref(
    inputs: dict,
    softmax_scale=None,
    reverse=False,
    cu_seqlens=None,
    d_output=None,
    d_final_state=None,
    autodiff=None,
):
    """``(output, final_state, grads)`` of the recurrence of
    docs/api.md#recurrent in float64 numpy.

    inputs: numpy arrays by argument name (query, key, value and any of g,
    g_gamma, gk, gv, initial_state).  ``grads`` (by name, every input given)
    are those of ``sum(output * d_output) + sum(final_state *
    d_final_state)`` when either cotangent is given, computed by
    ``autodiff`` (torch), else None."""

    def loop(a, t):
        return linear_attention_loop(
            t, a["query"], a["key"], a["value"], a.get("g"), a.get("g_gamma"), a.get("gk"), a.get("gv"),
            softmax_scale, a.get("initial_state"), reverse, cu_seqlens,
        )  # fmt: skip

    cotangents = None if d_output is None and d_final_state is None else (d_output, d_final_state)
    (out, final), grads = vjp_ref(loop, inputs, cotangents, autodiff)
    return out, final, grads
