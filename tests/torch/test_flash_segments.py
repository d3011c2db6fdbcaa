from tests.frameworks import TorchFramework
from tests.suites.flash_segments import FlashSegmentsSuite


class TestTorchFlashSegments(FlashSegmentsSuite):
    fw = TorchFramework()
