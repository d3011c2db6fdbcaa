"""Recurrent and lightning attention: the two bindings, handed the same
tensors over DLPack, give the same outputs, final states and gradients."""

import jax
import numpy as np
import pytest
import torch

import jax_api
import torch_api
from tests.cross.test_dlpack import _same, _torch_device
from tests.suites.recurrent import CU_SEQLENS, logsigmoid

CASES = {
    "recurrent": lambda api, cu, g: (
        lambda query, key, value, **kw: api.recurrent(
            query, key, value, **g, reverse=True, cu_seqlens=cu, **kw
        )
    ),
    "lightning_recurrent": lambda api, cu, g: (
        lambda query, key, value, **kw: api.lightning_attn(
            query, key, value, 1, 4, cu_seqlens=cu, mode="recurrent", **kw
        )
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bindings_agree(case, dtype):
    rng = np.random.default_rng(30)
    dev = _torch_device()
    T, HQ, H, K, V, N = CU_SEQLENS[-1], 4, 2, 20, 12, len(CU_SEQLENS) - 1

    def t(shape, dt=dtype, fn=lambda a: a):
        return torch.tensor(fn(rng.standard_normal(shape)), dtype=dt, device=dev)

    x = {"query": t((1, T, HQ, K)), "key": t((1, T, H, K)), "value": t((1, T, H, V))}
    x["initial_state"] = t((N, H, K, V), torch.float32)
    gates = (
        {}
        if case != "recurrent"
        else {
            "g": t((1, T, H), torch.float32, logsigmoid),
            "gk": t((1, T, H, K), torch.float32, logsigmoid),
            "gv": t((1, T, H, V), torch.float32, logsigmoid),
            "g_gamma": t((H,), torch.float32, logsigmoid),
        }
    )
    x.update(gates)
    cots = (t((1, T, HQ, V)), t((N, H, K, V), torch.float32))
    cu_t = torch.tensor(CU_SEQLENS, dtype=torch.int32, device=dev)

    names = list(x)
    leaves = {n: v.clone().requires_grad_(True) for n, v in x.items()}
    fn_t = CASES[case](torch_api, cu_t, {n: leaves[n] for n in gates})
    outs_t = fn_t(**{n: leaves[n] for n in names if n not in gates})
    torch.autograd.backward(list(outs_t), list(cots))

    cu_j = jax.numpy.from_dlpack(cu_t)
    xj = {n: jax.numpy.from_dlpack(v) for n, v in x.items()}

    def fn_j(d):
        fn = CASES[case](jax_api, cu_j, {n: d[n] for n in gates})
        return fn(**{n: d[n] for n in names if n not in gates})

    outs_j, pull = jax.vjp(fn_j, xj)
    (grads_j,) = pull(tuple(jax.numpy.from_dlpack(c) for c in cots))
    for a, b in zip(outs_j, outs_t, strict=True):
        _same(a, b)
    for n in names:
        _same(grads_j[n], leaves[n].grad)
