import jax
import numpy as np

from core_triton.common.runtime import interpreter_requested
from tests.frameworks import JaxFramework
from tests.suites.flash_segments import FlashSegmentsSuite, case_inputs

FW = JaxFramework()


class TestJaxFlashSegments(FlashSegmentsSuite):
    fw = FW
    # On the interpreter the kernel-level cases' cross-section (CI time): the
    # PyTorch binding runs the same plans and kernels on all of them.
    kernel_cases = not interpreter_requested()

    def test_traced_ids_compile_once(self):
        """Under jax.jit the ids are traced (their ranges made on the
        device): sorted and unsorted ids of one shape reuse one compiled
        call and equal the eager result."""
        c, options = case_inputs("docs_causal")
        x = [FW.array(c[n]) for n in ("query", "key", "value")]
        traces = []

        def f(q, k, v, ids):
            traces.append(1)
            return FW.api.flash_attention(q, k, v, q_segment_ids=ids, **options)

        jitted = jax.jit(f)
        for name in ("docs_causal", "id_in_two_runs_causal", "one_segment_causal"):
            ids = case_inputs(name)[0]["q_segment_ids"][:, : c["query"].shape[1]]
            ids = FW.array(
                np.pad(ids, ((0, 0), (0, c["query"].shape[1] - ids.shape[1])), mode="edge"), "int32"
            )
            np.testing.assert_array_equal(np.asarray(jitted(*x, ids)), np.asarray(f(*x, ids)))
        assert len(traces) == 4  # one trace under jit, three eager calls
