"""Flash attention against cuDNN at the shapes of issue 31: bf16, B4 H16
T8k and B16 H16 T2k at head dims 64 and 128, full and causal, and a Llama
1B shape (B1 T4k, 32 query heads on 4 KV heads, D 64, causal); forward and
forward+backward, TFLOP/s (4*B*HQ*T*T*D forward, 2.5x that more for the
backward, halved when causal) and the ratio to cuDNN (SDPA's cuDNN back end
for PyTorch, ``jax.nn.dot_product_attention(implementation="cudnn")`` for
JAX).  Ours in both bindings with the plan's own kernels, and with the
Gluon kernels switched off (``gluon off``: Triton's warp-specialised
forward and the Triton backward where the plan took the Gluon forward and
backward, the kernels before them), SDPA's flash back end
(FlashAttention-2) beside.

``TWINKERNELS_FLASH_CASES`` (comma-separated substrings of the case names)
runs some of the cases; ``TWINKERNELS_FLASH_ROUNDS`` rounds (default 3)
over the implementations, medians reported."""

from __future__ import annotations

import os
import statistics

from bench.common import markdown_table, save, time_per_call

CASES = [  # name, B, T, HQ, H, D, causal
    ("B4 T8k D128 full", 4, 8192, 16, 16, 128, False),
    ("B4 T8k D128 causal", 4, 8192, 16, 16, 128, True),
    ("B16 T2k D128 full", 16, 2048, 16, 16, 128, False),
    ("B16 T2k D128 causal", 16, 2048, 16, 16, 128, True),
    ("llama B1 T4k 32:4 D64 causal", 1, 4096, 32, 4, 64, True),
    # Where the warp-specialised forward (head dim 128) is taken beyond the
    # issue's shapes: shorter and longer sequences.
    ("B4 T1k D128 full", 4, 1024, 16, 16, 128, False),
    ("B4 T1k D128 causal", 4, 1024, 16, 16, 128, True),
    ("B8 T4k D128 full", 8, 4096, 16, 16, 128, False),
    ("B8 T4k D128 causal", 8, 4096, 16, 16, 128, True),
    ("B4 T16k D128 full", 4, 16384, 16, 16, 128, False),
    ("B4 T16k D128 causal", 4, 16384, 16, 16, 128, True),
    ("B4 T8k D64 full", 4, 8192, 16, 16, 64, False),
    ("B4 T8k D64 causal", 4, 8192, 16, 16, 64, True),
    ("B16 T2k D64 full", 16, 2048, 16, 16, 64, False),
    ("B16 T2k D64 causal", 16, 2048, 16, 16, 64, True),
]
ROUNDS = int(os.environ.get("TWINKERNELS_FLASH_ROUNDS", "3"))
IMPLS = [
    "twinkernels torch",
    "twinkernels torch (gluon off)",
    "twinkernels jax",
    "twinkernels jax (gluon off)",
    "sdpa cudnn",
    "sdpa flash",
    "jax cudnn",
]


def _cases():
    only = os.environ.get("TWINKERNELS_FLASH_CASES")
    if not only:
        return CASES
    keys = [k.strip() for k in only.split(",")]
    return [c for c in CASES if any(k in c[0] for k in keys)]


def _flops(B, T, HQ, D, causal, mode):
    f = 4 * B * HQ * T * T * D * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwd+bwd" else 1.0)


def _make(name, case, mode, torch, jax, jnp, torch_api, jax_api):
    """(callable, sync) of one implementation in one case and mode."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _, B, T, HQ, H, D, causal = case
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    do = torch.randn_like(q)
    torch_sync = lambda _: torch.cuda.synchronize()  # noqa: E731
    if name.startswith("twinkernels torch") or name.startswith("sdpa"):
        if name.startswith("sdpa"):
            backend = SDPBackend.FLASH_ATTENTION if "flash" in name else SDPBackend.CUDNN_ATTENTION
            args = tuple(x.transpose(1, 2) for x in (q, k, v))  # SDPA is head-first
            dout = do.transpose(1, 2)

            def fwd(a, b, c):
                with sdpa_kernel(backend):
                    return torch.nn.functional.scaled_dot_product_attention(
                        a, b, c, is_causal=causal, enable_gqa=HQ != H
                    )

        else:
            args, dout = (q, k, v), do

            def fwd(a, b, c):
                return torch_api.flash_attention(a, b, c, causal=causal)

        if mode == "fwd":
            return (lambda: fwd(*args)), torch_sync
        leaves = [a.detach().requires_grad_(True) for a in args]
        return (lambda: torch.autograd.grad(fwd(*leaves), leaves, dout)), torch_sync
    qj, kj, vj, doj = (jnp.from_dlpack(x) for x in (q, k, v, do))
    if name.startswith("twinkernels jax"):

        def attn(a, b, c):
            return jax_api.flash_attention(a, b, c, causal=causal)

    else:

        def attn(a, b, c):
            return jax.nn.dot_product_attention(a, b, c, is_causal=causal, implementation="cudnn")

    if mode == "fwd":
        f = jax.jit(attn)
        return (lambda: f(qj, kj, vj)), jax.block_until_ready

    def fwd_bwd(a, b, c, d):
        # The output is returned too, so XLA cannot drop forward work.
        out, pull = jax.vjp(attn, a, b, c)
        return out, pull(d)

    f = jax.jit(fwd_bwd)
    return (lambda: f(qj, kj, vj, doj)), jax.block_until_ready


def run(progress=None) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import torch

    import jax_api
    import torch_api
    from core_triton.attention import flash, flash_tma_plans

    rows = []
    modes_before = flash_tma_plans.GLUON_FORWARD, flash_tma_plans.GLUON_BACKWARD
    try:
        for case in _cases():
            name, B, T, HQ, H, D, causal = case
            for mode in ("fwd", "fwd+bwd"):
                made, times = {}, {impl: [] for impl in IMPLS}
                for impl in IMPLS:
                    try:
                        made[impl] = _make(impl, case, mode, torch, jax, jnp, torch_api, jax_api)
                    except Exception as e:  # one broken baseline must not hide the rest
                        times[impl] = f"error: {type(e).__name__}: {str(e)[:100]}"
                # Rounds over the implementations, each timed in turn: the
                # H100's clocks drift over a run by more than the gaps measured.
                for r in range(ROUNDS):
                    # Each round starts one implementation later: none is
                    # always timed right after the same other (the GPU's
                    # clocks after a heavy one).
                    order = list(made.items())
                    order = order[r % len(order) :] + order[: r % len(order)]
                    for impl, (fn, sync) in order:
                        if isinstance(times[impl], str):
                            continue
                        gluon = "off" if "gluon off" in impl else "auto"
                        flash.set_gluon_forward(gluon)
                        flash.set_gluon_backward(gluon)
                        if "jax" in impl:
                            # The binding's jitted op keeps its trace (and so
                            # its plan) per shape: trace again under this switch.
                            jax.clear_caches()
                        try:
                            times[impl].append(time_per_call(fn, sync, iters=10, reps=3, warmup=2))
                        except Exception as e:
                            times[impl] = f"error: {type(e).__name__}: {str(e)[:100]}"
                for impl in IMPLS:
                    row = {"case": name, "mode": mode, "impl": impl}
                    if isinstance(times[impl], str):
                        row["ms"] = times[impl]
                    else:
                        t = statistics.median(times[impl])
                        row["ms"] = f"{t * 1e3:.3f}"
                        row["TFLOP/s"] = f"{_flops(B, T, HQ, D, causal, mode) / t / 1e12:.0f}"
                        row["rounds ms"] = " ".join(f"{x * 1e3:.3f}" for x in times[impl])
                    rows.append(row)
                    print(row, flush=True)  # a cut run still reports
                    if progress is not None:
                        progress.update(1)
                del made
                torch.cuda.empty_cache()
    finally:
        flash.set_gluon_forward(modes_before[0])
        flash.set_gluon_backward(modes_before[1])
        _ratios(rows)
        save("flash", rows, {"device": torch.cuda.get_device_name(), "dtype": "bfloat16"})
        print(markdown_table(rows, ["case", "mode", "impl", "ms", "TFLOP/s", "vs cuDNN"]))
    return rows


def _ratios(rows):
    """Each row's speed against cuDNN in its own framework (SDPA's for
    PyTorch and FlashAttention-2, jax.nn's for JAX), same case and mode."""
    base = {}
    for r in rows:
        if r["impl"] in ("sdpa cudnn", "jax cudnn") and "TFLOP/s" in r:
            base[(r["case"], r["mode"], r["impl"].split()[0])] = float(r["TFLOP/s"])
    for r in rows:
        fw = "jax" if "jax" in r["impl"] else "sdpa"
        b = base.get((r["case"], r["mode"], fw))
        if b and "TFLOP/s" in r:
            r["vs cuDNN"] = f"{float(r['TFLOP/s']) / b:.2f}"


def count() -> int:
    return len(_cases()) * 2 * len(IMPLS)
