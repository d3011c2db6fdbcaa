import jax
import numpy as np
import pytest

from tests.frameworks import JaxFramework
from tests.suites.utils import UtilsSuite

FW = JaxFramework()


class TestJaxUtils(UtilsSuite):
    fw = FW

    def test_static_size_utils_under_jit(self):
        api = FW.api
        cu = FW.array([0, 3, 3, 9], "int32")
        lens = jax.jit(api.prepare_lens)(cu)
        offsets = jax.jit(lambda c: api.prepare_chunk_offsets(c, 2))(cu)
        m = jax.jit(api.prepare_cu_seqlens_from_mask)(FW.array(np.tri(3, 4, dtype=np.int32), "int32"))
        assert np.asarray(lens).tolist() == [3, 0, 6]
        assert np.asarray(offsets).tolist() == [0, 2, 2, 5]
        assert np.asarray(m).tolist() == [0, 1, 3, 6]

    def test_value_sized_utils_under_jit_say_why(self):
        with pytest.raises(ValueError, match="concrete cu_seqlens"):
            jax.jit(FW.api.prepare_position_ids)(FW.array([0, 3, 9], "int32"))
