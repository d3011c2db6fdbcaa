from tests.frameworks import JaxFramework
from tests.suites.packed_bounds import PackedBoundsSuite


class TestPackedBounds(PackedBoundsSuite):
    fw = JaxFramework()
    kernel_cases = False  # BINDING_OPS: the PyTorch session runs every op
