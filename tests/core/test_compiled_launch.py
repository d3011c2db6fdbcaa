"""What the JAX binding's compile path (core_triton.common.compiled) makes of
the warp-specialised flash forward, compiled for sm_90 on the CPU (no GPU
needed) in a subprocess, since tests may run Triton in interpreter mode.

Triton's warp-specialisation pass leaves a loop unspecialised, without a
word, when the kernel has a branch it cannot split (a masked block after
the loop, a descriptor store under an ``if``): the kernel then runs 4 warps
and no register reallocation.  This test catches such an edit."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_ws_forward_compiles_warp_specialised_with_scratch():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT
    res = subprocess.run(
        [sys.executable, "-m", "tests.core.compiled_probe"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout.strip().splitlines()[-1])
    for case in ("causal=False", "causal=True", "segment ids"):
        r = result[case]
        assert r["gate"] == (case == "segment ids"), r
        assert r["kernel"] == "flash_fwd_ws_kernel", r
        # The pass adds a producer warp group and a second consumer's worth
        # of warps to the 4 the plan launches with, and moves registers.
        assert r["num_warps_planned"] == 4 and r["num_warps"] == 12, r
        assert r["setmaxnreg"] > 0, r
        # Its tensor descriptors live in global scratch.
        assert r["scratch_bytes"] > 0, r
        assert r["grid"] == [8, 8, 1], r
        types = [t for t, _ in r["params"]]
        # q, k, v, the sink placeholder, the queries' ranges (a placeholder
        # unless gated), the scale, B, Tq, Tk, HQ, H (the sink count and
        # stride, equal to 1, specialised away as Triton's launcher does),
        # then out and lse.
        ranges = "*i32" if r["gate"] else "*bf16"
        assert types == ["*bf16"] * 4 + [ranges, "fp32"] + ["i32"] * 5 + ["*bf16", "*fp32"], r
        assert [v for _, v in r["params"]][6:11] == [2, 1024, 1024, 4, 4], r
    # A plan's register cap reaches the compiled kernel (jaxlib's launch of
    # it, like Triton's, then runs at most 128 registers a thread).
    for case in ("capped forward", "capped dq"):
        r = result[case]
        assert (r["maxnreg"], r["ptx_maxnreg"]) == (128, [".maxnreg 128"]), r
        # The strides come as one tuple argument a tensor: their elements
        # are the compiled kernel's parameters in order, those equal to 1
        # specialised away (q, k, v [1, 2048, 4, 64] contiguous; the
        # forward's optional inputs' strides are all 0 here, then its sink
        # stride, 1), one for each of the PTX's (and Triton's two scratch).
        ints = [v for t, v in r["params"] if t == "i32"]
        run = [2048 * 4 * 64, 4 * 64, 64] * 3
        assert any(ints[i : i + 9] == run for i in range(len(ints))), r
        assert len(r["params"]) + 2 == r["ptx_params"], r
