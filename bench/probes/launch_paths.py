"""Why the same flash forward reads 6-8% slower through PyTorch than through
JAX at B4 H16 T8k head dim 128 (H200, thirty-ninth session; issue 31 asks
for JAX within 5% of PyTorch).  Not part of ``nox -s bench``.

Both bindings compile the same PTX (core_triton.common.compiled), but they
assemble it apart: PyTorch's launches load the cubin of Triton's bundled
``ptxas``, JAX's go through jaxlib's Triton call, which assembles the PTX
itself (jax_api._compiled).  This probe:

1. prints every ``ptxas`` it finds (Triton's, ``TRITON_PTXAS_PATH``, one on
   ``PATH``, the ``nvidia-cuda-nvcc`` wheel's that JAX's CUDA plugin brings)
   with its version;
2. assembles the plan's Gluon forward PTX (full and causal) with each and
   prints registers, spills and the SASS's instruction count;
3. times the forward through the PyTorch binding, through Triton's own
   launcher on the plan's kernel (``kernel[grid]``, no binding), through
   the JAX binding and through jax_api._compiled on the same plan, in
   rounds that rotate their order (medians of five).

Run it twice to test the assembler: as is, and with ``TRITON_PTXAS_PATH``
set to another ``ptxas`` and a fresh ``TRITON_CACHE_DIR``; if PyTorch's
times then move to JAX's, the assembler is the difference.

``python -m bench.probes.launch_paths``.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

CASES = (  # B, T, HQ, H, D, causal
    (4, 8192, 16, 16, 128, False),
    (4, 8192, 16, 16, 128, True),
    (16, 2048, 16, 16, 128, True),
)


def assemblers() -> dict[str, str]:
    """Every ptxas found, by where it came from."""
    from triton import knobs

    found = {"triton": knobs.nvidia.ptxas.path}
    if os.environ.get("TRITON_PTXAS_PATH"):
        found["TRITON_PTXAS_PATH"] = os.environ["TRITON_PTXAS_PATH"]
    if shutil.which("ptxas"):
        found["PATH"] = shutil.which("ptxas")
    for i, path in enumerate(
        sorted(set(sum((glob.glob(f"{p}/nvidia/cuda_nvcc/bin/ptxas") for p in sys.path), [])))
    ):
        found[f"cuda_nvcc wheel {i}"] = path
    return found


def _version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    return (re.findall(r"release [^\n]*", out) or [out.strip()[-60:]])[0]


def _plan(B, T, HQ, H, D, causal):
    from core_triton.attention import flash
    from core_triton.common.launch import TensorInfo

    q = TensorInfo((B, T, HQ, D), "bfloat16", (T * HQ * D, HQ * D, D, 1))
    kv = TensorInfo((B, T, H, D), "bfloat16", (T * H * D, H * D, D, 1))
    return flash.plans(q, kv, kv, causal=causal)[0].forward[0]


def assemble_each(found: dict[str, str]) -> None:
    from core_triton.common import compiled

    print("| ptxas | version | case | registers / spills | SASS instructions |")
    print("|---|---|---|---|---|")
    dtypes = {"q": "bfloat16", "k": "bfloat16", "v": "bfloat16"}
    for causal in (False, True):
        plan = _plan(4, 8192, 16, 16, 128, causal)
        ptx_text = compiled.compile_plan(plan, dtypes, 90).ptx
        with tempfile.TemporaryDirectory() as tmp:
            ptx = os.path.join(tmp, "k.ptx")
            with open(ptx, "w") as f:
                f.write(ptx_text)
            for name, path in found.items():
                cubin = os.path.join(tmp, "k.cubin")
                run = subprocess.run(
                    [path, "-arch=sm_90a", "-v", ptx, "-o", cubin], capture_output=True, text=True
                )
                regs = " ".join(re.findall(r"Used \d+ registers|\d+ bytes spill stores", run.stderr))
                tool = os.path.join(os.path.dirname(found["triton"]), "cuobjdump")
                count = ""
                if os.path.exists(tool) and os.path.exists(cubin):
                    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
                    count = str(
                        sum(1 for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line))
                    )
                label = f"T8k {'causal' if causal else 'full'}"
                print(f"| {name} | {_version(path)} | {label} | {regs or run.stderr[-120:]} | {count} |")


def _timers(case):
    """``{name: (fn, sync)}`` of the four launch paths for one case."""
    import jax
    import jax.numpy as jnp
    import torch

    import jax_api
    import torch_api
    from jax_api._compiled import compiled_call
    from torch_api._launch import _ensure_scratch_allocator, launch

    B, T, HQ, H, D, causal = case
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    plan = _plan(*case)
    inputs = {"q": q, "k": k, "v": v}
    qj, kj, vj = (jnp.from_dlpack(x) for x in (q, k, v))
    torch_sync = lambda _: torch.cuda.synchronize()  # noqa: E731
    _ensure_scratch_allocator()
    names = plan.input_names()
    direct = jax.jit(lambda a, b, c: compiled_call(plan, names, [dict(q=a, k=b, v=c)[n] for n in names])[0])
    binding = jax.jit(lambda a, b, c: jax_api.flash_attention(a, b, c, causal=causal))
    return {
        "torch binding": (lambda: torch_api.flash_attention(q, k, v, causal=causal), torch_sync),
        "torch launch (plan)": (lambda: launch(plan, inputs)[0], torch_sync),
        "jax binding": (lambda: binding(qj, kj, vj), jax.block_until_ready),
        "jax compiled_call (plan)": (lambda: direct(qj, kj, vj), jax.block_until_ready),
    }


def time_each() -> None:
    from bench.common import time_per_call

    print(
        "| case | "
        + " | ".join(("torch binding", "torch launch (plan)", "jax binding", "jax compiled_call (plan)"))
        + " |"
    )
    print("|---|---|---|---|---|")
    for case in CASES:
        timers = _timers(case)
        times = {name: [] for name in timers}
        order = list(timers.items())
        for r in range(5):
            for name, (fn, sync) in order[r % 4 :] + order[: r % 4]:
                times[name].append(time_per_call(fn, sync, iters=10, reps=3, warmup=2) * 1e3)
        cells = " | ".join(f"{statistics.median(t):.3f}" for t in times.values())
        B, T, HQ, H, D, causal = case
        print(f"| B{B} T{T} H{HQ}/{H} D{D} {'causal' if causal else 'full'} | {cells} |", flush=True)


def _jaxlib_cuda() -> str:
    """The CUDA versions jaxlib was built with and runs on (its Triton call
    assembles PTX with the former's compiler), where it says."""
    try:
        from jax._src.lib import cuda_versions

        return ", ".join(
            f"{name} {getattr(cuda_versions, name)()}"
            for name in ("cuda_runtime_build_version", "cuda_runtime_get_version", "cuda_driver_get_version")
            if hasattr(cuda_versions, name)
        )
    except Exception as e:  # noqa: BLE001 - a probe reports and goes on
        return f"unknown ({type(e).__name__})"


def main():
    found = assemblers()
    for name, path in found.items():
        print(f"{name}: {path} ({_version(path)})")
    print(f"jaxlib: {_jaxlib_cuda()}")
    assemble_each(found)
    if os.environ.get("LAUNCH_PATHS_TIME", "1") != "0":
        time_each()


if __name__ == "__main__":
    main()
