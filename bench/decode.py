"""KV-cache decoding (issue 16): one new query per row, GQA 32/8, D128
bf16, batch 1/16/64, cache 4k to 128k (every row full), ours (both
bindings, contiguous and paged with 64-token pages in shuffled order)
against SDPA's flash, cuDNN and efficient back ends and JAX's cuDNN.
Reported as time and as a fraction of the copy bandwidth (the cache is
read once: ``2 * B * S * H * D * 2`` bytes).  Each PyTorch call is timed
twice: back-to-back eager calls (host launch cost included: at batch 1 and
short caches it is most of the time, for SDPA too) and replayed from a CUDA
graph, as inference servers run decoding steps (the device time).
``python -m bench decode``.
"""

from __future__ import annotations

import numpy as np

from bench.common import copy_bandwidth, graph_time_per_call, markdown_table, save, time_per_call

HQ, H, D, PAGE = 32, 8, 128, 64
BATCHES = (1, 16, 64)
CACHES = (4096, 16384, 65536, 131072)
MAX_BYTES = 24 << 30  # K and V together; larger cases are left out
IMPLS = (
    "ours (torch)",
    "ours paged (torch)",
    "ours (jax)",
    "sdpa flash",
    "sdpa cudnn",
    "sdpa efficient",
    "jax cudnn",
)


def _case(torch, torch_api, B, S):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, 1, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    per_row = S // PAGE
    order = torch.randperm(B * per_row, device="cuda", generator=g).view(B, per_row).to(torch.int32)
    kp = torch.empty(B * per_row, PAGE, H, D, device="cuda", dtype=torch.bfloat16)
    vp = torch.empty_like(kp)
    kp[order.flatten().long()] = k.view(B * per_row, PAGE, H, D)
    vp[order.flatten().long()] = v.view(B * per_row, PAGE, H, D)
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # SDPA is head-first

    def sdpa(backend):
        def f():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)

        return f

    fns = {
        "ours (torch)": lambda: torch_api.decode_attention(q, k, v, lens),
        "ours paged (torch)": lambda: torch_api.decode_attention(q, kp, vp, lens, order),
        "sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "sdpa cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
        "sdpa efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
    }
    return fns, (q, k, v, lens)


def _jax_fns(tensors):
    import jax
    import jax.numpy as jnp

    import jax_api

    q, k, v, lens = (jnp.from_dlpack(t) for t in tensors)
    ours = jax.jit(jax_api.decode_attention)
    cudnn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="cudnn"))
    return {"ours (jax)": lambda: ours(q, k, v, lens), "jax cudnn": lambda: cudnn(q, k, v)}


def run(progress=None) -> list[dict]:
    import jax
    import torch

    import torch_api

    bw = copy_bandwidth(torch)
    tsync = lambda _: torch.cuda.synchronize()  # noqa: E731
    rows = []
    for B in BATCHES:
        for S in CACHES:
            nbytes = 2 * B * S * H * D * 2
            if nbytes > MAX_BYTES:
                if progress is not None:
                    progress.update(len(IMPLS))
                continue
            fns, tensors = _case(torch, torch_api, B, S)
            fns.update(_jax_fns(tensors))
            for impl in IMPLS:
                row = {"B": B, "cache": S, "impl": impl}
                try:
                    sync = jax.block_until_ready if "jax" in impl else tsync
                    t = time_per_call(fns[impl], sync, iters=20)
                    row["us"] = f"{t * 1e6:.1f}"
                    row["of copy bw"] = f"{nbytes / t / 1e9 / bw:.2f}"
                    if "jax" not in impl:
                        g = graph_time_per_call(torch, fns[impl])
                        row["graph us"] = f"{g * 1e6:.1f}"
                        row["graph of copy bw"] = f"{nbytes / g / 1e9 / bw:.2f}"
                except Exception as e:  # a back end that refuses the case
                    row["us"] = f"error: {type(e).__name__}: {str(e)[:80]}"
                rows.append(row)
                print(row, flush=True)
                if progress is not None:
                    progress.update(1)
            del fns, tensors
            torch.cuda.empty_cache()
    _ratios(rows)
    save("decode", rows, {"device": torch.cuda.get_device_name(), "copy GB/s": bw, "HQ": HQ, "H": H, "D": D})
    print(f"copy bandwidth {bw:.0f} GB/s")
    columns = ["B", "cache", "impl", "us", "of copy bw", "vs best sdpa", "graph us", "graph of copy bw"]
    print(markdown_table(rows, [*columns, "graph vs best sdpa"]))
    return rows


def _ratios(rows):
    """Ours over the fastest SDPA back end of the same case (eager, and
    graph-replayed)."""
    for col, out in (("us", "vs best sdpa"), ("graph us", "graph vs best sdpa")):
        best = {}
        for r in rows:
            if r["impl"].startswith("sdpa"):
                try:
                    t = float(r.get(col, "nan"))
                except ValueError:
                    continue
                if t == t:
                    key = (r["B"], r["cache"])
                    best[key] = min(best.get(key, np.inf), t)
        for r in rows:
            key = (r["B"], r["cache"])
            if r["impl"].startswith("ours") and key in best and col in r:
                try:
                    r[out] = f"{best[key] / float(r[col]):.2f}x"
                except ValueError:
                    pass


def count() -> int:
    return len(BATCHES) * len(CACHES) * len(IMPLS)
