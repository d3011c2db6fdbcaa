"""A profiling aid (not part of ``nox -s bench``): why an eager backward
costs more host time on autograd's device thread than on the calling
thread.  Times, with autograd's device thread on and off, the pieces of our
flash backward (each step wrapped in a timer, per thread) and small
``autograd.Function``s whose backward does only allocations, only Triton
launches, or only Python.  ``python -m bench.probes.thread_probe``.
"""

from __future__ import annotations

import collections
import functools
import sys
import threading
import time

from bench.probes.host_overhead import _rate

_TIMES: dict[tuple[str, str], list[float]] = collections.defaultdict(list)


def _timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*a, **k):
        start = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            where = "main" if threading.current_thread() is threading.main_thread() else "other"
            _TIMES[(name, where)].append(time.perf_counter() - start)

    return wrapper


def _report(title, calls):
    print(f"   {title}: per call, us (thread: main / other)")
    names = sorted({n for n, _ in _TIMES})
    for n in names:
        parts = []
        for where in ("main", "other"):
            t = _TIMES.get((n, where), [])
            parts.append(f"{sum(t) / calls * 1e6:7.1f} ({len(t) // max(calls, 1)}x)")
        print(f"     {n:40s} {parts[0]} / {parts[1]}")
    _TIMES.clear()


def main(argv):
    import importlib

    import torch
    import triton
    import triton.language as tl

    import torch_api
    from core_triton.common import launch as core_launch
    from torch_api import _launch, _library

    fa = importlib.import_module("torch_api.flash_attention")
    shape = (2, 512, 8, 64)
    x = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    do = torch.randn_like(x[0])

    def flash():
        return torch.autograd.grad(torch_api.flash_attention(*x, causal=True), x, do)

    # Wrap the backward's steps (module attributes looked up at call time).
    patches = [
        (fa, "_backward"),
        (fa, "launch"),
        (_launch, "_allocate"),
        (_launch, "launch_direct"),
        (core_launch._Replay, "run"),
        (core_launch, "_inspect"),
        (_library._Eager, "backward"),
        (_library._Eager, "forward"),
    ]
    saved = [(obj, name, obj.__dict__[name]) for obj, name in patches]
    for obj, name, fn in saved:
        if isinstance(fn, staticmethod):
            setattr(obj, name, staticmethod(_timed(name, fn.__func__)))
        else:
            setattr(obj, name, _timed(f"{getattr(obj, '__name__', '')}.{name}", fn))
    try:
        for threads in (True, False):
            with torch.autograd.set_multithreading_enabled(threads):
                host, _ = _rate(flash, torch, n=200)
                _TIMES.clear()
                host, _ = _rate(flash, torch, n=200)
            print(f"== flash causal fwd+bwd {shape}, device thread {threads}: host {host * 1e6:.0f} us/call")
            _report("timed steps", 201)
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)

    @triton.jit
    def copy_kernel(x, y, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y + i, tl.load(x + i, mask=i < n), mask=i < n)

    a = torch.randn(4096, device="cuda")
    b = torch.empty_like(a)

    def empties():
        for _ in range(4):
            torch.empty((2, 512, 8, 64), device="cuda", dtype=torch.bfloat16)

    def launches():
        for _ in range(3):
            copy_kernel[(4,)](a, b, 4096, BLOCK=1024)

    def python_only():
        s = 0
        for i in range(2000):
            s += i
        return s

    def sleep_free():
        pass

    bodies = {
        "nothing": sleep_free,
        "4 torch.empty": empties,
        "3 triton launches": launches,
        "python loop": python_only,
    }
    for name, body in bodies.items():

        class F(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                return t.view_as(t)

            @staticmethod
            def backward(ctx, g, body=body):
                body()
                return g

        def step():
            return torch.autograd.grad(F.apply(x[0]), x[:1], do)

        bare, _ = _rate(body, torch, n=500)
        res = []
        for threads in (True, False):
            with torch.autograd.set_multithreading_enabled(threads):
                res.append(_rate(step, torch, n=500)[0])
        print(
            f"== Function whose backward runs {name}: body alone {bare * 1e6:.1f} us;"
            f" fwd+bwd device thread {res[0] * 1e6:.1f} us, calling thread {res[1] * 1e6:.1f} us"
        )
    # Does anything else hold the GIL? (threads Python knows of)
    print("== Python threads:", [t.name for t in threading.enumerate()])
    print("== switch interval:", sys.getswitchinterval())


if __name__ == "__main__":
    main(sys.argv[1:])
