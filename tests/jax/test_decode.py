from tests.frameworks import JaxFramework
from tests.suites.decode import DecodeSuite


class TestJaxDecode(DecodeSuite):
    fw = JaxFramework()
