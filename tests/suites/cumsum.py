"""The chunked-cumsum tests, written once; each framework's test module
subclasses these with its adapter (``fw``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from core_triton.cumsum.naive import cumsum_ref, cumsum_vjp_ref
from tests.reference import assert_close
from tests.suites.kernel_level import KernelLevelCases

# Packed sequences with an empty one in the middle and lengths that are not
# multiples of the chunk sizes; T = 37.
CU_SEQLENS = [0, 5, 5, 22, 37]
T = 37
# Longer sequences for the global sums, which run as two launches over
# chunks of 64 tokens under the interpreter, 256 on a GPU
# (core_triton.cumsum.plan): every sequence here spans several chunks and
# starts mid-chunk.
LONG_CU_SEQLENS = [0, 70, 70, 201, 203, 333]
# Sequences of several GPU chunks too.
SPLIT_CU_SEQLENS = [0, 130, 130, 1100, 1101, 1500]

FULL_MATRIX = list(
    itertools.product(
        ["scalar", "vector"],  # rank
        [False, True],  # head_first
        [False, True],  # reverse
        [None, 0.37],  # softmax_scale
        [False, True],  # packed (cu_seqlens)
    )
)


# A cross-section of FULL_MATRIX in which every option takes both values
# (indices 0, 5, 10, ...: the options are the index's bits): what a binding
# whose kernel_cases is False runs (tests/suites/kernel_level.py).
BINDING_MATRIX = FULL_MATRIX[::5]
# Half precision: FULL_MATRIX[::7] (indices 0, 7, 14, 21, 28: every option
# takes both values; the dtype is a load and store matter, CI time), and of
# those the binding's cross-section, each op packed (7) and not (28).
HALF_MATRIX = FULL_MATRIX[::7]
BINDING_HALF = [
    ("local", "bfloat16", None, FULL_MATRIX[7]),
    ("local", "float16", "float32", FULL_MATRIX[28]),
    ("global", "bfloat16", "float32", FULL_MATRIX[7]),
    ("global", "float16", None, FULL_MATRIX[28]),
]


def _shape(rank, head_first, packed, T=T):
    b = 1 if packed else 2
    h, s = 3, 5
    if rank == "scalar":
        return (b, h, T) if head_first else (b, T, h)
    return (b, h, T, s) if head_first else (b, T, h, s)


def _ids(case):
    rank, hf, rev, scale, packed = case
    words = [rank, "hf" if hf else "tf", "rev" if rev else "fwd"]
    words += ["scale" if scale else "noscale", "packed" if packed else "batched"]
    return "-".join(words)


class CumsumSuite(KernelLevelCases):
    fw = None  # set by the framework's module

    def _run(self, op, chunk, case, dtype="float32", output_dtype=None, seed=0, cu_seqlens=CU_SEQLENS):
        rank, head_first, reverse, scale, packed = case
        fw = self.fw
        rng = np.random.default_rng(seed)
        shape = _shape(rank, head_first, packed, cu_seqlens[-1])
        x = fw.array(rng.standard_normal(shape), dtype)
        cu = fw.array(cu_seqlens, "int32") if packed else None
        cu_ref = cu_seqlens if packed else None
        kwargs = dict(reverse=reverse, softmax_scale=scale, cu_seqlens=cu, head_first=head_first)
        if output_dtype is not None:
            kwargs["output_dtype"] = fw.dtype(output_dtype)
        out_dtype = output_dtype or dtype
        dy = fw.array(rng.standard_normal(shape), out_dtype)

        if op == "local":
            fn = lambda v: fw.api.chunk_local_cumsum(v, chunk, **kwargs)  # noqa: E731
        else:
            fn = lambda v: fw.api.chunk_global_cumsum(v, **kwargs)  # noqa: E731
        y, dx = fw.vjp(fn, x, dy)

        window = chunk if op == "local" else None
        ref = cumsum_ref(fw.numpy(x), window, reverse, scale, cu_ref, head_first)
        dref = cumsum_vjp_ref(fw.numpy(dy), window, reverse, scale, cu_ref, head_first)
        assert str(y.dtype).split(".")[-1] == out_dtype
        assert str(dx.dtype).split(".")[-1] == dtype
        assert_close(fw.numpy(y), ref, out_dtype, "output")
        assert_close(fw.numpy(dx), dref, dtype, "gradient")

    @pytest.mark.parametrize("case", FULL_MATRIX, ids=_ids)
    @pytest.mark.parametrize("chunk", [4, 16])
    def test_local_float32(self, case, chunk):
        self._kernel_level(case in BINDING_MATRIX and chunk == 16)
        self._run("local", chunk, case)

    @pytest.mark.parametrize("case", FULL_MATRIX, ids=_ids)
    @pytest.mark.parametrize("lengths", ["short", "long", "split"])
    def test_global_float32(self, case, lengths):
        # The cross-section: each case at one length, short and split in turn.
        binding = case in BINDING_MATRIX and lengths == ("short", "split")[BINDING_MATRIX.index(case) % 2]
        self._kernel_level(binding)
        cu = {"short": CU_SEQLENS, "long": LONG_CU_SEQLENS, "split": SPLIT_CU_SEQLENS}[lengths]
        self._run("global", None, case, cu_seqlens=cu)

    @pytest.mark.parametrize("op", ["local", "global"])
    @pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
    @pytest.mark.parametrize("output_dtype", [None, "float32"])
    @pytest.mark.parametrize("case", HALF_MATRIX, ids=_ids)
    def test_half_precision(self, op, dtype, output_dtype, case):
        # The cross-section: four of the eight (op, dtype, output_dtype),
        # in which each takes both values, each op packed and not.
        self._kernel_level((op, dtype, output_dtype, case) in BINDING_HALF)
        cu = LONG_CU_SEQLENS if op == "local" else SPLIT_CU_SEQLENS
        self._run(op, 8, case, dtype=dtype, output_dtype=output_dtype, cu_seqlens=cu)

    @pytest.mark.parametrize("packed", [False, True])
    @pytest.mark.parametrize("reverse", [False, True])
    def test_local_window_longer_than_a_block(self, packed, reverse):
        # chunk_size 512 > the kernel's 256-token block: windows span blocks.
        fw = self.fw
        rng = np.random.default_rng(1)
        lens = [300, 0, 700, 45]
        cu = np.concatenate([[0], np.cumsum(lens)]).tolist()
        shape = (1, cu[-1], 2) if packed else (2, 700, 2)
        x = fw.array(rng.standard_normal(shape))
        dy = fw.array(rng.standard_normal(shape))
        cu_arr = fw.array(cu, "int32") if packed else None
        y, dx = fw.vjp(lambda v: fw.api.chunk_local_cumsum(v, 512, reverse=reverse, cu_seqlens=cu_arr), x, dy)
        cu_ref = cu if packed else None
        assert_close(fw.numpy(y), cumsum_ref(fw.numpy(x), 512, reverse, None, cu_ref, False), "float32")
        assert_close(fw.numpy(dx), cumsum_vjp_ref(fw.numpy(dy), 512, reverse, None, cu_ref, False), "float32")

    @pytest.mark.parametrize("op", ["local", "global"])
    @pytest.mark.parametrize("features", [150, 581], ids=["one_program", "two_programs"])
    def test_packed_feature_tiles_per_program(self, op, features):
        # Packed input: a program scans several 64-feature tiles of its
        # window (150 features: three tiles in one program; 581: ten tiles,
        # eight per program, the second program's last six past the end).
        self._kernel_level()
        fw = self.fw
        rng = np.random.default_rng(4)
        shape = (1, CU_SEQLENS[-1], features)
        x, dy = fw.array(rng.standard_normal(shape)), fw.array(rng.standard_normal(shape))
        cu = fw.array(CU_SEQLENS, "int32")
        window = 4 if op == "local" else None
        if op == "local":
            fn = lambda v: fw.api.chunk_local_cumsum(v, 4, reverse=True, cu_seqlens=cu)  # noqa: E731
        else:
            fn = lambda v: fw.api.chunk_global_cumsum(v, reverse=True, cu_seqlens=cu)  # noqa: E731
        y, dx = fw.vjp(fn, x, dy)
        assert_close(fw.numpy(y), cumsum_ref(fw.numpy(x), window, True, None, CU_SEQLENS, False), "float32")
        dref = cumsum_vjp_ref(fw.numpy(dy), window, True, None, CU_SEQLENS, False)
        assert_close(fw.numpy(dx), dref, "float32", "gradient")

    @pytest.mark.parametrize("reverse", [False, True])
    def test_global_unequal_lengths(self, reverse):
        # The suffix sum of each sequence starts at its own last token.
        fw = self.fw
        x = fw.array(np.random.default_rng(2).standard_normal((1, 10, 1)))
        cu = [0, 2, 7, 7, 10]
        y = fw.api.chunk_global_cumsum(x, reverse=reverse, cu_seqlens=fw.array(cu, "int32"))
        assert_close(fw.numpy(y), cumsum_ref(fw.numpy(x), None, reverse, None, cu, False), "float32")

    def test_int64_cu_seqlens(self):
        fw = self.fw
        x = fw.array(np.random.default_rng(3).standard_normal((1, T, 2)))
        cu = np.asarray(CU_SEQLENS, np.int64)
        y = fw.api.chunk_local_cumsum(x, 4, cu_seqlens=fw.array(cu, "int32"))
        assert_close(fw.numpy(y), cumsum_ref(fw.numpy(x), 4, False, None, CU_SEQLENS, False), "float32")

    def test_empty_sequences_only_at_edges(self):
        fw = self.fw
        x = fw.array(np.random.default_rng(4).standard_normal((1, 9, 2, 3)))
        cu = [0, 0, 9, 9]
        y = fw.api.chunk_local_cumsum(x, 4, cu_seqlens=fw.array(cu, "int32"))
        assert_close(fw.numpy(y), cumsum_ref(fw.numpy(x), 4, False, None, cu, False), "float32")

    # ---- bad input -------------------------------------------------------

    def _x(self, shape=(1, T, 3), dtype="float32"):
        return self.fw.array(np.random.default_rng(5).standard_normal(shape), dtype)

    @pytest.mark.parametrize("op", ["local", "global"])
    def test_bad_rank(self, op):
        for shape in [(T, 3), (1, T, 3, 4, 5)]:
            with pytest.raises(ValueError, match="must be"):
                self._call(op, self._x(shape))

    @pytest.mark.parametrize("op", ["local", "global"])
    def test_bad_dtype(self, op):
        with pytest.raises(TypeError, match="dtype"):
            self._call(op, self.fw.array(np.arange(3 * T).reshape(1, T, 3), "int32"))
        with pytest.raises(TypeError, match="output_dtype"):
            self._call(op, self._x(), output_dtype=self.fw.dtype("int32"))

    def _call(self, op, x, **kwargs):
        if op == "local":
            return self.fw.api.chunk_local_cumsum(x, kwargs.pop("chunk_size", 4), **kwargs)
        return self.fw.api.chunk_global_cumsum(x, **kwargs)

    def test_bad_chunk_size(self):
        for bad, err in [
            (3, ValueError),
            (0, ValueError),
            (-4, ValueError),
            (4.0, TypeError),
            (True, TypeError),
        ]:
            with pytest.raises(err, match="chunk_size"):
                self._call("local", self._x(), chunk_size=bad)

    @pytest.mark.parametrize("op", ["local", "global"])
    def test_bad_cu_seqlens(self, op):
        fw = self.fw
        cu = fw.array(CU_SEQLENS, "int32")
        with pytest.raises(ValueError, match="batch"):
            self._call(op, self._x((2, T, 3)), cu_seqlens=cu)
        with pytest.raises(TypeError, match="cu_seqlens"):
            self._call(op, self._x(), cu_seqlens=fw.array(CU_SEQLENS, "float32"))
        with pytest.raises(ValueError, match="cu_seqlens"):
            self._call(op, self._x(), cu_seqlens=fw.array([CU_SEQLENS], "int32"))
        for values in ([1, 5, 22, 37], [0, 22, 5, 37], [0, 5, 22, 36], [0, 5, 22, 38]):
            with pytest.raises(ValueError, match="cu_seqlens"):
                fw.api.check_cu_seqlens(fw.array(values, "int32"), T)
        with pytest.raises(ValueError, match="cu_seqlens"):
            self._call(op, self._x(), cu_seqlens=fw.array([0], "int32"))
        with pytest.raises(TypeError):
            self._call(op, self._x(), cu_seqlens=list(CU_SEQLENS))

    @pytest.mark.parametrize("op", ["local", "global"])
    def test_bad_options(self, op):
        with pytest.raises(TypeError, match="softmax_scale"):
            self._call(op, self._x(), softmax_scale="0.5")
        with pytest.raises(ValueError, match="softmax_scale"):
            self._call(op, self._x(), softmax_scale=float("nan"))
        with pytest.raises(TypeError, match="reverse"):
            self._call(op, self._x(), reverse="yes")
        with pytest.raises(TypeError, match="head_first"):
            self._call(op, self._x(), head_first=1)
