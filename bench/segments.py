"""Segment ids against plain attention and ``cu_seqlens`` (issue 32):
B1, T 4k and 16k, 32 query heads on 4 KV heads, D 64 and 128, bf16,
causal; one segment, 4 and 64 documents (random lengths); forward and
forward+backward; both bindings.  cuDNN (SDPA's cuDNN back end) runs the
plain causal case for one segment, and the documents as a dense boolean
mask ``[1, 1, T, T]`` where it accepts one.  A group's implementations are
timed in interleaved rounds, each keeping its median (``ROUNDS``).
``python -m bench segments``.

Two ways to call (``layers``): one call at a time, and, at
``LAYERED_LENGTHS``, ``LAYERS`` calls chained as a model's layers are
(each layer's output is the next one's queries, the same ids and keys
throughout; one jitted function in JAX, the gradient of the whole chain
for forward+backward), reported per layer.  Every call (of one layer, or
of the chain) makes the ranges of its ids, or the index arrays of its
boundaries, once: each jitted JAX call does, and PyTorch's reuse from one
call to the next is dropped (a model's next step brings a new ids
tensor).  Within a chain PyTorch reuses them across the layers and XLA
makes them once (the layers' range launches are the same custom call on
the same operand: common-subexpression elimination merges them;
``range_launches`` counts them in the compiled HLO), and the JAX dispatch
cost per call is spread over the layers as in a model.  (Runs up to the
forty-second session, docs/bench-segments-h200-direct-scratch.json
included, let PyTorch reuse them from call to call.)
"""

from __future__ import annotations

import statistics

import numpy as np

from bench.common import markdown_table, save, timed

LENGTHS = (4096, 16384)
DIMS = (64, 128)
HQ, H = 32, 4
DOCS = (1, 4, 64)
LAYERS = 8
LAYERED_LENGTHS = (4096,)
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


def _chain(attend, x, layers):
    """``layers`` calls of ``attend(queries)``, each output the next one's
    queries (a model's layers, as far as attention sees them)."""
    for _ in range(layers):
        x = attend(x)
    return x


def _torch_fns(torch, torch_api, x, do, kind, lens, layers=1):
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
            def one(query):
                if mask is None:
                    return torch.nn.functional.scaled_dot_product_attention(
                        query, *a[1:], is_causal=True, enable_gqa=True
                    )
                return torch.nn.functional.scaled_dot_product_attention(
                    query, *a[1:], attn_mask=mask, enable_gqa=True
                )

            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return _chain(one, a[0], layers)

        return lambda: sdpa((qt, kt, vt)), lambda: torch.autograd.grad(sdpa(tl), tl, dot)
    kw = _kwargs(torch.tensor, kind, lens, dict(device="cuda", dtype=torch.int32))
    from torch_api import _flash

    def fwd(q, k, v):
        # Each call makes its index arrays once, as each jitted JAX call
        # does and as a model's step does with its batch's new ids tensor:
        # the arrays kept from the call before are dropped (the layers of
        # one call still share them).
        _flash._MADE.kept = None
        return _chain(lambda x: torch_api.flash_attention(x, k, v, causal=True, **kw), q, layers)

    return lambda: fwd(q, k, v), lambda: torch.autograd.grad(fwd(*leaves), leaves, do)


def _kwargs(make, kind, lens, opts):
    if kind == "segment ids":
        return {"q_segment_ids": make(np.repeat(np.arange(len(lens)), lens)[None], **opts)}
    if kind == "cu_seqlens":
        return {"cu_seqlens": make(np.concatenate([[0], np.cumsum(lens)]), **opts)}
    return {}


def _jax_jitted(tensors, kind, lens, layers):
    """``(fwd, vjp, args)``: ``layers`` chained JAX calls, jitted, as
    ``fwd(q, k, v, kw)`` and ``vjp(q, k, v, do, kw)`` (the forward and the
    gradients of the chain), and their arrays ``(q, k, v, do, kw)``."""
    import jax
    import jax.numpy as jnp

    import jax_api

    q, k, v, do = (jnp.from_dlpack(t) for t in tensors)
    kw = _kwargs(jnp.asarray, kind, lens, dict(dtype=jnp.int32))

    def chain(q, k, v, kw):
        return _chain(lambda x: jax_api.flash_attention(x, k, v, causal=True, **kw), q, layers)

    fwd = jax.jit(chain)
    vjp = jax.jit(lambda q, k, v, do, kw: jax.vjp(lambda *x: chain(*x, kw), q, k, v)[1](do))
    return fwd, vjp, (q, k, v, do, kw)


def _jax_fns(tensors, kind, lens, layers=1):
    import jax

    fwd, vjp, (q, k, v, do, kw) = _jax_jitted(tensors, kind, lens, layers)
    return (lambda: fwd(q, k, v, kw)), (lambda: vjp(q, k, v, do, kw)), jax.block_until_ready


def range_launches(tensors, lens, layers=LAYERS) -> dict[str, int]:
    """Triton launches in the compiled HLO of ``layers`` chained JAX calls
    with segment ids (forward, and forward+backward), and of one call: with
    the layers' range launches merged, ``layers`` calls hold ``layers - 1``
    fewer than ``layers`` times one call's."""
    counts = {}
    for n in (1, layers):
        fwd, vjp, (q, k, v, do, kw) = _jax_jitted(tensors, "segment ids", lens, n)
        for mode, lowered in (("fwd", fwd.lower(q, k, v, kw)), ("fwd+bwd", vjp.lower(q, k, v, do, kw))):
            text = lowered.compile().as_text()
            counts[f"{mode}, {n} layers"] = text.count('custom_call_target="triton_kernel_call"')
    return counts


# Each group's implementations are timed in interleaved rounds (every one
# once a round) and keep their median: a single sample each, taken one after
# the other, moved the 0.2 ms rows by 5-40% between runs (clock and host
# drift), as much as what the ratios compare.
ROUNDS = 3
BUDGET = 0.05  # seconds of calls a sample (bench.common.timed)


def _group_fns(torch, torch_api, tensors, n, lens, layer_counts):
    """``{(kind, binding, layers): (fwd, fwd+bwd, sync)}`` of one group
    (plain only for one segment)."""
    fns = {}
    sync = lambda _: torch.cuda.synchronize()  # noqa: E731
    for layers in layer_counts:
        for kind, binding in IMPLS:
            if kind == "plain" and n > 1:
                continue
            if binding == "jax":
                fns[kind, binding, layers] = _jax_fns(tensors, kind, lens, layers)
            else:
                fns[kind, binding, layers] = (
                    *_torch_fns(torch, torch_api, tensors[:3], tensors[3], kind, lens, layers),
                    sync,
                )
    return fns


def _time_group(fns):
    """Median ms per layer (forward, forward+backward) of each
    implementation over ``ROUNDS`` interleaved rounds; an error string where
    one fails (it must not hide the rest)."""
    samples = {key: ([], []) for key in fns}
    failed = {}
    for _ in range(ROUNDS):
        for key, (f, fb, sync) in fns.items():
            if key in failed:
                continue
            try:
                samples[key][0].append(timed(f, sync, BUDGET) * 1e3 / key[2])
                samples[key][1].append(timed(fb, sync, BUDGET) * 1e3 / key[2])
            except Exception as e:
                failed[key] = f"error: {type(e).__name__}: {str(e)[:100]}"
    return {key: failed.get(key) or tuple(f"{statistics.median(s):.3f}" for s in samples[key]) for key in fns}


def run(progress=None) -> list[dict]:
    import torch

    import torch_api

    rows = []
    launches = {}
    for T in LENGTHS:
        layer_counts = (1, LAYERS) if T in LAYERED_LENGTHS else (1,)
        for D in DIMS:
            g = torch.Generator(device="cuda").manual_seed(0)
            shapes = ((1, T, HQ, D), (1, T, H, D), (1, T, H, D), (1, T, HQ, D))
            tensors = [torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=g) for s in shapes]
            if not launches:
                try:
                    launches = range_launches(tensors, doc_lengths(T, 4))
                except Exception as e:
                    launches = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                print("triton launches in the compiled HLO:", launches, flush=True)
            for n in DOCS:
                lens = doc_lengths(T, n)
                try:
                    times = _time_group(_group_fns(torch, torch_api, tensors, n, lens, layer_counts))
                except Exception as e:  # building one group's functions failed
                    err = f"error: {type(e).__name__}: {str(e)[:100]}"
                    times = {(k, b, m): err for k, b in IMPLS for m in layer_counts}
                for (kind, binding, layers), got in times.items():
                    row = {"T": T, "D": D, "docs": n, "layers": layers, "input": kind, "binding": binding}
                    if isinstance(got, str):
                        row["fwd ms"] = got
                    else:
                        row["fwd ms"], row["fwd+bwd ms"] = got
                    rows.append(row)
                    print(row, flush=True)
                    if progress is not None:
                        progress.update(1)
    _ratios(rows)
    meta = {"device": torch.cuda.get_device_name(), "rounds": ROUNDS, "layers": LAYERS, "launches": launches}
    save("segments", rows, meta)
    cols = ["T", "D", "docs", "layers", "input", "binding", "fwd ms", "fwd+bwd ms"]
    cols += ["vs plain", "vs cu_seqlens", "JAX / torch"]
    print(markdown_table(rows, cols))
    return rows


def _ratios(rows):
    """Segment ids' time over plain's (one segment) or over ``cu_seqlens``'s
    (documents), forward | forward+backward, per binding and way of calling
    (``layers``); and JAX's over PyTorch's, on JAX's rows."""

    def find(r, **want):
        match = {k: r[k] for k in ("T", "D", "docs", "layers", "input", "binding")} | want
        return next(
            (o for o in rows if all(o.get(k) == v for k, v in match.items()) and "fwd+bwd ms" in o), None
        )

    def ratio(r, base):
        return "/".join(f"{float(r[c]) / float(base[c]):.3f}" for c in ("fwd ms", "fwd+bwd ms"))

    for r in rows:
        if "fwd+bwd ms" not in r:
            continue
        if r["binding"] == "jax" and (torch_row := find(r, binding="torch")) is not None:
            r["JAX / torch"] = ratio(r, torch_row)
        if r["input"] != "segment ids":
            continue
        base = find(r, input="plain", docs=1) if r["docs"] == 1 else find(r, input="cu_seqlens")
        if base is not None:
            r["vs plain" if r["docs"] == 1 else "vs cu_seqlens"] = ratio(r, base)


def count() -> int:
    per_length = len(DIMS) * (len(DOCS) * len(IMPLS) - (len(DOCS) - 1) * 2)
    return sum(per_length * (2 if T in LAYERED_LENGTHS else 1) for T in LENGTHS)
