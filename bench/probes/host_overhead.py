"""A profiling aid (not part of ``nox -s bench``): where the host time of an
eager PyTorch call goes, at shapes small enough that the GPU waits for the
host.  Prints, per case, the host time per call when calls are queued back
to back, the wall time per call, the GPU time of one call alone (replayed
from a CUDA graph, so no host work), and the Python functions that took the
most time (cProfile, with autograd's backward on the calling thread so that
the profile sees it).  ``python -m bench.probes.host_overhead``.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time


def _rate(fn, torch, n=200, repeats=5):
    """``(host, wall)`` seconds per call of ``n`` back-to-back calls: the
    repeat with the least host time of ``repeats`` (one run on a shared
    host swung by 30-60%)."""
    fn()
    torch.cuda.synchronize()
    best = None
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        host = (time.perf_counter() - start) / n
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / n
        best = (host, wall) if best is None or host < best[0] else best
    return best


def _gpu(fn, torch):
    """GPU time of one call: captured once in a CUDA graph, then replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # capture wants the allocations warmed up off the main stream
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(50):
        graph.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / 50 / 1e3


def _profile(fn, lines=22):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def _cases(torch, torch_api, triton, tl):
    def rand(*shape, grad=False):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=grad)

    q, k, v = (rand(1, 1024, 16, 128, grad=True) for _ in range(3))

    def lightning_fwd():
        with torch.no_grad():
            return torch_api.lightning_attn(q, k, v, layer_idx=2, num_layers=8)

    def lightning_fwd_bwd():
        o, _ = torch_api.lightning_attn(q, k, v, layer_idx=2, num_layers=8)
        return torch.autograd.grad(o, [q, k, v], torch.ones_like(o))

    fq, fk, fv = (rand(4, 1024, 16, 128) for _ in range(3))

    def flash_fwd():
        return torch_api.flash_attention(fq, fk, fv)

    leaves = [x.detach().requires_grad_(True) for x in (fq, fk, fv)]
    fdo = torch.randn_like(fq)

    def flash_fwd_bwd():
        return torch.autograd.grad(torch_api.flash_attention(*leaves), leaves, fdo)

    @triton.jit
    def copy_kernel(x, y, n, s0, s1, s2, s3, s4, s5, s6, s7, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + i, tl.load(x + i, mask=i < n), mask=i < n)

    x = torch.randn(4096, device="cuda")
    y = torch.empty_like(x)

    def bare_launch():
        copy_kernel[(4,)](x, y, 4096, 1, 2, 3, 4, 5, 6, 7, 8, BLOCK=1024)

    class Identity(torch.autograd.Function):
        """Nothing but a Python backward: what autograd's hand-over to its
        device thread and back costs this host, whatever the op."""

        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g

    def python_function_fwd_bwd():
        return torch.autograd.grad(Identity.apply(leaves[0]), leaves[:1], fdo)

    def sdpa_fwd_bwd():
        q, k, v = (t.transpose(1, 2) for t in leaves)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2)
        return torch.autograd.grad(out, leaves, fdo)

    # The shape: B2 T512 H8 D64 causal, where SDPA's eager call is
    # bound by the host.
    small = [rand(2, 512, 8, 64, grad=True) for _ in range(3)]
    sdo = torch.randn_like(small[0])
    sg = (-torch.nn.functional.softplus(torch.randn(2, 512, 8, device="cuda"))).requires_grad_(True)

    def flash_small():
        return torch.autograd.grad(torch_api.flash_attention(*small, causal=True), small, sdo)

    def sdpa_small():
        q, k, v = (t.transpose(1, 2) for t in small)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
        return torch.autograd.grad(out, small, sdo)

    def chunk_small():
        out = torch_api.chunk_linear_attn(*small, g=sg)[0]
        return torch.autograd.grad(out, [*small, sg], sdo)

    def lightning_small():
        out = torch_api.lightning_attn(*small, layer_idx=2, num_layers=8)[0]
        return torch.autograd.grad(out, small, sdo)

    # A Llama 1B layer's heads (32 query heads on 4, D64, causal) at a
    # length where the host is the bound: what one layer's attention costs
    # the host in a transformers training step (issue 28), plain, with one
    # segment of ids (the same tensor each call: its ranges are reused, as
    # by a model's layers) and SDPA.
    lq = rand(1, 256, 32, 64, grad=True)
    lk, lv = (rand(1, 256, 4, 64, grad=True) for _ in range(2))
    ldo = torch.randn_like(lq)
    lids = torch.zeros(1, 256, dtype=torch.int32, device="cuda")

    def llama_flash(**kw):
        out = torch_api.flash_attention(lq, lk, lv, causal=True, **kw)
        return torch.autograd.grad(out, [lq, lk, lv], ldo)

    def llama_sdpa():
        q, k, v = (t.transpose(1, 2) for t in (lq, lk, lv))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return torch.autograd.grad(out.transpose(1, 2), [lq, lk, lv], ldo)

    return {
        "sdpa llama-heads causal fwd+bwd 1x256": llama_sdpa,
        "torch flash llama-heads causal fwd+bwd 1x256": llama_flash,
        "torch flash llama-heads one segment fwd+bwd 1x256": lambda: llama_flash(q_segment_ids=lids),
        "sdpa causal fwd+bwd 2x512x8x64": sdpa_small,
        "torch flash causal fwd+bwd 2x512x8x64": flash_small,
        "torch chunk g fwd+bwd 2x512x8x64": chunk_small,
        "torch lightning fwd+bwd 2x512x8x64": lightning_small,
        "empty autograd.Function fwd+bwd": python_function_fwd_bwd,
        "sdpa fwd+bwd 4x1024": sdpa_fwd_bwd,
        "bare triton launch (12 args)": bare_launch,
        "torch lightning fwd 1x1024": lightning_fwd,
        "torch lightning fwd+bwd 1x1024": lightning_fwd_bwd,
        "torch flash fwd 4x1024": flash_fwd,
        "torch flash fwd+bwd 4x1024": flash_fwd_bwd,
    }


def launch_routes(torch, torch_api):
    """Host time of one replayed launch of the flash forward's plan (a tiny
    case, so the GPU keeps up), by route: Triton's binder, Triton's runner
    for the compiled kernel, the compiled launcher's C entry, and what the
    binding does (core_triton.common.launch)."""
    import importlib

    from core_triton.common import launch as core_launch
    from torch_api import _launch

    fa = importlib.import_module("torch_api.flash_attention")  # the module, not the function

    q, k, v = (torch.randn(1, 64, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    a = {p.name: None for p in fa.OP_PARAMS}
    a.update(query=q, key=k, value=v, causal=True)
    plans, inputs = fa.prepare(a)
    (plan,) = plans.forward
    core_launch._replays.clear()
    out = _launch.launch(plan, inputs)
    replay = core_launch._replays[id(plan)][1]
    args = [*plan.arguments(inputs), *out]
    grid = plan.grid if not callable(plan.grid) else replay.grid
    stream = lambda: torch._C._cuda_getCurrentRawStream(q.device.index)  # noqa: E731
    routes = {
        "triton binder (kernel[grid](...))": lambda: plan.kernel[grid](*args, **plan.launch_options()),
        "triton runner (compiled[grid])": lambda: replay.runner(*args, *replay.tail),
        "binding replay (launch_direct)": lambda: core_launch.launch_direct(plan, inputs, out, stream),
        "binding launch (torch_api._launch.launch)": lambda: _launch.launch(plan, inputs),
    }
    if replay.direct is not None:
        ptrs = [t.data_ptr() if hasattr(t, "data_ptr") else t for t in args]
        head = (*replay.grid, stream(), *replay.head)
        routes["C entry alone"] = lambda: replay.direct(
            *head, replay.global_scratch(head[3]), *replay.post, *ptrs, *replay.tail
        )
    print(f"== one launch of the flash forward plan ({len(args)} arguments); C entry: {replay.direct}")
    for name, fn in routes.items():
        host, wall = _rate(fn, torch, n=2000)
        print(f"   {name}: host {host * 1e6:.1f} us/launch, wall {wall * 1e6:.1f}")


def _python_speed():
    """Seconds for a fixed pure-Python workload: compares this host's
    interpreter speed with another machine's (the same line runs anywhere)."""
    start = time.perf_counter()
    d = {}
    for i in range(200_000):
        d[i % 97] = (i, str(i))
    return time.perf_counter() - start


def _torch_profile(torch, fn, rows=30):
    """torch.profiler's per-op host time (aten ops, CUDA runtime and driver
    calls), backward on the calling thread."""
    from torch.profiler import ProfilerActivity, profile

    with torch.autograd.set_multithreading_enabled(False):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main(argv):
    import torch
    import triton
    import triton.language as tl

    import torch_api
    from torch_api import _launch

    print(f"== pure-Python workload: {_python_speed() * 1e3:.1f} ms (compare across hosts)")
    cases = _cases(torch, torch_api, triton, tl)
    for name in ("sdpa causal fwd+bwd 2x512x8x64", "torch flash causal fwd+bwd 2x512x8x64"):
        print(f"== torch.profiler, {name} (20 calls)")
        print(_torch_profile(torch, cases[name]), flush=True)
    try:
        launch_routes(torch, torch_api)
    except Exception as e:  # a stale route must not hide the cases below
        print(f"== launch routes failed: {type(e).__name__}: {e}")
    real = _launch.launch_direct
    for name, fn in cases.items():
        host, wall = _rate(fn, torch)
        gpu = _gpu(fn, torch)
        print(
            f"== {name}: host {host * 1e6:.0f} us/call, wall {wall * 1e6:.0f} us/call,"
            f" gpu alone (CUDA graph) {gpu * 1e6:.0f} us/call"
        )
        if "bare" in name or "sdpa" in name or "empty" in name:
            with torch.autograd.set_multithreading_enabled(False):
                one_thread, _ = _rate(fn, torch)
            print(f"   backward on the calling thread: host {one_thread * 1e6:.0f} us/call")
            continue
        # The same call with every kernel launch skipped: what our Python,
        # the allocations and autograd cost without Triton's launcher (the
        # fast path's launches, which call the launcher's C entry
        # themselves, skipped too).
        _launch.launch_direct = lambda plan, inputs, outputs, stream=None: None
        entries = {f: f.call for f in _launch._fast.values()}
        for f in entries:
            f.call = lambda *args: None
        try:
            bare, _ = _rate(fn, torch)
        finally:
            _launch.launch_direct = real
            for f, call in entries.items():
                f.call = call
        print(f"   without the Triton launches: host {bare * 1e6:.0f} us/call")
        # Autograd runs a CUDA backward on its device thread, out of
        # cProfile's sight; on the calling thread the profile shows it, and
        # the time shows what the hand-over between threads costs.
        with torch.autograd.set_multithreading_enabled(False):
            one_thread, _ = _rate(fn, torch)
            print(f"   backward on the calling thread: host {one_thread * 1e6:.0f} us/call")
            print(_profile(fn), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
