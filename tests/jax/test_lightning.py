from tests.frameworks import JaxFramework
from tests.suites.lightning import LightningSuite


class TestJaxLightning(LightningSuite):
    fw = JaxFramework()
