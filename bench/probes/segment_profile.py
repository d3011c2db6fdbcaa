"""Kernel times of one-segment attention against plain (torch profiler),
causal B1 32 on 4 heads bf16: which launch costs what, forward and
forward+backward, beside the elapsed time a call (CUDA events, 20 calls
back to back); "(pair)": the persistent Gluon forward as a gated pair's
first launch (flash.set_gluon_ranged(False)), not alone.  Offline probe."""

import contextlib

import torch
from torch.profiler import ProfilerActivity, profile

import torch_api


def _elapsed(step, n=20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / n


def kernel_times(step, calls=5):
    """``[(kernel name, us)]`` of one ``step()`` in launch order, each the
    mean over ``calls`` profiled calls after three warm-up ones (the
    profiler's own averages would merge a gated pair's two launches of
    one kernel)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per = len(kernels) // calls
    return [
        (e.name[:32], round(sum(x.device_time for x in kernels[i::per]) / calls, 1))
        for i, e in enumerate(kernels[:per])
    ]


def _report(label, step):
    """The elapsed time a call (best of 5 x 20 calls) and its kernels."""
    times = kernel_times(step)
    us = min(_elapsed(step) for _ in range(5))
    print(f"{label}: {us:.1f}us a call;", ", ".join(f"{n} {t}us" for n, t in times), flush=True)


@contextlib.contextmanager
def _paired(on: bool):
    """Segment ids as gated pairs (``on``) or through the persistent Gluon
    forward alone, then as before."""
    from core_triton.attention import flash, flash_tma_plans

    before = flash_tma_plans.GLUON_RANGED
    flash.set_gluon_ranged(before and not on)
    try:
        yield
    finally:
        flash.set_gluon_ranged(before)


def main():
    import sys

    if sys.argv[1:] == ["docs"]:
        return docs()
    for T, D in ((4096, 64), (4096, 128), (16384, 64)):
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(1, T, 32, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(1, T, 4, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        ids = torch.zeros(1, T, dtype=torch.int32, device="cuda")
        cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
        leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
        do = torch.randn_like(q)
        for backward in (False, True):
            for name, kw in (
                ("plain", {}),
                ("segment ids", {"q_segment_ids": ids}),
                ("segment ids, new each call", {"q_segment_ids": None}),
                ("segment ids, new each call (pair)", {"q_segment_ids": None}),
                ("cu_seqlens", {"cu_seqlens": cu}),
            ):

                def step(leaves=leaves, kw=kw, do=do, backward=backward, ids=ids):
                    if "q_segment_ids" in kw and kw["q_segment_ids"] is None:
                        # A new tensor: its ranges are made again (a model's next step).
                        kw = {"q_segment_ids": ids.clone()}
                    if not backward:
                        with torch.no_grad():
                            torch_api.flash_attention(*leaves, causal=True, **kw)
                        return
                    out = torch_api.flash_attention(*leaves, causal=True, **kw)
                    torch.autograd.grad(out, leaves, do)

                with _paired(name.endswith("(pair)")):
                    _report(f"T={T} D={D} {'fwd+bwd' if backward else 'fwd'} {name}", step)


def docs():
    """Forward kernel times of packed documents (``docs``: 4, 64 equal ones)."""
    for T, D, n in ((4096, 128, 4), (4096, 128, 64), (4096, 64, 64), (16384, 128, 64)):
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(1, T, 32, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(1, T, 4, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        ids = (torch.arange(T, device="cuda", dtype=torch.int32) // (T // n))[None]
        cu = torch.arange(0, T + 1, T // n, dtype=torch.int32, device="cuda")
        inputs = {
            "plain": {},
            "segment ids": {"q_segment_ids": ids},
            "segment ids (pair)": {"q_segment_ids": ids},
            "cu_seqlens": {"cu_seqlens": cu},
            "cu_seqlens (pair)": {"cu_seqlens": cu},
        }
        for name, kw in inputs.items():

            def step(kw=kw, qkv=(q, k, v)):
                torch_api.flash_attention(*qkv, causal=True, **kw)

            with _paired(name.endswith("(pair)")):
                _report(f"T={T} D={D} docs={n} fwd {name}", step)


if __name__ == "__main__":
    main()
