"""Chunked cumsums: twinkernels (JAX and PyTorch bindings) against
``torch.cumsum``, ``jnp.cumsum`` and flash-linear-attention, in GB/s of the
fewest bytes the op must move (input read once, output written once) and as
a fraction of the copy bandwidth measured in the same run."""

from __future__ import annotations

import os

from bench.common import copy_bandwidth, markdown_table, save, time_per_call

# (op, shape [B, T, H(, S)], chunk_size or None)
CASES = [
    ("global", (8, 8192, 16, 128), None),
    ("global", (2, 65536, 16, 128), None),
    ("global", (8, 65536, 16), None),
    ("local", (8, 8192, 16, 128), 64),
    ("local", (8, 65536, 16), 64),
]


def _implementations(op, chunk, torch, jax, jnp, torch_api, jax_api):
    impls = {}
    if op == "global":
        impls["twinkernels torch"] = lambda x, xj: torch_api.chunk_global_cumsum(x)
        jf = jax.jit(lambda v: jax_api.chunk_global_cumsum(v))
        impls["twinkernels jax"] = lambda x, xj: jf(xj)
        impls["torch.cumsum"] = lambda x, xj: torch.cumsum(x, dim=1)
        jc = jax.jit(lambda v: jnp.cumsum(v, axis=1))
        impls["jnp.cumsum"] = lambda x, xj: jc(xj)
    else:
        impls["twinkernels torch"] = lambda x, xj: torch_api.chunk_local_cumsum(x, chunk)

        def _jl(v):
            return jax_api.chunk_local_cumsum(v, chunk)

        jf = jax.jit(_jl)
        impls["twinkernels jax"] = lambda x, xj: jf(xj)

        def _tl(x):
            b, t = x.shape[:2]
            return x.view(b, t // chunk, chunk, *x.shape[2:]).cumsum(2).view(x.shape)

        impls["torch.cumsum (reshaped)"] = lambda x, xj: _tl(x)

        def _jnl(v):
            b, t = v.shape[:2]
            return jnp.cumsum(v.reshape(b, t // chunk, chunk, *v.shape[2:]), axis=2).reshape(v.shape)

        jc = jax.jit(_jnl)
        impls["jnp.cumsum (reshaped)"] = lambda x, xj: jc(xj)
    try:
        from fla.ops.utils.cumsum import chunk_global_cumsum as fla_global
        from fla.ops.utils.cumsum import chunk_local_cumsum as fla_local

        if op == "global":
            impls["fla"] = lambda x, xj: fla_global(x, output_dtype=x.dtype)
        else:
            impls["fla"] = lambda x, xj: fla_local(x, chunk, output_dtype=x.dtype)
    except Exception as e:  # fla is optional: say why it is missing
        print(f"flash-linear-attention not benchmarked: {type(e).__name__}: {e}")
    return impls


def run(progress=None) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import torch

    import jax_api
    import torch_api

    bw = copy_bandwidth(torch)
    print(f"device: {torch.cuda.get_device_name()}, copy bandwidth {bw:.0f} GB/s")
    rows = []
    for op, shape, chunk in CASES:
        x = torch.randn(shape, device="cuda", dtype=torch.float32)
        xj = jnp.from_dlpack(x)
        nbytes = 2 * x.numel() * x.element_size()
        ref = None
        impls = _implementations(op, chunk, torch, jax, jnp, torch_api, jax_api)
        for name, fn in impls.items():
            row = {"op": op, "shape": "x".join(map(str, shape)), "chunk": chunk or "", "impl": name}
            rows.append(row)
            try:
                out = fn(x, xj)
                got = torch.from_dlpack(out) if not isinstance(out, torch.Tensor) else out
                ref = got if ref is None else ref
                err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
                is_jax = "jax" in name or "jnp" in name
                sync = (lambda o: o.block_until_ready()) if is_jax else (lambda o: torch.cuda.synchronize())
                t = time_per_call(lambda fn=fn, x=x, xj=xj: fn(x, xj), sync)
            except Exception as e:  # one broken baseline must not hide the rest
                row["ms"] = f"error: {type(e).__name__}: {str(e)[:80]}"
                continue
            finally:
                if progress is not None:
                    progress.update(1)
            row.update(
                {
                    "ms": f"{t * 1e3:.3f}",
                    "GB/s": f"{nbytes / t / 1e9:.0f}",
                    "of copy BW": f"{nbytes / t / 1e9 / bw:.0%}",
                    "rel err": f"{err:.1e}",
                }
            )
    meta = {"device": torch.cuda.get_device_name(), "copy_GBps": round(bw)}
    save("cumsum", rows, meta)
    print(markdown_table(rows, ["op", "shape", "chunk", "impl", "ms", "GB/s", "of copy BW", "rel err"]))
    _plot(rows, bw)
    return rows


def count() -> int:
    return len(CASES) * 5


def _base(impl: str) -> str:
    return impl.replace(" (reshaped)", "")


def _plot(rows, bw):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    from bench.common import RESULTS_DIR

    cases = list(dict.fromkeys((r["op"], r["shape"]) for r in rows))
    impls = list(dict.fromkeys(_base(r["impl"]) for r in rows))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(impls)
    for k, impl in enumerate(impls):
        vals = []
        for case in cases:
            match = [
                r
                for r in rows
                if (r["op"], r["shape"]) == case and r["impl"].replace(" (reshaped)", "") == impl
            ]
            vals.append(float(match[0]["GB/s"]) if match and "GB/s" in match[0] else 0.0)
        ax.bar([i + k * width for i in range(len(cases))], vals, width, label=impl)
    ax.axhline(bw, color="k", ls="--", lw=1, label=f"copy {bw:.0f} GB/s")
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(cases))], [f"{o}\n{s}" for o, s in cases], fontsize=8
    )
    ax.set_ylabel("GB/s (input read + output written)")
    ax.set_title("chunked cumsum, float32")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(RESULTS_DIR, "cumsum.png")
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")
