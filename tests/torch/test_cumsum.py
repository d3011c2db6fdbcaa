import numpy as np
import pytest

from core_triton.cumsum.naive import cumsum_ref, cumsum_vjp_ref
from tests.frameworks import TorchFramework
from tests.reference import assert_close
from tests.suites.cumsum import CumsumSuite

FW = TorchFramework()


class TestTorchCumsum(CumsumSuite):
    fw = FW

    @pytest.mark.parametrize("head_first", [False, True])
    def test_non_contiguous_input(self, head_first):
        # A transposed view (the strides of the other layout) needs no copy.
        rng = np.random.default_rng(6)
        other_layout = FW.array(rng.standard_normal((2, 3, 29, 4)))
        x = other_layout.transpose(1, 2)
        assert not x.is_contiguous()
        dy = FW.array(rng.standard_normal(tuple(x.shape)))
        y, dx = FW.vjp(lambda v: FW.api.chunk_local_cumsum(v, 8, head_first=head_first), x, dy)
        assert_close(FW.numpy(y), cumsum_ref(FW.numpy(x), 8, False, None, None, head_first), "float32")
        assert_close(FW.numpy(dx), cumsum_vjp_ref(FW.numpy(dy), 8, False, None, None, head_first), "float32")

    def test_float64_is_refused(self):
        with pytest.raises(TypeError, match="dtype"):
            FW.api.chunk_global_cumsum(FW.torch.zeros(1, 4, 2, dtype=FW.torch.float64, device=FW.device))
