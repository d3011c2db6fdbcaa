from tests.frameworks import JaxFramework
from tests.suites.lightning import LightningSuite


class TestJaxLightning(LightningSuite):
    fw = JaxFramework()
    kernel_cases = False  # BINDING_MATRIX: PyTorch's session runs the whole matrix
