"""Latency at small shapes, where the host sets the pace: wall time per
forward+backward call at B=2, T=512, H=8, D=64 (bfloat16), for

* flash attention, causal: ours eager, ours under ``torch.compile(mode=
  "reduce-overhead")``, SDPA eager and compiled the same way;
* ``chunk_linear_attn`` with a scalar gate ``g`` and ``lightning_attn``:
  ours eager and compiled, fla eager (fla's ops are opaque to the compiler);

beside the GPU time of our kernels alone (the eager call captured once in a
CUDA graph and replayed: no host work).  Calls are queued back to back and
synchronised once per batch (bench.common.time_per_call), so a host-bound
call shows its host time ("us").  "gpu us" is the device time one call
keeps the GPU busy (torch.profiler: every kernel, copy and fill of 20 calls,
summed): under ``reduce-overhead`` it shows what the CUDA graphs run beside
our kernels (input copies), which the host-bound wall time hides.
``python -m bench latency``.
"""

from __future__ import annotations

from bench.common import graph_time_per_call, markdown_table, save, time_per_call

B, T, H, D = 2, 512, 8, 64
LAYER_IDX, NUM_LAYERS = 2, 8
CASES = ("flash causal", "chunk g", "lightning")
IMPLS = ("ours eager", "ours compiled", "sdpa eager", "sdpa compiled", "fla eager")


def _inputs(torch, case):
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)

    x = {"query": rand(B, T, H, D), "key": rand(B, T, H, D), "value": rand(B, T, H, D)}
    if case == "chunk g":
        x["g"] = -torch.nn.functional.softplus(rand(B, T, H).float())
    return x


def _fn(torch, torch_api, case, impl):
    if impl.startswith("ours"):
        if case == "flash causal":
            return lambda **x: torch_api.flash_attention(**x, causal=True)
        if case == "chunk g":
            return lambda **x: torch_api.chunk_linear_attn(**x)[0]
        return lambda **x: torch_api.lightning_attn(**x, layer_idx=LAYER_IDX, num_layers=NUM_LAYERS)[0]
    if impl.startswith("sdpa"):
        if case != "flash causal":
            return None

        def sdpa(query, key, value):
            q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # SDPA is head-first
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)

        return sdpa
    if case == "flash causal":
        return None
    if case == "chunk g":
        if _fla_refuses_gated_chunk(torch):
            raise RuntimeError("fla refuses gated chunk backward on Hopper with Triton >= 3.4, < 3.7.1")
        from fla.ops.simple_gla import chunk_simple_gla

        return lambda **x: chunk_simple_gla(x["query"], x["key"], x["value"], g=x["g"])[0]
    from fla.ops.lightning_attn import chunk_lightning_attn

    return lambda **x: chunk_lightning_attn(x["query"], x["key"], x["value"], LAYER_IDX, NUM_LAYERS)[0]


def _fla_refuses_gated_chunk(torch) -> bool:
    """fla 0.6 raises (after compiling for minutes) for a gated chunk
    backward on Hopper with Triton 3.4 to 3.7.0, whose results it found wrong."""
    import triton

    version = tuple(int(p) for p in triton.__version__.split(".")[:3] if p.isdigit())
    return torch.cuda.get_device_capability()[0] == 9 and (3, 4) <= version < (3, 7, 1)


def _step(torch, fn, x, compiled=False):
    leaves = {n: v.detach().clone().requires_grad_(True) for n, v in x.items()}
    do = torch.randn_like(x["value"])
    if compiled:
        # As in a model, where attention's inputs come from inside the
        # compiled region: CUDA-graph trees then copy no input per call.
        for t in (*leaves.values(), do):
            torch._dynamo.mark_static_address(t)

    def step():
        if compiled:
            # One training step per call: CUDA-graph trees may then reuse the
            # last step's output memory and replay, instead of checking (and
            # re-recording around) outputs they must assume are still alive.
            torch.compiler.cudagraph_mark_step_begin()
        out = fn(**leaves)
        return torch.autograd.grad(out, list(leaves.values()), do)

    return step


def _gpu_time(torch, step):
    """Seconds of GPU time per call: ``step`` captured in a CUDA graph."""
    return graph_time_per_call(torch, step, calls=1, iters=50)


def _device_time(torch, step, n=20):
    """Seconds of device activity (kernels, copies, fills) per call."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    total = sum(e.device_time for e in prof.events() if e.device_type == DeviceType.CUDA)
    return total / n / 1e6


def run(progress=None) -> list[dict]:
    import torch

    import torch_api

    sync = lambda _: torch.cuda.synchronize()  # noqa: E731
    rows = []
    for case in CASES:
        x = _inputs(torch, case)
        for impl in (*IMPLS, "ours kernels (CUDA graph)"):
            row = {"case": case, "impl": impl}
            try:
                if impl == "ours kernels (CUDA graph)":
                    t = _gpu_time(torch, _step(torch, _fn(torch, torch_api, case, "ours eager"), x))
                else:
                    fn = _fn(torch, torch_api, case, impl)
                    if fn is None:
                        continue
                    compiled = impl.endswith("compiled")
                    if compiled:
                        torch._dynamo.reset()
                        fn = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
                    step = _step(torch, fn, x, compiled)
                    t = time_per_call(step, sync, iters=50, reps=5, warmup=5)
                    try:
                        row["gpu us"] = f"{_device_time(torch, step) * 1e6:.1f}"
                    except Exception as e:  # the profiler is a side measurement
                        row["gpu us"] = f"error: {type(e).__name__}"
                row["us"] = f"{t * 1e6:.1f}"
            except Exception as e:  # fla is optional; one failure must not hide the rest
                row["us"] = f"error: {type(e).__name__}: {str(e)[:100]}"
            rows.append(row)
            print(row, flush=True)
            if progress is not None:
                progress.update(1)
    _ratios(rows)
    save("latency", rows, {"device": torch.cuda.get_device_name(), "B": B, "T": T, "H": H, "D": D})
    columns = ["case", "impl", "us", "vs sdpa eager", "vs kernels", "gpu us", "gpu vs kernels"]
    print(markdown_table(rows, columns))
    return rows


def _ratios(rows):
    """Wall time over SDPA eager's (flash) and over our kernels' GPU time,
    and the device time per call over our kernels' GPU time."""
    by = {(r["case"], r["impl"]): r for r in rows}
    for r in rows:
        try:
            t = float(r["us"])
        except (KeyError, ValueError):
            continue
        sdpa = by.get((r["case"], "sdpa eager"), {}).get("us")
        gpu = by.get((r["case"], "ours kernels (CUDA graph)"), {}).get("us")
        if sdpa and not sdpa.startswith("error"):
            r["vs sdpa eager"] = f"{t / float(sdpa):.2f}x"
        if gpu and not gpu.startswith("error"):
            r["vs kernels"] = f"{t / float(gpu):.2f}x"
            try:
                r["gpu vs kernels"] = f"{float(r['gpu us']) / float(gpu):.2f}x"
            except (KeyError, ValueError):
                pass


def count() -> int:
    return len(CASES) * (len(IMPLS) + 1)
