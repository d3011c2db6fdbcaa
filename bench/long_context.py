"""Linear attention at batch 1 and long context (issue 27), how packed
training runs: twinkernels (PyTorch and JAX bindings) beside
flash-linear-attention in the same run, bfloat16, H16, K = V = 128.

Cases: B1, T = 32k, 64k and 128k, as one sequence and as 16 packed
documents of random lengths; ``chunk`` with ``g`` (fla
``chunk_simple_gla``), ``lightning`` (fla ``chunk_lightning_attn``) and
``recurrent`` with ``gk`` (fla ``fused_recurrent``); forward and
forward+backward.  "twinkernels torch, whole walk" is the PyTorch binding
with the state passes' split turned off (state_split.forced_segments): the
plan before issue 27, in the same run; "as trained" the forward a
differentiated call runs (the forward rows of the others are calls that
no gradient follows, which may split differently:
state_split.FORWARD_ONLY_SEGMENTS).
``TWINKERNELS_BENCH_ONLY="chunk,lightning,32768"`` keeps those ops and
lengths, ``TWINKERNELS_BENCH_IMPLS="torch,jax,fla"`` those implementations
(of ``torch``, ``jax``, ``whole``, ``trained``, ``fla``).
"""

from __future__ import annotations

import contextlib
import os

from bench.common import fla_ratios, markdown_table, save, timed
from bench.linear_attention import LAYER_IDX, NUM_LAYERS, _inputs, _jax_pair, _torch_pair
from core_triton.linear_attn.state_split import forced_segments

H, D, DOCS = 16, 128, 16
LENGTHS = [32768, 65536, 131072]
OPS = [("chunk", "g"), ("lightning", "g_gamma"), ("recurrent", "gk")]
CASES = [(op, gate, T, docs) for T in LENGTHS for docs in (0, DOCS) for op, gate in OPS]


def count() -> int:
    return len(CASES)


def _cu(torch, T, docs, seed=0):
    """16 documents of random lengths (multiples of 64), or None."""
    if not docs:
        return None
    gen = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(T // 64 - 1, generator=gen)[: docs - 1] + 1
    cu = torch.cat([torch.zeros(1), cuts.sort().values * 64.0, torch.full((1,), float(T))])
    return cu.to(device="cuda", dtype=torch.int32)


def _ours(api, op, cu):
    if op == "recurrent":
        return lambda **x: api.recurrent(**x, cu_seqlens=cu)
    if op == "chunk":
        return lambda **x: api.chunk_linear_attn(**x, cu_seqlens=cu)
    return lambda **x: api.lightning_attn(
        x["query"], x["key"], x["value"], LAYER_IDX, NUM_LAYERS, cu_seqlens=cu
    )


def _fla(op, cu):
    kw = {} if cu is None else {"cu_seqlens": cu.long()}
    if op == "recurrent":
        from fla.ops.common.fused_recurrent import fused_recurrent

        return lambda **x: fused_recurrent(x["query"], x["key"], x["value"], gk=x["gk"], **kw)
    if op == "chunk":
        from fla.ops.simple_gla import chunk_simple_gla

        return lambda **x: chunk_simple_gla(x["query"], x["key"], x["value"], g=x["g"], **kw)
    from fla.ops.lightning_attn import chunk_lightning_attn

    return lambda **x: chunk_lightning_attn(x["query"], x["key"], x["value"], LAYER_IDX, NUM_LAYERS, **kw)


def _rows(torch, jax, jnp, torch_api, jax_api, op, gate, T, docs):
    x = _inputs(torch, gate, (1, T, H, D))
    cu = _cu(torch, T, docs)
    if op == "lightning":
        x.pop("g_gamma")
    grads = list(x)
    impls = {
        "twinkernels torch": ("torch", _ours(torch_api, op, cu)),
        "twinkernels jax": ("jax", _ours(jax_api, op, None if cu is None else jnp.from_dlpack(cu))),
    }
    if op != "recurrent":
        impls["twinkernels torch, whole walk"] = ("torch-whole", _ours(torch_api, op, cu))
        impls["twinkernels torch, as trained"] = ("torch-trained", _ours(torch_api, op, cu))
    try:
        impls["fla"] = ("torch", _fla(op, cu))
    except Exception as e:  # fla is optional: say why it is missing
        print(f"fla not benchmarked: {type(e).__name__}: {e}")
    keep = [i for i in os.environ.get("TWINKERNELS_BENCH_IMPLS", "").split(",") if i]
    if keep:
        short = {"twinkernels torch": "torch", "twinkernels jax": "jax", "fla": "fla"}
        short |= {"twinkernels torch, whole walk": "whole", "twinkernels torch, as trained": "trained"}
        impls = {n: v for n, v in impls.items() if short[n] in keep}
    shape = f"B1 T{T // 1024}k" + (f" {docs} docs" if docs else "")
    rows = []
    for name, (kind, fn) in impls.items():
        if kind == "jax":
            pair = _jax_pair(jax, jnp, fn, x, grads)
            sync = lambda o: jax.block_until_ready(o)  # noqa: E731
        else:
            pair = _torch_pair(torch, fn, x, grads)
            sync = lambda _: torch.cuda.synchronize()  # noqa: E731
        for mode, call in zip(("fwd", "fwd+bwd"), pair, strict=True):
            row = {"op": f"{op} {gate}", "shape": shape, "mode": mode, "impl": name}
            try:
                # The whole walk: the state passes unsplit (the plan before
                # issue 27); as trained: no forward-only split.
                setting = {"torch-whole": (0,), "torch-trained": (None, True, False)}.get(kind)
                with forced_segments(*setting) if setting else contextlib.nullcontext():
                    row["ms"] = f"{timed(call, sync) * 1e3:.3f}"
            except Exception as e:  # one refused baseline must not hide the rest
                row["ms"] = f"error: {type(e).__name__}: {str(e)[:90]}"
            print(row, flush=True)
            rows.append(row)
        torch.cuda.empty_cache()
    return rows


def run(progress=None) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import torch

    import jax_api
    import torch_api

    only = [o for o in os.environ.get("TWINKERNELS_BENCH_ONLY", "").split(",") if o]
    ops = [o for o in only if not o.isdigit()]
    lengths = [int(o) for o in only if o.isdigit()]
    rows = []
    for op, gate, T, docs in CASES:
        if (not ops or op in ops) and (not lengths or T in lengths):
            rows += _rows(torch, jax, jnp, torch_api, jax_api, op, gate, T, docs)
        if progress is not None:
            progress.update(1)
    fla_ratios(rows, ("op", "shape", "mode"))
    save("long_context", rows, {"device": torch.cuda.get_device_name(), "dtype": "bfloat16"})
    print(markdown_table(rows, ["op", "shape", "mode", "impl", "ms", "vs fla", "jax/torch"]))
    return rows
