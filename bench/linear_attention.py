"""Linear attention: twinkernels (JAX and PyTorch bindings) against
flash-linear-attention in the same run, bfloat16, forward and
forward+backward, plus torch SDPA (cuDNN) causal attention as the softmax
reference; and a sweep of time against T.

Cases: ``recurrent`` with each gate type (fla: ``fused_recurrent``),
``chunk`` with ``g`` and with ``g_gamma`` (fla: ``chunk_simple_gla``),
``lightning`` chunk mode (fla: ``chunk_lightning_attn``).
"""

from __future__ import annotations

import os

from bench.common import fla_ratios, markdown_table, save, timed

SHAPES = [(4, 4096, 16, 128), (1, 32768, 16, 128)]
SWEEP_T = [1024, 2048, 4096, 8192, 16384, 32768]
CASES = (
    [("recurrent", gate, s) for s in SHAPES for gate in ("g", "g_gamma", "gk", "gv")]
    + [("chunk", gate, s) for s in SHAPES for gate in ("g", "g_gamma")]
    + [("lightning", "g_gamma", s) for s in SHAPES]
    + [("sdpa", "-", s) for s in SHAPES]
)
LAYER_IDX, NUM_LAYERS = 3, 12


def _inputs(torch, gate, shape, seed=0):
    B, T, H, D = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*s, dtype=torch.bfloat16):
        return torch.randn(*s, device="cuda", dtype=dtype, generator=gen)

    x = {"query": rnd(B, T, H, D), "key": rnd(B, T, H, D), "value": rnd(B, T, H, D)}
    logsig = torch.nn.functional.logsigmoid
    if gate == "g":
        x["g"] = logsig(rnd(B, T, H, dtype=torch.float32) + 4)
    elif gate == "gk":
        x["gk"] = logsig(rnd(B, T, H, D, dtype=torch.float32) + 4)
    elif gate == "gv":
        x["gv"] = logsig(rnd(B, T, H, D, dtype=torch.float32) + 4)
    elif gate == "g_gamma":
        x["g_gamma"] = -(8 / H) * (1 - LAYER_IDX / NUM_LAYERS) * torch.arange(H, device="cuda").float()
    return x


def _ours(api, op, gate):
    if op == "recurrent":
        return lambda **x: api.recurrent(**x)
    if op == "chunk":
        return lambda **x: api.chunk_linear_attn(**x)
    return lambda **x: api.lightning_attn(x["query"], x["key"], x["value"], LAYER_IDX, NUM_LAYERS)


def _fla(op):
    if op == "recurrent":
        from fla.ops.common.fused_recurrent import fused_recurrent

        return lambda **x: fused_recurrent(
            x["query"], x["key"], x["value"], **{n: x[n] for n in ("g", "g_gamma", "gk", "gv") if n in x}
        )
    if op == "chunk":
        from fla.ops.simple_gla import chunk_simple_gla

        return lambda **x: chunk_simple_gla(
            x["query"], x["key"], x["value"], **{n: x[n] for n in ("g", "g_gamma") if n in x}
        )
    from fla.ops.lightning_attn import chunk_lightning_attn

    return lambda **x: chunk_lightning_attn(x["query"], x["key"], x["value"], LAYER_IDX, NUM_LAYERS)


def _torch_pair(torch, fn, x, grads):
    """(forward, forward+backward) callables on torch tensors."""
    leaves = {n: (v.clone().requires_grad_(n in grads)) for n, v in x.items()}
    do = torch.randn_like(x["value"]) if "value" in x else None

    def fwd():
        with torch.no_grad():
            return fn(**x)

    def fwd_bwd():
        out = fn(**leaves)
        o = out[0] if isinstance(out, tuple) else out
        return torch.autograd.grad(o, [leaves[n] for n in grads], do)

    return fwd, fwd_bwd


def _jax_pair(jax, jnp, fn, x, grads):
    xj = {n: jnp.from_dlpack(v) for n, v in x.items()}
    do = jnp.ones(xj["value"].shape[:3] + (xj["value"].shape[3],), jnp.bfloat16) * 0.01
    fwd = jax.jit(lambda d: fn(**d)[0])

    def loss_vjp(d, do):
        diff = {n: d[n] for n in grads}
        rest = {n: v for n, v in d.items() if n not in grads}
        out, pull = jax.vjp(lambda p: fn(**p, **rest), diff)
        # The output is returned too: otherwise XLA drops the forward launch
        # whose results only the caller would read (the backward recomputes
        # states), and "fwd+bwd" would time the backward alone.
        return out, pull((do, jnp.zeros_like(out[1])))

    # The cotangent is an argument, as PyTorch's is a tensor made once: a
    # closed-over array is a constant of the jitted computation, which XLA
    # may materialise on every call.
    fwd_bwd = jax.jit(loss_vjp)
    return (lambda: fwd(xj)), (lambda: fwd_bwd(xj, do))


def _sdpa(torch, x):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (x[n].transpose(1, 2) for n in ("query", "key", "value"))

    def fn(query, key, value):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)

    return fn, {"query": q, "key": k, "value": v}


def _measure(torch, jax, jnp, torch_api, jax_api, op, gate, shape, modes=("fwd", "fwd+bwd")):
    """Rows {impl, mode, ms} for one case."""
    x = _inputs(torch, gate, shape)
    grads = [n for n in x if n != "g_gamma"]
    impls = {}
    if op == "sdpa":
        fn, xs = _sdpa(torch, x)
        impls["torch sdpa cudnn (softmax)"] = ("torch", fn, xs)
    else:
        impls["twinkernels torch"] = ("torch", _ours(torch_api, op, gate), x)
        impls["twinkernels jax"] = ("jax", _ours(jax_api, op, gate), x)
        try:
            impls["fla"] = ("torch", _fla(op), x)
        except Exception as e:  # fla is optional: say why it is missing
            print(f"fla not benchmarked: {type(e).__name__}: {e}")
    if op == "lightning":
        x.pop("g_gamma", None)
        grads = [n for n in grads if n in x]
    rows = []
    for name, (kind, fn, xs) in impls.items():
        if kind == "torch":
            pair = _torch_pair(torch, fn, xs, [n for n in grads if n in xs])
            sync = lambda _: torch.cuda.synchronize()  # noqa: E731
        else:
            pair = _jax_pair(jax, jnp, fn, xs, [n for n in grads if n in xs])
            sync = lambda o: jax.block_until_ready(o)  # noqa: E731
        for mode, call in zip(("fwd", "fwd+bwd"), pair, strict=True):
            if mode not in modes:
                continue
            row = {"op": op, "gate": gate, "shape": "x".join(map(str, shape)), "impl": name, "mode": mode}
            try:
                row["ms"] = f"{timed(call, sync) * 1e3:.3f}"
            except Exception as e:  # one refused baseline must not hide the rest
                row["ms"] = f"error: {type(e).__name__}: {str(e)[:90]}"
            rows.append(row)
    return rows


def run(progress=None) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import torch

    import jax_api
    import torch_api

    print(f"device: {torch.cuda.get_device_name()}")
    rows = []
    # TWINKERNELS_BENCH_ONLY="chunk,recurrent:gv,sweep" keeps those ops or
    # op:gate cases, and the T sweep (a device call is 10 minutes); each row
    # is printed as soon as it is measured so a cut run still reports.
    only = [o for o in os.environ.get("TWINKERNELS_BENCH_ONLY", "").split(",") if o]
    for op, gate, shape in CASES:
        if only and op not in only and f"{op}:{gate}" not in only:
            continue
        new = _measure(torch, jax, jnp, torch_api, jax_api, op, gate, shape)
        for r in new:
            print(r, flush=True)
        rows += new
        if progress is not None:
            progress.update(1)
    fla_ratios(rows, ("op", "gate", "shape", "mode"))
    sweep = []
    for T in SWEEP_T if not only or "sweep" in only else ():
        for op in ("lightning", "sdpa"):
            new = _measure(torch, jax, jnp, torch_api, jax_api, op, "g_gamma", (1, T, 16, 128), ("fwd+bwd",))
            for r in new:
                print(r, flush=True)
            sweep += new
        if progress is not None:
            progress.update(1)
    meta = {"device": torch.cuda.get_device_name(), "dtype": "bfloat16"}
    save("linear_attention", rows + sweep, meta)
    print(markdown_table(rows, ["op", "gate", "shape", "mode", "impl", "ms", "vs fla", "jax/torch"]))
    print(markdown_table(sweep, ["op", "shape", "mode", "impl", "ms"]))
    _plot(sweep)
    return rows


def count() -> int:
    return len(CASES) + len(SWEEP_T)


def _plot(sweep):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    from bench.common import RESULTS_DIR

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for impl in dict.fromkeys(r["impl"] for r in sweep):
        pts = []
        for r in sweep:
            if r["impl"] == impl:
                try:
                    pts.append((int(r["shape"].split("x")[1]), float(r["ms"])))
                except ValueError:
                    pass
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("T (B=1, H=16, D=128, bf16)")
    ax.set_ylabel("ms, forward+backward")
    ax.set_title("lightning attention (chunk) vs softmax attention")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(RESULTS_DIR, "linear_attention.png")
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")
