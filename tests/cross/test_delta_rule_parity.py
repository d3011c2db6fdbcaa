"""gated_delta_rule and its decoding step: the two bindings, handed the
same tensors over DLPack, give the same bits (outputs, final states and
every gradient), in both modes.  Each binding's own suite compares its
results with the float64 reference; this ties the bindings together, so
a binding's suite may leave kernel-level cases to the other."""

import jax
import numpy as np
import pytest
import torch

import jax_api
import torch_api
from tests.cross.test_dlpack import _same, _torch_device
from tests.suites.delta_rule import CU_SEQLENS, logsigmoid

# Each gate, mode and dtype, in half the combinations (the interpreter is slow).
CASES = [("gk", "chunk", torch.float32), ("g", "chunk", torch.bfloat16), ("g", "recurrent", torch.float32),
         ("gk", "recurrent", torch.bfloat16)]  # fmt: skip


@pytest.mark.parametrize("gate,mode,dtype", CASES, ids=str)
def test_bindings_agree(gate, mode, dtype):
    rng = np.random.default_rng(31)
    dev = _torch_device()
    T, HK, HV, K, V, N = CU_SEQLENS[-1], 1, 2, 16, 8, len(CU_SEQLENS) - 1

    def t(shape, dt=dtype, fn=lambda a: a):
        return torch.tensor(fn(rng.standard_normal(shape)), dtype=dt, device=dev)

    gate_shape = (1, T, HV) if gate == "g" else (1, T, HV, K)
    x = {
        "query": t((1, T, HK, K)),
        "key": t((1, T, HK, K)),
        "value": t((1, T, HV, V)),
        "beta": t((1, T, HV), dtype, lambda a: 1 / (1 + np.exp(-a))),
        gate: t(gate_shape, torch.float32, lambda a: logsigmoid(a + 2)),
        "initial_state": t((N, HV, K, V), torch.float32),
    }
    cots = (t((1, T, HV, V)), t((N, HV, K, V), torch.float32))
    cu_t = torch.tensor(CU_SEQLENS, dtype=torch.int32, device=dev)
    opts = dict(output_final_state=True, use_qk_l2norm=True, mode=mode)

    leaves = {n: v.clone().requires_grad_(True) for n, v in x.items()}
    outs_t = torch_api.gated_delta_rule(**leaves, cu_seqlens=cu_t, **opts)
    torch.autograd.backward(list(outs_t), list(cots))

    cu_j = jax.numpy.from_dlpack(cu_t)
    xj = {n: jax.numpy.from_dlpack(v) for n, v in x.items()}
    outs_j, pull = jax.vjp(lambda d: jax_api.gated_delta_rule(**d, cu_seqlens=cu_j, **opts), xj)
    (grads_j,) = pull(tuple(jax.numpy.from_dlpack(c) for c in cots))
    for a, b in zip(outs_j, outs_t, strict=True):
        _same(a, b)
    for n in x:
        _same(grads_j[n], leaves[n].grad)


def test_step_bindings_agree():
    rng = np.random.default_rng(32)
    dev = _torch_device()
    shapes = {"query": (3, 1, 2, 8), "key": (3, 1, 2, 8), "value": (3, 1, 4, 8), "beta": (3, 1, 4)}
    x = {n: torch.tensor(rng.random(s), dtype=torch.float32, device=dev) for n, s in shapes.items()}
    x["gk"] = torch.tensor(-rng.random((3, 1, 4, 8)), dtype=torch.float32, device=dev)
    state = torch.tensor(rng.standard_normal((3, 4, 8, 8)), dtype=torch.float32, device=dev)
    xj = {n: jax.numpy.from_dlpack(v) for n, v in x.items()}
    out_j, state_j = jax_api.gated_delta_rule_step(**xj, state=jax.numpy.from_dlpack(state.clone()))
    with torch.no_grad():
        out_t, state_t = torch_api.gated_delta_rule_step(**x, state=state)
    _same(out_j, out_t)
    _same(state_j, state_t)
