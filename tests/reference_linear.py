"""Float64 reference for (gated) linear attention, written as the loop over
time of docs/api.md#recurrent.  Written in torch float64 so that autograd gives the reference
gradients of the same plain loop (no hand-derived backward to get wrong)."""

from __future__ import annotations

import numpy as np

GRAD_NAMES = ("query", "key", "value", "g", "g_gamma", "gk", "gv", "initial_state")


def _sequences(batch, seq_len, cu_seqlens):
    """(batch row, state index, start, end) of every sequence."""
    if cu_seqlens is None:
        return [(b, b, 0, seq_len) for b in range(batch)]
    cu = [int(c) for c in cu_seqlens]
    return [(0, i, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def _loop(t, q, k, v, g, g_gamma, gk, gv, scale, h0, reverse, cu_seqlens):
    B, T, HQ, K = q.shape
    H, V = k.shape[2], v.shape[-1]
    G = HQ // H
    scale = K**-0.5 if scale is None else scale
    seqs = _sequences(B, T, cu_seqlens)
    N = len(seqs)
    rows = [[None] * T for _ in range(B)]
    finals = []
    for b, n, bos, eos in seqs:
        S = h0[n].clone() if h0 is not None else t.zeros(H, K, V, dtype=t.float64)
        order = range(eos - 1, bos - 1, -1) if reverse else range(bos, eos)
        for i in order:
            decay = t.ones(H, K, V, dtype=t.float64)
            if g is not None:
                decay = decay * t.exp(g[b, i])[:, None, None]
            if g_gamma is not None:
                decay = decay * t.exp(g_gamma)[:, None, None]
            if gk is not None:
                decay = decay * t.exp(gk[b, i])[:, :, None]
            if gv is not None:
                decay = decay * t.exp(gv[b, i])[:, None, :]
            S = S * decay + k[b, i][:, :, None] * v[b, i][:, None, :]
            Sq = S.repeat_interleave(G, dim=0)  # [HQ, K, V]
            rows[b][i] = scale * t.einsum("hk,hkv->hv", q[b, i], Sq)
        finals.append(S)
    for b in range(B):
        for i in range(T):
            if rows[b][i] is None:  # tokens outside every sequence cannot occur; keep shapes
                rows[b][i] = t.zeros(HQ, V, dtype=t.float64)
    out = t.stack([t.stack(r) for r in rows])
    final = t.stack(finals) if finals else t.zeros(N, H, K, V, dtype=t.float64)
    return out, final


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
    out, final = _loop(
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


def lightning_g_gamma(num_heads: int, layer_idx: int, num_layers: int) -> np.ndarray:
    """The per-head decay of lightning attention (docs/api.md#lightning_attn), ``[H]`` float64."""
    h = np.arange(num_heads, dtype=np.float64)
    return -(8.0 / num_heads) * (1.0 - layer_idx / num_layers) * h
