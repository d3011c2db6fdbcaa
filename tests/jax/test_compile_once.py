from tests.frameworks import JaxFramework
from tests.suites.compile_once import CompileOnceSuite


class TestCompileOnce(CompileOnceSuite):
    fw = JaxFramework()

    def compiled(self, kernel) -> int:
        # jax-triton keeps its own cache of compiled kernels, keyed first by
        # the kernel.
        from jax_triton import triton_lib

        return sum(1 for key in triton_lib._COMPILED_KERNEL_CACHE if key[0] is kernel)
