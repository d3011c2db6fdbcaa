import jax
import numpy as np

from tests.frameworks import JaxFramework
from tests.suites.flash_packed import FlashPackedSuite, _cu

FW = JaxFramework()


class TestJaxFlashPacked(FlashPackedSuite):
    fw = FW

    def test_traced_boundaries_compile_once(self):
        """Under jax.jit the boundaries are traced: new boundaries of the
        same shape reuse the compiled call and equal the eager result."""
        rng = np.random.default_rng(9)
        x = [FW.array(rng.standard_normal((1, 40, 2, 16))) for _ in range(3)]
        traces = []

        def f(q, k, v, cu):
            traces.append(1)
            return FW.api.flash_attention(q, k, v, causal=True, cu_seqlens=cu)

        jitted = jax.jit(f)
        for lengths in ([10, 30], [25, 15], [0, 40]):
            cu = FW.array(_cu(lengths), "int32")
            got = jitted(*x, cu)
            want = FW.api.flash_attention(*x, causal=True, cu_seqlens=cu)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        assert len(traces) == 1
