"""Compile the warp-specialised flash forward's launch plan for Hopper
(sm_90) through core_triton.common.compiled (the JAX binding's compile
path; the same binder, source and options as Triton's own launcher), with
no GPU, and print what came out.  Run as a script (Triton must not be in
interpreter mode): ``python -m tests.core.compiled_probe``."""

from __future__ import annotations

import json

from core_triton.attention import flash, flash_tma_plans
from core_triton.common.compiled import compile_plan
from core_triton.common.launch import TensorInfo


def main():
    flash_tma_plans.WS_FORWARD = "on"
    # Two batches of whole key blocks (the plan's condition for several).
    B, T, H, D = 2, 1024, 4, 128
    q = TensorInfo((B, T, H, D), "bfloat16", (T * H * D, H * D, D, 1))
    ids = TensorInfo((B, T), "int32", (T, 1))
    result = {}
    for case in ("causal=False", "causal=True", "segment ids"):
        if case == "segment ids":
            # The first launch of a gated pair (flash.gated_pair).
            index = dict(q_key_range=ids, kv_query_range=ids)
            plans, _ = flash.plans(q, q, q, ids, causal=True, **index)
            plan = plans.forward[0]
        else:
            plans, _ = flash.plans(q, q, q, causal=case == "causal=True")
            (plan,) = plans.forward
        dtypes = {"q": "bfloat16", "k": "bfloat16", "v": "bfloat16", "q_key_range": "int32"}
        c = compile_plan(plan, dtypes, 90)
        result[case] = {
            "kernel": plan.kernel.__name__,
            "num_warps_planned": plan.num_warps,
            "num_warps": c.num_warps,
            "setmaxnreg": c.ptx.count("setmaxnreg"),
            "scratch_bytes": c.scratch_bytes,
            "grid": list(c.grid),
            "params": [[p.type, p.value] for p in c.params],
            "gate": plan.constexprs["GATE"],
        }
    # Head dim 64 at 2k, full: the forward and dQ plans cap registers at
    # 128 (LaunchPlan.maxnreg), which must reach the PTX.
    q = TensorInfo((1, 2048, 4, 64), "bfloat16", (2048 * 4 * 64, 4 * 64, 64, 1))
    plans, _ = flash.plans(q, q, q)
    _, (dq, *_) = plans.grads(q, q)
    dtypes = {n: "bfloat16" for n in ("q", "k", "v", "o", "do")}
    dtypes.update(qoff="int32", koff="int32", lse="float32", delta="float32")
    for name, plan in (("capped forward", plans.forward[0]), ("capped dq", dq)):
        c = compile_plan(plan, dtypes, 90)
        result[name] = {
            "maxnreg": plan.maxnreg,
            "ptx_maxnreg": [ln.strip() for ln in c.ptx.splitlines() if ".maxnreg" in ln],
            "params": [[p.type, p.value] for p in c.params],
            "ptx_params": sum("_param_" in ln and "ld.param" not in ln for ln in c.ptx.splitlines()),
            "scratch_bytes": c.scratch_bytes,
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
