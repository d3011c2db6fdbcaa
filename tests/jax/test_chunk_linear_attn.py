import jax
import jax.numpy as jnp
import numpy as np
import torch

from core_triton.linear_attn.naive import linear_attention_ref
from tests.frameworks import JaxFramework
from tests.reference import assert_close
from tests.suites.chunk_linear_attn import (
    CU_SEQLENS,
    SMALL,
    ChunkLinearAttnGpuSuite,
    ChunkLinearAttnLargeTileSuite,
    ChunkLinearAttnSuite,
)
from tests.suites.recurrent import make_case

FW = JaxFramework()


class TestJaxChunkLinearAttn(ChunkLinearAttnSuite):
    fw = FW
    kernel_cases = False  # the split-pass matrix: PyTorch's session runs it whole

    def test_jit_grad_with_traced_cu_seqlens(self):
        x, cu, cots = make_case(FW, gates=("g", "g_gamma"), packed=True, h0=True, seed=12, **SMALL)
        arrays = {n: FW.array(a) for n, a in x.items()}
        do, dht = (FW.array(c) for c in cots)

        @jax.jit
        def loss(arrays, cu):
            o, ht = FW.api.chunk_linear_attn(**arrays, reverse=True, cu_seqlens=cu, chunk_size=16)
            return jnp.sum(o * do) + jnp.sum(ht * dht)

        rounded = {n: FW.numpy(a) for n, a in arrays.items()}
        # Other values, same shapes: no retrace, still right (an empty
        # sequence moved, one that starts mid-chunk).
        for values in (CU_SEQLENS, [0, 0, 30, 31, 61]):
            value, grads = jax.value_and_grad(loss)(arrays, FW.array(values, "int32"))
            o, ht, ref = linear_attention_ref(rounded, None, True, values, cots[0], cots[1], torch)
            np.testing.assert_allclose(float(value), np.sum(o * cots[0]) + np.sum(ht * cots[1]), rtol=1e-5)
            for n in arrays:
                scale = np.abs(ref["g"]).sum(axis=(0, 1)) if n == "g_gamma" else None
                assert_close(FW.numpy(grads[n]), ref[n], "float32", n, scale=scale)


class TestJaxChunkLinearAttnGpu(ChunkLinearAttnGpuSuite):
    fw = FW


class TestJaxChunkLinearAttnLargeTiles(ChunkLinearAttnLargeTileSuite):
    fw = FW
