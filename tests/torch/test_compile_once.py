from tests.frameworks import TorchFramework
from tests.suites.compile_once import CompileOnceSuite


class TestCompileOnce(CompileOnceSuite):
    fw = TorchFramework()

    def compiled(self, kernel) -> int:
        # Triton keeps one dict of compiled variants per device.
        return sum(len(entry[0]) for entry in kernel.device_caches.values())
