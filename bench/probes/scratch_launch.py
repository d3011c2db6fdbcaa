"""The torch binding's launches of kernels with global scratch (the Gluon
kernels, flash_fwd_ws): Triton's own launcher (the route before the direct
route took them) against the direct route, in one process, alternating.
B1, 32 query heads on 4, head dim 128, causal, bf16; eight calls chained
as a model's layers, forward and forward+backward; elapsed ms (CUDA
events, best of 5 rounds of 10 steps) and host ms a step (the time to
queue it).  Offline probe: ``python -m bench.probes.scratch_launch``;
``... profile``: where the host time of the 64-document step goes
(cProfile, direct route, backward on the calling thread)."""

import cProfile
import io
import pstats
import sys
import time

import torch

import torch_api
from core_triton.common import launch as core_launch
from torch_api import _launch

LAYERS = 8


def _route(name):
    """Set the launch route: "triton" gives kernels with global scratch no
    replay of their own (Triton's launcher each call, as before), "direct"
    the replay through the C entry with the scratch allocated here."""
    core_launch._replays.clear()
    _launch._fast.clear()
    if name == "triton":
        core_launch._JIT_TYPES = ("JITFunction",)
        real = _ROUTES["entry"]

        def no_scratch(compiled):
            entry = real(compiled)
            return core_launch.DirectEntry() if entry.scratch_size else entry

        core_launch._direct_entry = no_scratch
    else:
        core_launch._JIT_TYPES = _ROUTES["types"]
        core_launch._direct_entry = _ROUTES["entry"]


_ROUTES = {"types": core_launch._JIT_TYPES, "entry": core_launch._direct_entry}


def _step(q, k, v, do, kw, backward):
    leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]
    x = leaves[0]
    for _ in range(LAYERS):
        x = torch_api.flash_attention(x, leaves[1], leaves[2], causal=True, **kw)
    if backward:
        torch.autograd.grad(x, leaves, do)


def _time(fn, rounds=5, n=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    best_wall = best_host = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        host = (time.perf_counter() - t0) / n
        end.record()
        torch.cuda.synchronize()
        best_wall = min(best_wall, start.elapsed_time(end) / n)
        best_host = min(best_host, host * 1e3)
    return best_wall, best_host


def main():
    for T, n in ((4096, 1), (4096, 4), (4096, 64), (16384, 64)):
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(1, T, 32, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(1, T, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        do = torch.randn_like(q)
        ids = (torch.arange(T, device="cuda", dtype=torch.int32) // (T // n))[None]
        cu = torch.arange(0, T + 1, T // n, dtype=torch.int32, device="cuda")
        inputs = {"segment ids": {"q_segment_ids": ids}, "cu_seqlens": {"cu_seqlens": cu}}
        if n == 1:
            inputs = {"plain": {}, "segment ids": {"q_segment_ids": ids}}
        for name, kw in inputs.items():
            for backward in (False, True):
                got = {}
                for route in ("triton", "direct", "triton", "direct"):
                    _route(route)
                    t = _time(lambda a=(q, k, v, do, kw, backward): _step(*a))
                    old = got.get(route, (float("inf"), float("inf")))
                    got[route] = (min(old[0], t[0]), min(old[1], t[1]))
                label = f"T{T // 1024}k docs={n} {name} {'fwd+bwd' if backward else 'fwd'}"
                (tw, th), (dw, dh) = got["triton"], got["direct"]
                print(
                    f"{label}: triton launcher {tw:.3f} ms (host {th:.3f}) | direct {dw:.3f} ms "
                    f"(host {dh:.3f}) | ratio {dw / tw:.3f}",
                    flush=True,
                )


def profile():
    T, n = 4096, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, T, 32, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, T, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    do = torch.randn_like(q)
    ids = (torch.arange(T, device="cuda", dtype=torch.int32) // (T // n))[None]
    _route("direct")
    for backward in (False, True):
        with torch.autograd.set_multithreading_enabled(False):
            for _ in range(3):
                _step(q, k, v, do, {"q_segment_ids": ids}, backward)
            torch.cuda.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20):
                _step(q, k, v, do, {"q_segment_ids": ids}, backward)
            prof.disable()
            torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(28)
        print(f"== T4k 64 docs ids, {'fwd+bwd' if backward else 'fwd'}, 20 steps of {LAYERS} layers")
        print(out.getvalue(), flush=True)


if __name__ == "__main__":
    try:
        profile() if sys.argv[1:] == ["profile"] else main()
    finally:
        _route("direct")  # the launch route as the library has it
