import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from core_triton.cumsum.naive import cumsum_ref, cumsum_vjp_ref
from tests.frameworks import JaxFramework
from tests.reference import assert_close
from tests.suites.cumsum import CU_SEQLENS, CumsumSuite, T

FW = JaxFramework()


class TestJaxCumsum(CumsumSuite):
    fw = FW
    kernel_cases = False

    @pytest.mark.parametrize("op", ["local", "global"])
    def test_jit_grad_with_traced_cu_seqlens(self, op):
        rng = np.random.default_rng(7)
        x = FW.array(rng.standard_normal((1, T, 2, 3)))
        w = FW.array(rng.standard_normal((1, T, 2, 3)))
        window = 4 if op == "local" else None

        @jax.jit
        def loss(x, cu):
            if op == "local":
                y = FW.api.chunk_local_cumsum(x, 4, reverse=True, cu_seqlens=cu)
            else:
                y = FW.api.chunk_global_cumsum(x, reverse=True, cu_seqlens=cu)
            return jnp.sum(y * w)

        cu = FW.array(CU_SEQLENS, "int32")
        value, dx = jax.value_and_grad(loss)(x, cu)
        ref = cumsum_ref(FW.numpy(x), window, True, None, CU_SEQLENS, False)
        np.testing.assert_allclose(float(value), float(np.sum(ref * FW.numpy(w))), rtol=1e-5)
        assert_close(
            FW.numpy(dx), cumsum_vjp_ref(FW.numpy(w), window, True, None, CU_SEQLENS, False), "float32"
        )
        # Other values, same shapes: no retrace needed, still right.
        cu2 = [0, 0, 30, 31, 37]
        _, dx2 = jax.value_and_grad(loss)(x, FW.array(cu2, "int32"))
        assert_close(FW.numpy(dx2), cumsum_vjp_ref(FW.numpy(w), window, True, None, cu2, False), "float32")

    def test_vmap(self):
        x = FW.array(np.random.default_rng(8).standard_normal((3, 2, T, 4)))
        y = jax.vmap(lambda v: FW.api.chunk_local_cumsum(v, 8, reverse=True))(x)
        ref = np.stack([cumsum_ref(FW.numpy(x)[i], 8, True, None, None, False) for i in range(3)])
        assert_close(FW.numpy(y), ref, "float32")
        g = jax.grad(lambda v: jnp.sum(jax.vmap(FW.api.chunk_global_cumsum)(v) ** 2))(x)
        assert np.all(np.isfinite(FW.numpy(g)))

    def test_shard_map(self):
        devices = np.array(jax.devices()[:2])
        mesh = Mesh(devices, ("b",))
        x = FW.array(np.random.default_rng(9).standard_normal((len(devices) * 2, T, 3)))

        @jax.jit
        def f(x):
            return jax.shard_map(
                lambda v: FW.api.chunk_global_cumsum(v, softmax_scale=0.5),
                mesh=mesh,
                in_specs=P("b"),
                out_specs=P("b"),
            )(x)

        assert_close(FW.numpy(f(x)), cumsum_ref(FW.numpy(x), None, False, 0.5, None, False), "float32")

    def test_numpy_input_accepted(self):
        x = np.random.default_rng(10).standard_normal((1, 9, 2)).astype(np.float32)
        y = FW.api.chunk_local_cumsum(x, 4)
        assert_close(FW.numpy(y), cumsum_ref(x, 4, False, None, None, False), "float32")
