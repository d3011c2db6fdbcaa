"""A tuning aid (not part of ``nox -s bench``): the decode split kernel's
split targets and (BN, num_warps, num_stages) candidates on a few cases of
bench/decode.py, beside SDPA's cuDNN and flash back ends, timed both as
back-to-back eager calls and replayed from a CUDA graph (device time).
``python -m bench.probes.decode_sweep``."""

from __future__ import annotations

import sys

from bench.common import graph_time_per_call, time_per_call

CASES = ((1, 4096), (1, 16384), (1, 65536), (1, 131072), (16, 4096), (16, 65536), (64, 4096))
CONFIGS = ((128, 8, 3), (64, 4, 3), (128, 4, 2))
# Programs the split count aims for (decode._TARGET_PROGRAMS), with each config.
TARGETS = (132, 264, 528)


PAGED_CONFIGS = ((64, 4, 2), (64, 4, 3), (64, 8, 3), (32, 4, 3))


def main(argv):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import torch_api
    from core_triton.attention import decode

    if "paged" in argv:
        for B, S in CASES:
            _paged_case(B, S, torch, torch_api, decode)
        return
    for B, S in CASES:
        _case(B, S, torch, torch_api, decode, SDPBackend, sdpa_kernel)


def _paged_case(B, S, torch, torch_api, decode, page=64):
    """Paged caches (64-token pages in shuffled order): each paged config,
    graph-replayed, beside the contiguous default."""
    q = torch.randn(B, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, S, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    order = torch.randperm(B * (S // page), device="cuda").view(B, -1).to(torch.int32)
    kp, vp = (
        torch.empty(B * (S // page), page, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)
    )
    kp[order.flatten().long()] = k.view(-1, page, 8, 128)
    vp[order.flatten().long()] = v.view(-1, page, 8, 128)
    contiguous = graph_time_per_call(torch, lambda: torch_api.decode_attention(q, k, v, lens))
    line = [f"paged B{B} S{S} (graph us): contiguous {contiguous * 1e6:.1f}"]
    default = (decode.PAGED_CONFIG, decode.PAGED_SPLIT_CONFIG)
    for config in PAGED_CONFIGS:
        decode.set_config(config, paged=True)
        decode.set_config(config, paged=True, split=True)
        t = graph_time_per_call(torch, lambda: torch_api.decode_attention(q, kp, vp, lens, order))
        line.append(f"{config} {t * 1e6:.1f}")
    decode.set_config(default[0], paged=True)
    decode.set_config(default[1], paged=True, split=True)
    print(" | ".join(line), flush=True)


def _case(B, S, torch, torch_api, decode, SDPBackend, sdpa_kernel):
    sync = lambda _: torch.cuda.synchronize()  # noqa: E731
    q = torch.randn(B, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, S, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))

    def sdpa(backend):
        def f():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)

        return f

    def both(fn):
        return f"{time_per_call(fn, sync, iters=20) * 1e6:.1f}/{graph_time_per_call(torch, fn) * 1e6:.1f}"

    line = [f"B{B} S{S} (eager/graph us): cudnn {both(sdpa(SDPBackend.CUDNN_ATTENTION))}"]
    line.append(f"flash {both(sdpa(SDPBackend.FLASH_ATTENTION))}")
    default = (decode._TARGET_PROGRAMS, decode.CONFIG, decode.SPLIT_CONFIG)
    line.append(f"default {both(lambda: torch_api.decode_attention(q, k, v, lens))}")
    for target in TARGETS:
        decode._TARGET_PROGRAMS = target
        for config in CONFIGS:
            decode.set_config(config)
            decode.set_config(config, split=True)
            line.append(f"{target}/{config} {both(lambda: torch_api.decode_attention(q, k, v, lens))}")
    decode._TARGET_PROGRAMS = default[0]
    decode.set_config(default[1])
    decode.set_config(default[2], split=True)
    line.append("kernels " + _kernel_times(torch, lambda: torch_api.decode_attention(q, k, v, lens)))
    line.append("cudnn kernels " + _kernel_times(torch, sdpa(SDPBackend.CUDNN_ATTENTION)))
    print(" | ".join(line), flush=True)


def _kernel_times(torch, fn, n=20):
    """Each device kernel's mean microseconds per call (profiler)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            per[e.name[:40]] = per.get(e.name[:40], 0.0) + e.device_time / n
    return ", ".join(f"{k}: {v:.1f}" for k, v in per.items())


if __name__ == "__main__":
    main(sys.argv[1:])
