from tests.frameworks import TorchFramework
from tests.suites.utils import UtilsSuite


class TestTorchUtils(UtilsSuite):
    fw = TorchFramework()
