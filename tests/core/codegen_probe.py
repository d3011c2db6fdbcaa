"""Compile a flash-attention launch plan for Hopper (sm_90) the way each
binding's launcher specialises it, without a GPU, and print what its PTX
loads from global memory.  Run as a script (Triton must not be in
interpreter mode): ``python -m tests.core.codegen_probe``.

- PyTorch (Triton's own launcher): pointers 16-byte aligned, every int
  argument that is a multiple of 16 marked divisible by 16, ints equal to 1
  made constants.
- JAX (jax-triton 0.3): pointers 16-byte aligned, ints equal to 1 made
  constants, no divisibility for any other int.
"""

from __future__ import annotations

import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from core_triton.attention import flash as core
from core_triton.common.launch import In, TensorInfo, kernel_constexprs

_POINTER = {"bfloat16": "*bf16", "float32": "*fp32", "int32": "*i32"}
_INPUT_DTYPES = {"lse": "float32", "delta": "float32", "dlse": "float32", "qoff": "int32", "koff": "int32"}


def compile_plan(plan, binding: str) -> str:
    """PTX of ``plan`` (bf16 q/k/v/do) as ``binding`` ("torch"/"jax") would build it."""
    names = plan.kernel.arg_names
    signature, attrs, constexprs = {}, {}, {}
    divisible = [["tt.divisibility", 16]]

    def scalar(path, arg):
        """The type of an int or float argument at ``path`` (a tuple
        argument's elements each at their own), specialised as the binding
        does."""
        if isinstance(arg, tuple):
            return tuple(scalar((*path, j), a) for j, a in enumerate(arg))
        if isinstance(arg, bool) or not isinstance(arg, int):
            return "fp32"
        if arg == 1:
            constexprs[path] = 1
            return "constexpr"
        if binding == "torch" and arg % 16 == 0:
            attrs[path] = divisible
        return "i32"

    for i, arg in enumerate((*plan.params, *plan.outputs)):
        name = names[i]
        if isinstance(arg, In):
            signature[name] = _POINTER[_INPUT_DTYPES.get(arg.name, "bfloat16")]
            attrs[(i,)] = divisible
        elif hasattr(arg, "shape"):  # an OutputSpec
            signature[name] = _POINTER[arg.dtype]
            attrs[(i,)] = divisible
        else:
            signature[name] = scalar((i,), arg)
    # The plan's constants as the kernel takes them (its groups packed).
    for name, value in kernel_constexprs(plan.kernel, plan.constexprs).items():
        signature[name], constexprs[(names.index(name),)] = "constexpr", value
    src = ASTSource(plan.kernel, signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": plan.num_warps, "num_stages": plan.num_stages}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def load_counts(ptx: str) -> dict[str, int]:
    return {
        "cp_async": len(re.findall(r"cp\.async\.cg", ptx)),
        "scalar_b16_loads": len(re.findall(r"ld\.global(\.\w+)*\.b16 ", ptx)),
    }


def main(argv):
    causal = "causal" in argv
    # Head dim 128 at T=1024 takes the measured short-sequence configs (no
    # autotuning): forward 64x64 with 4 warps and 3 stages.
    B, T, H, D = 2, 1024, 4, 128
    q = TensorInfo((B, T, H, D), "bfloat16", (T * H * D, H * D, D, 1))
    plans, _ = core.plans(q, q, q, causal=causal)
    (dkdv,), (dq,) = plans.grads(q, q)
    result = {}
    for kind, plan in (("fwd", plans.forward[0]), ("dkdv", dkdv), ("dq", dq)):
        for binding in ("torch", "jax"):
            result[f"{kind}/{binding}"] = load_counts(compile_plan(plan, binding))
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
