"""Segment ids against plain attention and ``cu_seqlens`` (issue 32):
B1, T 4k and 16k, 32 query heads on 4 KV heads, D 64 and 128, bf16,
causal; one segment, 4 and 64 documents (random lengths); forward and
forward+backward; both bindings.  cuDNN (SDPA's cuDNN back end) runs the
plain causal case for one segment, and the documents as a dense boolean
mask ``[1, 1, T, T]`` where it accepts one.  A group's implementations are
timed in interleaved rounds, each keeping its median (``ROUNDS``).
``python -m bench segments``.
"""

from __future__ import annotations

import statistics

import numpy as np

from bench.common import markdown_table, save, timed

LENGTHS = (4096, 16384)
DIMS = (64, 128)
HQ, H = 32, 4
DOCS = (1, 4, 64)
# (input, binding); "plain" ignores the documents (one segment only).
IMPLS = (
    ("plain", "torch"),
    ("segment ids", "torch"),
    ("cu_seqlens", "torch"),
    ("cudnn", "torch"),
    ("plain", "jax"),
    ("segment ids", "jax"),
    ("cu_seqlens", "jax"),
)


def doc_lengths(T: int, n: int, seed: int = 0) -> np.ndarray:
    """``n`` random positive lengths summing to ``T`` (one: ``[T]``)."""
    if n == 1:
        return np.array([T])
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, T), n - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [T]]))


def _torch_fns(torch, torch_api, x, do, kind, lens):
    q, k, v = x
    T = q.shape[1]
    leaves = [t.detach().requires_grad_(True) for t in x]
    if kind == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt, dot = (t.transpose(1, 2) for t in (q, k, v, do))
        tl = [t.detach().requires_grad_(True) for t in (qt, kt, vt)]
        seg = torch.tensor(np.repeat(np.arange(len(lens)), lens), device="cuda")
        mask = None
        if len(lens) > 1:
            pos = torch.arange(T, device="cuda")
            mask = ((seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None]))[None, None]

        def sdpa(a):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                if mask is None:
                    return torch.nn.functional.scaled_dot_product_attention(
                        *a, is_causal=True, enable_gqa=True
                    )
                return torch.nn.functional.scaled_dot_product_attention(*a, attn_mask=mask, enable_gqa=True)

        return lambda: sdpa((qt, kt, vt)), lambda: torch.autograd.grad(sdpa(tl), tl, dot)
    kw = _kwargs(torch.tensor, kind, lens, dict(device="cuda", dtype=torch.int32))

    def fwd(*a):
        return torch_api.flash_attention(*a, causal=True, **kw)

    return lambda: fwd(q, k, v), lambda: torch.autograd.grad(fwd(*leaves), leaves, do)


def _kwargs(make, kind, lens, opts):
    if kind == "segment ids":
        return {"q_segment_ids": make(np.repeat(np.arange(len(lens)), lens)[None], **opts)}
    if kind == "cu_seqlens":
        return {"cu_seqlens": make(np.concatenate([[0], np.cumsum(lens)]), **opts)}
    return {}


def _jax_fns(tensors, kind, lens):
    import jax
    import jax.numpy as jnp

    import jax_api

    q, k, v, do = (jnp.from_dlpack(t) for t in tensors)
    kw = _kwargs(jnp.asarray, kind, lens, dict(dtype=jnp.int32))
    fwd = jax.jit(lambda q, k, v, kw: jax_api.flash_attention(q, k, v, causal=True, **kw))
    vjp = jax.jit(lambda q, k, v, do, kw: jax.vjp(lambda *x: fwd(*x, kw), q, k, v)[1](do))
    return (lambda: fwd(q, k, v, kw)), (lambda: vjp(q, k, v, do, kw)), jax.block_until_ready


# Each group's implementations are timed in interleaved rounds (every one
# once a round) and keep their median: a single sample each, taken one after
# the other, moved the 0.2 ms rows by 5-40% between runs (clock and host
# drift), as much as what the ratios compare.
ROUNDS = 3
BUDGET = 0.05  # seconds of calls a sample (bench.common.timed)


def _group_fns(torch, torch_api, tensors, n, lens):
    """``{(kind, binding): (fwd, fwd+bwd, sync)}`` of one group (plain only
    for one segment)."""
    fns = {}
    sync = lambda _: torch.cuda.synchronize()  # noqa: E731
    for kind, binding in IMPLS:
        if kind == "plain" and n > 1:
            continue
        if binding == "jax":
            fns[kind, binding] = _jax_fns(tensors, kind, lens)
        else:
            fns[kind, binding] = (*_torch_fns(torch, torch_api, tensors[:3], tensors[3], kind, lens), sync)
    return fns


def _time_group(fns):
    """Median ms (forward, forward+backward) of each implementation over
    ``ROUNDS`` interleaved rounds; an error string where one fails (it must
    not hide the rest)."""
    samples = {key: ([], []) for key in fns}
    failed = {}
    for _ in range(ROUNDS):
        for key, (f, fb, sync) in fns.items():
            if key in failed:
                continue
            try:
                samples[key][0].append(timed(f, sync, BUDGET) * 1e3)
                samples[key][1].append(timed(fb, sync, BUDGET) * 1e3)
            except Exception as e:
                failed[key] = f"error: {type(e).__name__}: {str(e)[:100]}"
    return {key: failed.get(key) or tuple(f"{statistics.median(s):.3f}" for s in samples[key]) for key in fns}


def run(progress=None) -> list[dict]:
    import torch

    import torch_api

    rows = []
    for T in LENGTHS:
        for D in DIMS:
            g = torch.Generator(device="cuda").manual_seed(0)
            shapes = ((1, T, HQ, D), (1, T, H, D), (1, T, H, D), (1, T, HQ, D))
            tensors = [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g) for s in shapes]
            for n in DOCS:
                lens = doc_lengths(T, n)
                try:
                    times = _time_group(_group_fns(torch, torch_api, tensors, n, lens))
                except Exception as e:  # building one group's functions failed
                    times = {(k, b): f"error: {type(e).__name__}: {str(e)[:100]}" for k, b in IMPLS}
                for (kind, binding), got in times.items():
                    row = {"T": T, "D": D, "docs": n, "input": kind, "binding": binding}
                    if isinstance(got, str):
                        row["fwd ms"] = got
                    else:
                        row["fwd ms"], row["fwd+bwd ms"] = got
                    rows.append(row)
                    print(row, flush=True)
                    if progress is not None:
                        progress.update(1)
    _ratios(rows)
    save("segments", rows, {"device": torch.cuda.get_device_name(), "rounds": ROUNDS})
    cols = ["T", "D", "docs", "input", "binding", "fwd ms", "fwd+bwd ms", "vs plain", "vs cu_seqlens"]
    print(markdown_table(rows, cols))
    return rows


def _ratios(rows):
    """Segment ids' time over plain's (one segment) or over ``cu_seqlens``'s
    (documents), forward | forward+backward, per binding."""

    def find(r, **want):
        match = {k: r[k] for k in ("T", "D", "binding")} | want
        return next(
            (o for o in rows if all(o.get(k) == v for k, v in match.items()) and "fwd+bwd ms" in o), None
        )

    for r in rows:
        if r["input"] != "segment ids" or "fwd+bwd ms" not in r:
            continue
        base = find(r, input="plain") if r["docs"] == 1 else find(r, input="cu_seqlens", docs=r["docs"])
        if base is not None:
            ratio = "/".join(f"{float(r[c]) / float(base[c]):.3f}" for c in ("fwd ms", "fwd+bwd ms"))
            r["vs plain" if r["docs"] == 1 else "vs cu_seqlens"] = ratio


def count() -> int:
    return len(LENGTHS) * len(DIMS) * (len(DOCS) * len(IMPLS) - (len(DOCS) - 1) * 2)
