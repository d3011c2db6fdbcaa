"""One op on ``cu_seqlens`` values that break the contract, run in a child
process (``python -m tests.packed_bounds FRAMEWORK OP CASE[,CASE...]``).

Such values reach the kernels unchecked: the ops never read them on the
host (``check_cu_seqlens`` checks them on request).  An access outside a
tensor can corrupt the heap and still let the process finish, so each op
runs in its own process (tests/suites/packed_bounds.py starts them), its
cases one after another (one process per case cost CI 5-8 s of start-up
each); a crash or a failed check exits non-zero, and the ``PASS`` lines
printed before it say which cases had passed.

What must hold (core_triton.common.sequences): every output and gradient is
finite; tokens that no clamped sequence covers get output 0 and gradient 0;
where the clamped sequences do not overlap, the result is that of the valid
call on those sequences (run here on the same inputs, sliced).
"""

from __future__ import annotations

import sys

import numpy as np

from tests.reference import assert_close

T = 40
# name: (cu_seqlens, the valid call they amount to as (start, end, cu) of a
# slice of the time axis, or None where clamped sequences overlap).
CASES = {
    "last_past_seq_len": ([0, 5, 20, 90], (0, 40, [0, 5, 20, 40])),
    "last_short": ([0, 5, 23], (0, 23, [0, 5, 23])),
    "first_not_zero": ([7, 12, 12, 40], (7, 40, [0, 5, 5, 33])),
    "negative_and_huge": ([-50, 9, 2**30, 2**31 - 1], (0, 40, [0, 9, 40, 40])),
    # A very negative first start once took the next sequence's chunk slots.
    "very_negative_start": ([-100, 9, 40], (0, 40, [0, 9, 40])),
    "far_negative_empty": ([-2000, 0, 40], (0, 40, [0, 0, 40])),
    "decreasing": ([0, 30, 4, 17, 40], None),
    "all_wild": ([2**31 - 1, -(2**31), 35, -3, 2**30], None),
}
OPS = ["recurrent", "chunk", "lightning_chunk", "local_cumsum", "global_cumsum"]
# The delta rule in both modes, and chunk_split (chunk_linear_attn with its
# state passes split into segments of one chunk,
# core_triton/linear_attn/state_split.py), on the cases that reach every
# clamp (CI time).
CLAMP_OPS = ["delta_chunk", "delta_recurrent", "chunk_split"]
CLAMP_CASES = ["last_past_seq_len", "first_not_zero", "negative_and_huge", "all_wild"]
H, K, V = 2, 8, 12


def _covered(cu) -> np.ndarray:
    """Rows of the time axis that a clamped sequence covers."""
    covered = np.zeros(T, bool)
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        lo = min(max(a, 0), T)
        hi = min(max(b, lo), T)
        covered[lo:hi] = True
    return covered


def _inputs(op, rng):
    if op.startswith("delta"):
        x = {
            "query": rng.standard_normal((1, T, 1, K)),
            "key": rng.standard_normal((1, T, 1, K)) * K**-0.5,
            "value": rng.standard_normal((1, T, H, V)),
            "beta": 1 / (1 + np.exp(-rng.standard_normal((1, T, H)))),
        }
        if op == "delta_chunk":
            x["gk"] = -np.abs(rng.standard_normal((1, T, H, K))) * 0.3
        else:
            x["g"] = -np.abs(rng.standard_normal((1, T, H))) * 0.3
        return x, (rng.standard_normal((1, T, H, V)),)
    if op.endswith("cumsum"):
        return {"x": rng.standard_normal((1, T, H, 3))}, (rng.standard_normal((1, T, H, 3)),)
    x = {
        "query": rng.standard_normal((1, T, 2 * H, K)),
        "key": rng.standard_normal((1, T, H, K)),
        "value": rng.standard_normal((1, T, H, V)),
    }
    if op != "lightning_chunk":
        x["g"] = -np.abs(rng.standard_normal((1, T, H))) * 0.3
        x["g_gamma"] = -np.abs(rng.standard_normal(H)) * 0.1
    return x, (rng.standard_normal((1, T, 2 * H, V)),)


def _call(api, op):
    def fn(cu_seqlens, **x):
        if op == "recurrent":
            return api.recurrent(**x, cu_seqlens=cu_seqlens)
        if op in ("chunk", "chunk_split"):
            return api.chunk_linear_attn(**x, cu_seqlens=cu_seqlens, chunk_size=16)
        if op.startswith("delta"):
            mode = op.removeprefix("delta_")
            return api.gated_delta_rule(**x, cu_seqlens=cu_seqlens, use_qk_l2norm=True, mode=mode)
        if op == "lightning_chunk":
            return api.lightning_attn(**x, layer_idx=1, num_layers=4, cu_seqlens=cu_seqlens)
        if op == "local_cumsum":
            return (api.chunk_local_cumsum(x["x"], 16, cu_seqlens=cu_seqlens),)
        return (api.chunk_global_cumsum(x["x"], reverse=True, cu_seqlens=cu_seqlens),)

    return fn


def _run_jax(op, x, cu, cots):
    """Outputs and gradients as numpy, ``cu_seqlens`` traced under jit."""
    import jax
    import jax.numpy as jnp

    import jax_api

    fn = _call(jax_api, op)
    arrays = {n: jnp.asarray(a, jnp.float32) for n, a in x.items()}

    @jax.jit
    def run(arrays, cu, cots):
        outs, pull = jax.vjp(lambda d: fn(cu, **d)[: len(cots)], arrays)
        return outs, pull(tuple(cots))[0]

    outs, grads = run(arrays, jnp.asarray(cu, jnp.int32), tuple(jnp.asarray(c, jnp.float32) for c in cots))
    return [np.asarray(o, np.float64) for o in outs], {n: np.asarray(g, np.float64) for n, g in grads.items()}


def _run_torch(op, x, cu, cots):
    """Outputs and gradients as numpy (the ops never check the values)."""
    import torch

    import torch_api

    device = "cuda" if torch.cuda.is_available() else "cpu"
    leaves = {
        n: torch.tensor(a, dtype=torch.float32, device=device, requires_grad=True) for n, a in x.items()
    }
    outs = _call(torch_api, op)(torch.tensor(cu, dtype=torch.int32, device=device), **leaves)[: len(cots)]
    torch.autograd.backward(list(outs), [torch.tensor(c, dtype=torch.float32, device=device) for c in cots])
    if device == "cuda":
        torch.cuda.synchronize()  # a fault surfaces here, not after the checks
    return [o.detach().cpu().double().numpy() for o in outs], {
        n: t.grad.cpu().double().numpy() for n, t in leaves.items()
    }


def main(framework: str, op: str, cases: str) -> None:
    if op == "chunk_split":
        from core_triton.linear_attn import state_split

        state_split.SPLIT_OVERRIDE["segment_chunks"] = 1
    for case in cases.split(","):
        check(framework, op, case)


def check(framework: str, op: str, case: str) -> None:
    run = {"jax": _run_jax, "torch": _run_torch}[framework]
    cu, valid = CASES[case]
    x, cots = _inputs(op, np.random.default_rng(0))
    outs, grads = run(op, x, cu, cots)
    covered = _covered(cu)
    for name, a in [*(("output", o) for o in outs), *(("d_" + n, g) for n, g in grads.items())]:
        assert np.all(np.isfinite(a)), f"{name} is not finite"
        if name != "d_g_gamma" and a.ndim >= 2 and a.shape[1] == T:
            # Tokens outside every sequence: exactly 0.
            assert not np.any(a[:, ~covered]), f"{name} is not 0 outside the sequences"
    if valid is not None:
        lo, hi, valid_cu = valid
        sliced = {n: (a[:, lo:hi] if a.ndim >= 2 and a.shape[1] == T else a) for n, a in x.items()}
        ref_outs, ref_grads = run(op, sliced, valid_cu, tuple(c[:, lo:hi] for c in cots))
        assert_close(outs[0][:, lo:hi], ref_outs[0], "float32", "output")
        for n, g in ref_grads.items():
            got = grads[n][:, lo:hi] if g.ndim >= 2 and grads[n].shape[1] == T else grads[n]
            assert_close(got, g, "float32", f"d_{n}")
    print("PASS", framework, op, case, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
