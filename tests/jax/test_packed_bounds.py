from core_triton.common.runtime import interpreter_requested
from tests.frameworks import JaxFramework
from tests.suites.packed_bounds import PackedBoundsSuite


class TestPackedBounds(PackedBoundsSuite):
    fw = JaxFramework()
    # On the interpreter BINDING_OPS (the PyTorch session runs every op); on
    # a GPU every op: jax-triton compiles the kernels with other
    # specialisations than PyTorch's launcher.
    kernel_cases = not interpreter_requested()
