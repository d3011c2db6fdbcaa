from tests.frameworks import TorchFramework
from tests.suites.flash_packed import FlashPackedSuite


class TestTorchFlashPacked(FlashPackedSuite):
    fw = TorchFramework()
