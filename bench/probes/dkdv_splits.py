"""A tuning aid (not part of ``nox -s bench``): the dK/dV kernel's
query-head group split among 1, 2, 4 or 8 programs a key block
(``flash.set_dkdv_splits``; "rule": the plan's own choice) at grouped-query
shapes of one sequence (B1, 32 query heads on 4 KV heads, causal, bf16), in
PyTorch: the autotuner's timing of each dK/dV config, then forward+backward
and the backward alone in ms (``triton.testing.do_bench``), beside SDPA's
cuDNN.  ``python -m bench.probes.dkdv_splits [D:T ...]`` (64:4096 64:16384
128:4096).  ``python -m bench.probes.dkdv_splits docs``: B1 T4k D64 with
segment ids of 1 and 4 documents and ``cu_seqlens`` of 4, splits 1 and 8,
forward+backward ms and each kernel's time (torch profiler)."""

from __future__ import annotations

import sys

from bench.probes.flash_configs import _timings


def _case(torch, torch_api, D, T, causal=True):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, T, h, D, device="cuda", dtype=torch.bfloat16, generator=g) for h in (32, 4, 4))
    do = torch.randn_like(q)
    leaves = [x.requires_grad_() for x in (q, k, v)]

    def fwd_bwd():
        out = torch_api.flash_attention(*leaves, causal=causal)
        return torch.autograd.grad(out, leaves, do)

    out = torch_api.flash_attention(*leaves, causal=causal)

    def bwd():
        return torch.autograd.grad(out, leaves, do, retain_graph=True)

    return fwd_bwd, bwd, leaves, do


def _docs(torch, torch_api, core, triton):
    from torch.profiler import ProfilerActivity, profile

    T, D = 4096, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, T, h, D, device="cuda", dtype=torch.bfloat16, generator=g) for h in (32, 4, 4))
    do = torch.randn_like(q)
    leaves = [x.requires_grad_() for x in (q, k, v)]
    for docs in (1, 4):
        ids = torch.arange(T, device="cuda", dtype=torch.int32)[None] * docs // T
        cu = torch.arange(0, T + 1, T // docs, device="cuda", dtype=torch.int32)
        for name, kw in (("segment ids", {"q_segment_ids": ids}), ("cu_seqlens", {"cu_seqlens": cu})):
            for splits in (1, 8):
                core.set_dkdv_splits(splits)

                def step(kw=kw):
                    return torch.autograd.grad(
                        torch_api.flash_attention(*leaves, causal=True, **kw), leaves, do
                    )

                t = triton.testing.do_bench(step, warmup=50, rep=300)
                print(f"RESULT docs {docs} {name} splits {splits}: fwd+bwd {t:.3f} ms", flush=True)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(10):
                        step()
                    torch.cuda.synchronize()
                for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
                    per_launch = e.device_time_total / e.count
                    print(f"   {e.key[:60]:60s} {per_launch:.1f} us x{e.count // 10} a step")
    core.set_dkdv_splits(None)


def main(argv):
    import torch
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import torch_api
    from core_triton.attention import flash as core
    from core_triton.attention import flash_configs

    if argv == ["docs"]:
        return _docs(torch, torch_api, core, triton)
    shapes = [tuple(int(x) for x in a.split(":")) for a in argv] or [(64, 4096), (64, 16384), (128, 4096)]
    for D, T in shapes:
        for splits in (None, 1, 2, 4, 8):
            core.set_dkdv_splits(splits)
            flash_configs.tuned_kernel(
                "dkdv", flash_configs.dim_class(D), flash_configs.length_class(T)
            ).cache.clear()
            fwd_bwd, bwd, leaves, do = _case(torch, torch_api, D, T)
            fwd_bwd()
            torch.cuda.synchronize()
            label = "rule" if splits is None else f"splits {splits}"
            print(f"D={D} T{T} {label} dkdv configs:", flush=True)
            tuned = flash_configs.tuned_kernel(
                "dkdv", flash_configs.dim_class(D), flash_configs.length_class(T)
            )
            print("\n".join(_timings(tuned)), flush=True)
            t_all = triton.testing.do_bench(fwd_bwd, warmup=50, rep=300)
            t_bwd = triton.testing.do_bench(bwd, warmup=50, rep=300)
            print(f"RESULT D={D} T{T} {label}: fwd+bwd {t_all:.3f} ms, bwd {t_bwd:.3f} ms", flush=True)
        core.set_dkdv_splits(None)
        q, k, v = (x.detach().transpose(1, 2).requires_grad_() for x in leaves)
        do_t = do.transpose(1, 2)

        def sdpa(q=q, k=k, v=v, do_t=do_t):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return torch.autograd.grad(o, (q, k, v), do_t)

        try:
            t = triton.testing.do_bench(sdpa, warmup=50, rep=300)
            print(f"RESULT D={D} T{T} sdpa cudnn: fwd+bwd {t:.3f} ms")
        except RuntimeError as e:  # cuDNN may refuse GQA in this torch
            print(f"RESULT D={D} T{T} sdpa cudnn: {str(e).splitlines()[0]}")


if __name__ == "__main__":
    main(sys.argv[1:])
