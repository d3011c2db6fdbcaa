"""Packed-sequence utility tests, written once for both frameworks."""

from __future__ import annotations

import numpy as np
import pytest


class UtilsSuite:
    fw = None

    def _np(self, x):
        return np.asarray(self.fw.numpy(x)).astype(np.int64)

    def test_spec_example(self):
        api, cu = self.fw.api, self.fw.array([0, 3, 5, 9], "int32")
        assert self._np(api.prepare_lens(cu)).tolist() == [3, 2, 4]
        assert self._np(api.prepare_position_ids(cu)).tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
        assert self._np(api.prepare_sequence_ids(cu)).tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
        ti = self._np(api.prepare_token_indices(cu))
        assert ti.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [2, 2], [2, 3]]

    def test_zero_length_sequences_keep_ids(self):
        api, cu = self.fw.api, self.fw.array([0, 0, 3, 3, 5, 5], "int32")
        assert self._np(api.prepare_lens(cu)).tolist() == [0, 3, 0, 2, 0]
        assert self._np(api.prepare_sequence_ids(cu)).tolist() == [1, 1, 1, 3, 3]
        assert self._np(api.prepare_position_ids(cu)).tolist() == [0, 1, 2, 0, 1]
        assert self._np(api.prepare_chunk_offsets(cu, 2)).tolist() == [0, 0, 2, 2, 3, 3]
        assert self._np(api.prepare_chunk_indices(cu, 2)).tolist() == [[1, 0], [1, 1], [3, 0]]

    def test_chunks(self):
        api, cu = self.fw.api, self.fw.array([0, 5, 5, 22, 37], "int32")
        offsets = self._np(api.prepare_chunk_offsets(cu, 4))
        assert offsets.tolist() == [0, 2, 2, 7, 11]
        idx = self._np(api.prepare_chunk_indices(cu, 4))
        expect = [[0, 0], [0, 1]] + [[2, i] for i in range(5)] + [[3, i] for i in range(4)]
        assert idx.tolist() == expect

    def test_from_mask(self):
        api = self.fw.api
        mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], bool)
        m = self.fw.array(mask.astype(np.int32), "int32")
        assert self._np(api.prepare_lens_from_mask(m)).tolist() == [3, 1, 0, 4]
        assert self._np(api.prepare_cu_seqlens_from_mask(m)).tolist() == [0, 3, 4, 4, 8]

    def test_cdiv(self):
        assert self.fw.api.cdiv(7, 2) == 4 and self.fw.api.cdiv(8, 2) == 4 and self.fw.api.cdiv(0, 3) == 0

    def test_bad_cu_seqlens(self):
        api = self.fw.api
        with pytest.raises(TypeError, match="cu_seqlens"):
            api.prepare_lens(self.fw.array([0.0, 1.0], "float32"))
        with pytest.raises(ValueError, match="cu_seqlens"):
            api.prepare_lens(self.fw.array([[0, 1]], "int32"))
        with pytest.raises(ValueError, match="chunk_size"):
            api.prepare_chunk_offsets(self.fw.array([0, 1], "int32"), 3)

    def test_check_cu_seqlens(self):
        api, fw = self.fw.api, self.fw
        api.check_cu_seqlens(fw.array([0, 3, 3, 7], "int32"), 7)  # returns quietly
        api.check_cu_seqlens(fw.array([0], "int32"), 0)
        for values, message in (
            ([1, 3, 7], r"cu_seqlens\[0\] must be 0, got 1"),
            ([0, 4, 3, 7], "non-decreasing"),
            ([0, 3, 6], r"cu_seqlens\[-1\] must equal seq_len .*\(7\), got 6"),
            ([0, 3, 8], r"\(7\), got 8"),
        ):
            with pytest.raises(ValueError, match=message):
                api.check_cu_seqlens(fw.array(values, "int32"), 7)
        with pytest.raises(TypeError, match="cu_seqlens"):
            api.check_cu_seqlens(fw.array([0.0, 7.0], "float32"), 7)
        with pytest.raises(ValueError, match="cu_seqlens"):
            api.check_cu_seqlens(fw.array([[0, 7]], "int32"), 7)

    def test_identity_dtype_convert(self):
        fw = self.fw
        convert = fw.api.identity_dtype_convert(fw.dtype("bfloat16"))
        x = fw.array(np.random.default_rng(0).standard_normal(5), "float32")
        dy = fw.array(np.random.default_rng(1).standard_normal(5), "float32")
        y, dx = fw.vjp(convert, x, dy)
        np.testing.assert_array_equal(fw.numpy(y), fw.numpy(x))
        # The cotangent passed through bfloat16: its values are rounded so
        # (PyTorch's engine then casts them back to x's dtype).
        rounded = fw.numpy(fw.array(fw.numpy(dy), "bfloat16"))
        np.testing.assert_array_equal(fw.numpy(dx), rounded)
        assert not np.array_equal(rounded, fw.numpy(dy))
