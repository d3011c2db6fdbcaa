"""Issue 31's probe (not part of ``nox -s bench``): the warp-specialised
flash forward (core_triton.attention.flash_fwd_ws) on the GPU.

1. Each candidate config (``WS_CANDIDATES``) against a float32 reference
   (SDPA's memory-efficient back end on float32 copies), several shapes
   with partial blocks, causal and not: rms error relative to the
   reference, NaN count.
2. Forward times of each candidate beside today's kernel (``ws off``) and
   cuDNN (SDPA), then forward+backward for the default config.
3. The JAX binding (through jax_api._compiled, the kernel needs global
   scratch): its output against the PyTorch binding's (the same binary,
   so equal bit for bit), forward and forward+backward times.
4. ``bound``: the design's bound, a warp-specialised kernel with no mask
   and no lse (right only where every key block is whole, non-causal),
   beside ours at B4 T8k and B16 T2k, head dim 128.

``python -m bench.probes.flash_ws [correct] [time] [jax] [bound]`` (the
first three by default); ``TWINKERNELS_BENCH_DIR`` gets ``flash_ws.json``."""

# ruff: noqa: B023  (closures are called inside the iteration that made them)
from __future__ import annotations

import json
import os
import sys

CANDIDATES = [(128, 128, 4, 2), (128, 64, 4, 2), (128, 64, 4, 3), (128, 128, 4, 3), (128, 128, 8, 2)]
CHECK_SHAPES = [  # B, Tq, Tk, HQ, H
    (1, 1000, 1000, 8, 2),
    (2, 2047, 2049, 4, 4),
    (1, 70, 37, 2, 1),
    (1, 4096, 4096, 32, 4),
]
BENCH_SHAPES = [  # name, B, T, HQ, H, D
    ("B4 T8k D128", 4, 8192, 16, 16, 128),
    ("B4 T8k D64", 4, 8192, 16, 16, 64),
    ("B16 T2k D128", 16, 2048, 16, 16, 128),
    ("B16 T2k D64", 16, 2048, 16, 16, 64),
    ("llama B1 T4k 32:4 D64", 1, 4096, 32, 4, 64),
]


def _rand(torch, shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)


def _inputs(torch, B, Tq, Tk, HQ, H, D, seed=0):
    return (
        _rand(torch, (B, Tq, HQ, D), seed),
        _rand(torch, (B, Tk, H, D), seed + 1),
        _rand(torch, (B, Tk, H, D), seed + 2),
    )


def _reference(torch, q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rep = q.shape[2] // k.shape[2]
    qt = q.float().transpose(1, 2)
    kt = k.float().repeat_interleave(rep, 2).transpose(1, 2)
    vt = v.float().repeat_interleave(rep, 2).transpose(1, 2)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return out.transpose(1, 2)


def _err(torch, out, ref):
    diff = (out.float() - ref).pow(2).mean().sqrt()
    return float(diff / ref.pow(2).mean().sqrt()), int(torch.isnan(out).sum())


def _ms(fn):
    import triton

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def _flops(B, T, HQ, D, causal, mode):
    f = 4 * B * HQ * T * T * D * (0.5 if causal else 1.0)
    return f * (3.5 if mode == "fwd+bwd" else 1.0)


def correct(torch, torch_api, flash, results):
    for D in (64, 128):
        for cfg in CANDIDATES:
            flash.set_ws_forward("on", {D: cfg})
            for B, Tq, Tk, HQ, H in CHECK_SHAPES:
                for causal in (False, True):
                    q, k, v = _inputs(torch, B, Tq, Tk, HQ, H, D)
                    row = {
                        "part": "correct",
                        "D": D,
                        "cfg": cfg,
                        "shape": (B, Tq, Tk, HQ, H),
                        "causal": causal,
                    }
                    try:
                        out = torch_api.flash_attention(q, k, v, causal=causal)
                        row["err"], row["nan"] = _err(torch, out, _reference(torch, q, k, v, causal))
                    except Exception as e:
                        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    print(row, flush=True)
                    results.append(row)
    flash.set_ws_forward("auto")


def timing(torch, torch_api, flash, results):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, B, T, HQ, H, D in BENCH_SHAPES:
        q, k, v = _inputs(torch, B, T, T, HQ, H, D)
        do = torch.randn_like(q)
        for causal in (False, True):
            variants = (
                [("ws off", "off", None)]
                + [(f"ws {c}", "on", c) for c in CANDIDATES]
                + [("cudnn", None, None)]
            )
            for label, mode, cfg in variants:
                row = {"part": "time", "case": name, "causal": causal, "impl": label}
                try:
                    if mode is None:
                        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

                        def fwd(a=qt, b=kt, c=vt):
                            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                                return torch.nn.functional.scaled_dot_product_attention(
                                    a, b, c, is_causal=causal, enable_gqa=HQ != H
                                )

                        leaves = [x.detach().requires_grad_(True) for x in (qt, kt, vt)]
                        dout = do.transpose(1, 2)
                    else:
                        flash.set_ws_forward(mode, None if cfg is None else {D: cfg})

                        def fwd(a=q, b=k, c=v):
                            return torch_api.flash_attention(a, b, c, causal=causal)

                        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
                        dout = do
                    t = _ms(fwd)
                    row["fwd ms"] = round(t, 4)
                    row["fwd TF/s"] = round(_flops(B, T, HQ, D, causal, "fwd") / t / 1e9)
                    if cfg in (None, CANDIDATES[0]):
                        t2 = _ms(lambda: torch.autograd.grad(fwd(*leaves), leaves, dout))
                        row["fwd+bwd ms"] = round(t2, 4)
                        row["fwd+bwd TF/s"] = round(_flops(B, T, HQ, D, causal, "fwd+bwd") / t2 / 1e9)
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                print(row, flush=True)
                results.append(row)
                torch.cuda.empty_cache()
    flash.set_ws_forward("auto")


def jax_part(torch, torch_api, flash, results):
    import jax
    import jax.numpy as jnp

    import jax_api

    for name, B, T, HQ, H, D in BENCH_SHAPES:
        q, k, v = _inputs(torch, B, T, T, HQ, H, D)
        do = torch.randn_like(q)
        qj, kj, vj, doj = (jnp.from_dlpack(x) for x in (q, k, v, do))
        for causal in (False, True):
            for mode in ("auto", "off"):
                flash.set_ws_forward(mode)
                jax.clear_caches()
                row = {"part": "jax", "case": name, "causal": causal, "ws": mode}
                try:

                    def attn(a, b, c):
                        return jax_api.flash_attention(a, b, c, causal=causal)

                    f = jax.jit(attn)

                    def fb(a, b, c, d):
                        out, pull = jax.vjp(attn, a, b, c)
                        return out, pull(d)

                    g = jax.jit(fb)
                    out_j = f(qj, kj, vj)
                    out_t = torch_api.flash_attention(q, k, v, causal=causal)
                    same = torch.equal(torch.from_dlpack(out_j), out_t)
                    row["equal to torch"] = same
                    row["err vs ref"] = _err(
                        torch, torch.from_dlpack(out_j), _reference(torch, q, k, v, causal)
                    )[0]
                    t = _ms(lambda: jax.block_until_ready(f(qj, kj, vj)))
                    t2 = _ms(lambda: jax.block_until_ready(g(qj, kj, vj, doj)))
                    row["fwd ms"], row["fwd+bwd ms"] = round(t, 4), round(t2, 4)
                    row["fwd TF/s"] = round(_flops(B, T, HQ, D, causal, "fwd") / t / 1e9)
                except Exception as e:
                    import traceback

                    traceback.print_exc()
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                print(row, flush=True)
                results.append(row)
    flash.set_ws_forward("auto")


def _unmasked_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def unmasked(Q, K, V, scale, T, NR, OUT, H: tl.constexpr, D: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr):  # fmt: skip
        pid_m = tl.program_id(0)
        b = tl.program_id(1) // H
        h = tl.program_id(1) % H
        q_desc = tl.make_tensor_descriptor(Q, shape=[NR, H * D], strides=[H * D, 1], block_shape=[BM, D])
        k_desc = tl.make_tensor_descriptor(K, shape=[NR, H * D], strides=[H * D, 1], block_shape=[BN, D])
        v_desc = tl.make_tensor_descriptor(V, shape=[NR, H * D], strides=[H * D, 1], block_shape=[BN, D])
        q = q_desc.load([b * T + pid_m * BM, h * D])
        m_i = tl.zeros([BM], dtype=tl.float32) - float("inf")
        l_i = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, D], dtype=tl.float32)
        for start in tl.range(0, T, BN, warp_specialize=True):
            s = tl.dot(q, k_desc.load([b * T + start, h * D]).T) * (scale * 1.44269504)
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = v_desc.load([b * T + start, h * D])
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_new
        rows = (b.to(tl.int64) * T + pid_m * BM + tl.arange(0, BM)) * (H * D) + h * D
        out = (acc / l_i[:, None]).to(OUT.dtype.element_ty)
        tl.store(OUT + rows[:, None] + tl.arange(0, D)[None, :], out)

    return unmasked


def bound(torch, torch_api, flash, results):
    from torch_api._launch import _ensure_scratch_allocator

    kernel = _unmasked_kernel()
    _ensure_scratch_allocator()
    for B, T in ((4, 8192), (16, 2048)):
        H, D = 16, 128
        q, k, v = _inputs(torch, B, T, T, H, H, D)
        out = torch.empty_like(q)

        def unmasked():
            kernel[(T // 128, B * H)](q, k, v, D**-0.5, T, B * T, out, H=H, D=D, BM=128, BN=128,
                                      num_warps=4, num_stages=2)  # fmt: skip

        unmasked()
        err = _err(torch, out, torch_api.flash_attention(q, k, v).float())[0]
        for name, fn in (("unmasked bound", unmasked), ("ours", lambda: torch_api.flash_attention(q, k, v))):
            tf = [round(_flops(B, T, H, D, False, "fwd") / _ms(fn) / 1e9) for _ in range(3)]
            row = {"part": "bound", "B": B, "T": T, "impl": name, "fwd TF/s": tf, "err vs ours": err}
            print(row, flush=True)
            results.append(row)


def main(parts):
    import torch

    import torch_api
    from core_triton.attention import flash

    results = []
    out_dir = os.environ.get("TWINKERNELS_BENCH_DIR", "bench-results")
    os.makedirs(out_dir, exist_ok=True)
    try:
        for part in parts:
            parts_ = {"correct": correct, "time": timing, "jax": jax_part, "bound": bound}
            parts_[part](torch, torch_api, flash, results)
    finally:
        with open(os.path.join(out_dir, "flash_ws.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1:] or ["correct", "time", "jax"])
