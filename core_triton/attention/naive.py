"""Float64 reference for softmax attention, written plainly with numpy (for
the tests and the demo):
the full score matrix, the mask of docs/api.md#flash_attention, the softmax with sinks, and the
gradients (the adjoint of each step, including through ``lse``)."""

from __future__ import annotations

import numpy as np


def _f64(x):
    return None if x is None else np.asarray(x, np.float64)


def allowed(B, Tq, Tk, causal, window, q_segment_ids, kv_segment_ids, q_positions, kv_positions):
    """allowed[b, i, j] of docs/api.md#flash_attention (bool [B, Tq, Tk])."""

    def pos(p, T):
        if p is None:
            return np.broadcast_to(np.arange(T), (B, T))
        p = np.asarray(p, np.int64)
        return np.broadcast_to(p, (B, T))

    qp, kp = pos(q_positions, Tq), pos(kv_positions, Tk)
    ok = np.ones((B, Tq, Tk), bool)
    if causal:
        ok &= kp[:, None, :] <= qp[:, :, None]
    if window is not None:
        left, right = (window, window) if np.isscalar(window) else window
        d = qp[:, :, None] - kp[:, None, :]
        if left is not None:
            ok &= d <= left
        if right is not None:
            ok &= -d <= right
    qs, ks = q_segment_ids, kv_segment_ids
    if qs is None:
        qs = ks
    if ks is None:
        ks = qs
    if qs is not None:
        ok &= np.asarray(qs)[:, :, None] == np.asarray(ks)[:, None, :]
    return ok


def attention_ref(
    query,
    key,
    value,
    q_segment_ids=None,
    kv_segment_ids=None,
    softmax_aux=None,
    bias=None,
    sliding_window=None,
    causal=False,
    logits_soft_cap=None,
    softmax_scale=None,
    q_positions=None,
    kv_positions=None,
    do=None,
    dlse=None,
):
    """Returns a dict: ``out [B,Tq,HQ,Dv]``, ``lse [B,HQ,Tq]`` and, when
    ``do`` is given, ``dq, dk, dv`` (and ``dsink``, ``dbias``)."""
    q, k, v, do = _f64(query), _f64(key), _f64(value), _f64(do)
    B, Tq, HQ, D = q.shape
    Tk, H = k.shape[1], k.shape[2]
    g = HQ // H
    kr = np.repeat(k, g, axis=2)
    vr = np.repeat(v, g, axis=2)
    scale = D**-0.5 if softmax_scale is None else softmax_scale
    x = scale * np.einsum("bihd,bjhd->bhij", q, kr, optimize=True)
    if logits_soft_cap is not None:
        t = np.tanh(x / logits_soft_cap)
        s = logits_soft_cap * t
    else:
        s = x
    if bias is not None:
        s = s + _f64(bias)
    ok = allowed(B, Tq, Tk, causal, sliding_window, q_segment_ids, kv_segment_ids, q_positions, kv_positions)[
        :, None
    ]
    sm = np.where(ok, s, -np.inf)
    sink = None if softmax_aux is None else _f64(softmax_aux).reshape(HQ, -1)
    m = sm.max(-1)
    if sink is not None:
        m = np.maximum(m, sink.max(-1)[None, :, None])
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(ok, np.exp(sm - m[..., None]), 0.0)
    z = e.sum(-1)
    if sink is not None:
        es = np.exp(sink[None, :, None, :] - m[..., None])  # [B,HQ,Tq,S]
        z = z + es.sum(-1)
    zsafe = np.where(z > 0, z, 1.0)
    p = e / zsafe[..., None]
    out = np.einsum("bhij,bjhd->bihd", p, vr, optimize=True)
    lse = np.where(z > 0, np.log(zsafe) + m, -np.inf)
    res = {"out": out, "lse": lse}
    if do is None:
        return res
    dp = np.einsum("bihd,bjhd->bhij", do, vr, optimize=True)
    delta = np.einsum("bihd,bihd->bhi", do, out, optimize=True)
    if dlse is not None:
        delta = delta - _f64(dlse)
    ds = p * (dp - delta[..., None])
    if bias is not None:
        db = ds
        for ax in (0, 1):
            if np.shape(bias)[ax] == 1:
                db = db.sum(axis=ax, keepdims=True)
        res["dbias"] = db
    dx = ds * (1 - t**2) if logits_soft_cap is not None else ds
    res["dq"] = scale * np.einsum("bhij,bjhd->bihd", dx, kr, optimize=True)
    dkr = scale * np.einsum("bhij,bihd->bjhd", dx, q, optimize=True)
    dvr = np.einsum("bhij,bihd->bjhd", p, do, optimize=True)
    res["dk"] = dkr.reshape(B, Tk, H, g, D).sum(3)
    res["dv"] = dvr.reshape(B, Tk, H, g, -1).sum(3)
    if sink is not None:
        psink = es / zsafe[..., None]  # [B, HQ, Tq, S]
        res["dsink"] = (-(psink * delta[..., None]).sum(axis=(0, 2))).reshape(np.shape(softmax_aux))
    return res
