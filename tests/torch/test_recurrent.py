import numpy as np

from tests.frameworks import TorchFramework
from tests.suites.recurrent import RecurrentSuite, check_case, make_case

FW = TorchFramework()


class TestTorchRecurrent(RecurrentSuite):
    fw = FW

    def test_non_contiguous_inputs(self):
        x, cu, cots = make_case(FW, gates=("g", "gk"), h0=True, seed=11)

        def fn(query, key, **kw):
            # Transposed views of another layout: the binding reads them right.
            q = query.transpose(1, 2).contiguous().transpose(1, 2)
            k = key.transpose(0, 1).contiguous().transpose(0, 1)
            assert not q.is_contiguous() and not k.is_contiguous()
            return FW.api.recurrent(q, k, **kw)

        check_case(FW, fn, x, cu, cots)

    def test_float64_is_refused(self):
        import pytest

        z = FW.torch.zeros(1, 2, 1, 3, dtype=FW.torch.float64, device=FW.device)
        with pytest.raises(TypeError, match="dtype"):
            FW.api.recurrent(z, z, z)
        assert np.isfinite(1.0)
