"""Softmax attention: twinkernels (JAX and PyTorch bindings) against torch
SDPA (flash and cuDNN back ends) and ``jax.nn.dot_product_attention`` (cuDNN
and XLA), bfloat16, B=4, H=16, D=128, T from 1k to 16k, causal or not,
forward and forward+backward, in TFLOP/s (matrix-multiply flops: 4*B*H*T*T*D
forward, 2.5x that for the backward; halved when causal)."""

from __future__ import annotations

import os

from bench.common import markdown_table, save, time_per_call

B, H, D = 4, 16, 128
SEQ_LENS = [1024, 4096, 8192, 16384]
IMPLS = ["twinkernels torch", "twinkernels jax", "sdpa flash", "sdpa cudnn", "jax cudnn", "jax xla"]


def _flops(T, causal, mode):
    f = 4 * B * H * T * T * D * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwd+bwd" else 1.0)


def _make(name, T, causal, mode, torch, jax, jnp, torch_api, jax_api):
    """(callable, sync, is_jax) for one implementation, or None to skip."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    do = torch.randn_like(q)
    if name.startswith("twinkernels torch") or name.startswith("sdpa"):
        if name.startswith("sdpa"):
            backend = SDPBackend.FLASH_ATTENTION if "flash" in name else SDPBackend.CUDNN_ATTENTION
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # SDPA is head-first

            def fwd(qq, kk, vv):
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)

            args = (qt, kt, vt)
            dout = do.transpose(1, 2)
        else:

            def fwd(qq, kk, vv):
                return torch_api.flash_attention(qq, kk, vv, causal=causal)

            args, dout = (q, k, v), do
        if mode == "fwd":
            return (lambda: fwd(*args)), (lambda _: torch.cuda.synchronize()), False
        leaves = [a.detach().requires_grad_(True) for a in args]

        def step():
            out = fwd(*leaves)
            return torch.autograd.grad(out, leaves, dout)

        return step, (lambda _: torch.cuda.synchronize()), False
    qj, kj, vj, doj = (jnp.from_dlpack(x) for x in (q, k, v, do))
    if name == "twinkernels jax":
        attn = lambda a, b, c: jax_api.flash_attention(a, b, c, causal=causal)  # noqa: E731
    else:
        impl = "cudnn" if "cudnn" in name else "xla"
        attn = lambda a, b, c: jax.nn.dot_product_attention(a, b, c, is_causal=causal, implementation=impl)  # noqa: E731
    if mode == "fwd":
        f = jax.jit(attn)
    else:
        # Output returned as well as the gradients, so that XLA cannot drop
        # forward work whose result only the caller reads.
        def fwd_bwd(a, b, c, d):
            out, pull = jax.vjp(attn, a, b, c)
            return out, pull(d)

        f = jax.jit(fwd_bwd)
    call = (lambda: f(qj, kj, vj)) if mode == "fwd" else (lambda: f(qj, kj, vj, doj))
    return call, (lambda o: jax.block_until_ready(o)), True


def run(progress=None) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import torch

    import jax_api
    import torch_api

    rows = []
    for mode in ("fwd", "fwd+bwd"):
        for causal in (False, True):
            for T in SEQ_LENS:
                for name in IMPLS:
                    row = {"mode": mode, "causal": causal, "T": T, "impl": name}
                    rows.append(row)
                    try:
                        if name == "jax xla" and T > 4096:
                            raise RuntimeError("skipped: the XLA path materialises T x T scores")
                        fn, sync, _ = _make(name, T, causal, mode, torch, jax, jnp, torch_api, jax_api)
                        t = time_per_call(fn, sync, iters=5 if T >= 8192 else 10, reps=3, warmup=2)
                        row["ms"] = f"{t * 1e3:.3f}"
                        row["TFLOP/s"] = f"{_flops(T, causal, mode) / t / 1e12:.0f}"
                    except Exception as e:  # one broken baseline must not hide the rest
                        row["ms"] = f"error: {type(e).__name__}: {str(e)[:80]}"
                    finally:
                        print(row, flush=True)  # a cut run still reports
                        torch.cuda.empty_cache()
                        if progress is not None:
                            progress.update(1)
    _ratios(rows)
    meta = {"device": torch.cuda.get_device_name(), "B": B, "H": H, "D": D, "dtype": "bfloat16"}
    save("attention", rows, meta)
    print(markdown_table(rows, ["mode", "causal", "T", "impl", "ms", "TFLOP/s", "vs sdpa flash"]))
    _plot(rows)
    return rows


def _ratios(rows):
    """Each row's speed relative to SDPA's flash back end in the same case."""
    base = {}
    for r in rows:
        if r["impl"] == "sdpa flash" and "TFLOP/s" in r:
            base[(r["mode"], r["causal"], r["T"])] = float(r["TFLOP/s"])
    for r in rows:
        b = base.get((r["mode"], r["causal"], r["T"]))
        if b and "TFLOP/s" in r:
            r["vs sdpa flash"] = f"{float(r['TFLOP/s']) / b:.2f}x"


def count() -> int:
    return 2 * 2 * len(SEQ_LENS) * len(IMPLS)


def _plot(rows):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    from bench.common import RESULTS_DIR

    fig, axes = plt.subplots(1, 4, figsize=(16, 4), sharey=True)
    panels = [(m, c) for m in ("fwd", "fwd+bwd") for c in (False, True)]
    for ax, (mode, causal) in zip(axes, panels, strict=True):
        for impl in IMPLS:
            pts = [
                (r["T"], float(r["TFLOP/s"]))
                for r in rows
                if r["impl"] == impl and r["mode"] == mode and r["causal"] == causal and "TFLOP/s" in r
            ]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{mode}, {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("T")
    axes[0].set_ylabel(f"TFLOP/s (bf16, B={B}, H={H}, D={D})")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(RESULTS_DIR, "attention.png")
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")
