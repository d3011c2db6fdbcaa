"""Where an eager PyTorch flash call's host time goes, piece by piece, at
sizes where the GPU keeps up (B1 T1024, 32 query heads on 4, causal, bf16,
eight documents of segment ids; head dims 64 and 128): the whole call with
and without autograd, the op's forward alone (no autograd.Function),
``prepare`` (plans and index inputs), and for each launch of the forward:
the binding's launch, its fast path with the C entry stubbed (checks and
allocations), the allocations alone, and the C entry alone.  Host us a
call, the best of 5 rounds of 2000 calls.  Offline probe:
``python -m bench.probes.launch_host``."""

import importlib
import time

import torch

import torch_api
from torch_api import _launch

fa = importlib.import_module("torch_api.flash_attention")  # the module, not the function


def _host(fn, n=2000, rounds=5):
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
        torch.cuda.synchronize()
    return best * 1e6


def _captured(q, k, v, ids):
    """The op's argument dict and each forward launch's (plan, inputs) of one call."""
    seen, launches = {}, []
    real_prepare, real_launch = fa.prepare, fa.launch

    def prepare(a):
        seen["a"] = dict(a)
        return real_prepare(a)

    def launch(plan, inputs):
        launches.append((plan, dict(inputs)))
        return real_launch(plan, inputs)

    fa.prepare, fa.launch = prepare, launch
    try:
        torch_api.flash_attention(q, k, v, causal=True, q_segment_ids=ids)
    finally:
        fa.prepare, fa.launch = real_prepare, real_launch
    return seen["a"], launches


def _case(D):
    """``{label: fn}`` of head dim ``D``."""
    g = torch.Generator(device="cuda").manual_seed(0)
    T = 1024  # the Gluon forward takes head dim 128 from 1024 on
    q = torch.randn(1, T, 32, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, T, 4, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    ids = (torch.arange(T, device="cuda", dtype=torch.int32) // (T // 8))[None]
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    for _ in range(3):
        torch_api.flash_attention(*leaves, causal=True, q_segment_ids=ids)
    a, launches = _captured(*leaves, ids)
    rows = {
        "call (autograd)": lambda: torch_api.flash_attention(*leaves, causal=True, q_segment_ids=ids),
        "call (no grad)": lambda: torch_api.flash_attention(q, k, v, causal=True, q_segment_ids=ids),
        "op forward alone": lambda: fa._forward(a),
        "prepare": lambda: fa.prepare(a),
    }
    for i, (plan, inputs) in enumerate(launches):
        name = getattr(plan.kernel, "__name__", None) or type(plan.kernel).__name__
        name = getattr(getattr(plan.kernel, "fn", None), "__name__", name)
        fast = _launch._fast.get(id(plan))
        rows[f"launch {i} ({name}): binding launch"] = lambda p=plan, x=inputs: _launch.launch(p, x)
        if fast is None:
            continue
        stub = _launch._Fast()
        for slot in _launch._Fast.__slots__:
            setattr(stub, slot, getattr(fast, slot))
        stub.call = lambda *args: None
        rows[f"launch {i}: fast path, C entry stubbed"] = lambda s=stub, x=inputs: s(x)
        specs = [(tuple(s.shape), getattr(torch, s.dtype)) for s in plan.outputs]
        size = fast.scratch[0]

        def allocate(specs=specs, size=size):
            for shape, dtype in specs:
                torch.empty(shape, dtype=dtype, device="cuda")
            if size:
                torch.empty(size, dtype=torch.int8, device="cuda")

        rows[f"launch {i}: its allocations alone"] = allocate
        out = fast(inputs)
        if out is None:
            continue  # the fast path stepped aside
        args = list(fast.args)
        for _, _, _, _, positions in fast.slots:
            for pos in positions:
                args[pos] = inputs[plan.params[pos].name].data_ptr()
        for j, o in enumerate(out):
            args[fast.n_in + j] = o.data_ptr()
        scratch = torch.empty(max(size, 1), dtype=torch.int8, device="cuda") if size else None
        stream = torch._C._cuda_getCurrentRawStream(0)

        def entry(f=fast, args=args, scratch=scratch, stream=stream):
            f.call(*f.grid, stream, *f.head, scratch, *f.post, *args, *f.tail)

        rows[f"launch {i}: C entry alone ({len(args)} arguments)"] = entry
    return rows


def main():
    for D in (64, 128):
        rows = _case(D)
        print(f"== head dim {D}, T1024, 8 documents of ids, causal, 32 on 4 heads", flush=True)
        for label, fn in rows.items():
            print(f"   {label}: {_host(fn):.1f} us", flush=True)


if __name__ == "__main__":
    main()
