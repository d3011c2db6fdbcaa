"""Packed variable-length training (issue 16): 64 documents of random
lengths packed into 32k tokens, H16 D128 bf16, causal, forward and
forward+backward.  Ours with ``cu_seqlens`` (both bindings) and with
segment ids on the same packing (PyTorch), against SDPA's cuDNN back end
on the padded batch ``[64, max_len]`` (every document padded to the
longest).  TFLOP/s count the useful work, ``sum(len^2)`` causal, for every
implementation, so the figures compare times.  ``python -m bench varlen``.
"""

from __future__ import annotations

import numpy as np

from bench.common import markdown_table, save, time_per_call

N_DOCS, TOTAL, H, D = 64, 32768, 16, 128
IMPLS = ("ours packed (torch)", "ours packed (jax)", "ours segment ids (torch)", "sdpa cudnn padded")


def lengths(seed=0):
    """``N_DOCS`` random positive lengths summing to ``TOTAL``."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, TOTAL), N_DOCS - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [TOTAL]]))


def _torch_cases(torch, torch_api, lens):
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    seg = torch.tensor(np.repeat(np.arange(N_DOCS), lens)[None], dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn(1, TOTAL, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4)
    )
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    packed = {"cu_seqlens": cu}
    segments = {"q_segment_ids": seg, "kv_segment_ids": seg}
    L = int(lens.max())
    pq, pk, pv, pdo = (torch.zeros(N_DOCS, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    start = 0
    for i, n in enumerate(lens):
        for dst, src in ((pq, q), (pk, k), (pv, v), (pdo, do)):
            dst[i, :, :n] = src[0, start : start + n].transpose(0, 1)
        start += n
    pleaves = [x.detach().requires_grad_(True) for x in (pq, pk, pv)]

    def sdpa(x):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(*x, is_causal=True)

    def ours(kw):
        return (
            lambda: torch_api.flash_attention(q, k, v, causal=True, **kw),
            lambda: torch.autograd.grad(torch_api.flash_attention(*leaves, causal=True, **kw), leaves, do),
        )

    return {
        "ours packed (torch)": ours(packed),
        "ours segment ids (torch)": ours(segments),
        "sdpa cudnn padded": (
            lambda: sdpa((pq, pk, pv)),
            lambda: torch.autograd.grad(sdpa(pleaves), pleaves, pdo),
        ),
    }, (q, k, v, do, cu)


def _jax_case(tensors):
    import jax
    import jax.numpy as jnp

    import jax_api

    q, k, v, do, cu = (jnp.from_dlpack(t) for t in tensors)
    fwd = jax.jit(lambda q, k, v, cu: jax_api.flash_attention(q, k, v, causal=True, cu_seqlens=cu))
    vjp = jax.jit(lambda q, k, v, do, cu: jax.vjp(lambda *x: fwd(*x, cu), q, k, v)[1](do))
    return lambda: fwd(q, k, v, cu), lambda: vjp(q, k, v, do, cu), jax.block_until_ready


def run(progress=None) -> list[dict]:
    import torch

    import torch_api

    lens = lengths()
    flops = 4 * H * D * float((lens.astype(np.float64) ** 2).sum()) / 2  # causal
    cases, tensors = _torch_cases(torch, torch_api, lens)
    tsync = lambda _: torch.cuda.synchronize()  # noqa: E731
    rows = []
    for impl in IMPLS:
        row = {"impl": impl}
        try:
            if impl.endswith("(jax)"):
                f, fb, block = _jax_case(tensors)
                sync = block
            else:
                f, fb = cases[impl]
                sync = tsync
            t_f = time_per_call(f, sync, iters=10)
            t_fb = time_per_call(fb, sync, iters=5)
            row.update(
                {
                    "fwd ms": f"{t_f * 1e3:.3f}",
                    "fwd+bwd ms": f"{t_fb * 1e3:.3f}",
                    "fwd TFLOP/s": f"{flops / t_f / 1e12:.1f}",
                    "fwd+bwd TFLOP/s": f"{3.5 * flops / t_fb / 1e12:.1f}",
                }
            )
        except Exception as e:  # one failing implementation must not hide the rest
            row["fwd ms"] = f"error: {type(e).__name__}: {str(e)[:100]}"
        rows.append(row)
        print(row, flush=True)
        if progress is not None:
            progress.update(1)
    base = next((r for r in rows if r["impl"] == "sdpa cudnn padded" and "fwd+bwd ms" in r), None)
    for r in rows:
        if base is not None and "fwd+bwd ms" in r:
            r["fwd vs padded cudnn"] = f"{float(base['fwd ms']) / float(r['fwd ms']):.2f}x"
            r["fwd+bwd vs padded cudnn"] = f"{float(base['fwd+bwd ms']) / float(r['fwd+bwd ms']):.2f}x"
    meta = {"device": torch.cuda.get_device_name(), "lengths": lens.tolist(), "max_len": int(lens.max())}
    save("varlen", rows, meta)
    cols = ["impl", "fwd ms", "fwd+bwd ms", "fwd TFLOP/s", "fwd+bwd TFLOP/s", "fwd vs padded cudnn"]
    print(markdown_table(rows, [*cols, "fwd+bwd vs padded cudnn"]))
    return rows


def count() -> int:
    return len(IMPLS)
