import jax
import jax.numpy as jnp
import numpy as np
import torch

from core_triton.linear_attn.naive import linear_attention_ref
from tests.frameworks import JaxFramework
from tests.reference import assert_close
from tests.suites.recurrent import CU_SEQLENS, RecurrentSuite, make_case

FW = JaxFramework()


class TestJaxRecurrent(RecurrentSuite):
    fw = FW
    kernel_cases = False

    def test_jit_grad_with_traced_cu_seqlens(self):
        x, cu, cots = make_case(FW, gates=("g", "g_gamma"), packed=True, h0=True, seed=12)
        arrays = {n: FW.array(a) for n, a in x.items()}
        do, dht = (FW.array(c) for c in cots)

        @jax.jit
        def loss(arrays, cu):
            o, ht = FW.api.recurrent(**arrays, reverse=True, cu_seqlens=cu)
            return jnp.sum(o * do) + jnp.sum(ht * dht)

        value, grads = jax.value_and_grad(loss)(arrays, FW.array(CU_SEQLENS, "int32"))
        rounded = {n: FW.numpy(a) for n, a in arrays.items()}
        o, ht, ref = linear_attention_ref(rounded, None, True, CU_SEQLENS, cots[0], cots[1], torch)
        np.testing.assert_allclose(float(value), np.sum(o * cots[0]) + np.sum(ht * cots[1]), rtol=1e-5)
        for n in arrays:
            assert_close(FW.numpy(grads[n]), ref[n], "float32", n)
