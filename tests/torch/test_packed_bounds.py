from tests.frameworks import TorchFramework
from tests.suites.packed_bounds import PackedBoundsSuite


class TestPackedBounds(PackedBoundsSuite):
    fw = TorchFramework()
