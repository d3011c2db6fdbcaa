from tests.frameworks import TorchFramework
from tests.suites.decode import DecodeSuite


class TestTorchDecode(DecodeSuite):
    fw = TorchFramework()
