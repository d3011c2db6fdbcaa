from tests.frameworks import TorchFramework
from tests.suites.lightning import LightningSuite


class TestTorchLightning(LightningSuite):
    fw = TorchFramework()
