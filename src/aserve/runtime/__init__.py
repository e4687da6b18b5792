"""aserve's runtime: the code that runs inside every pool interpreter.

Pure Python, standard library only at import time, so that it loads in a private
libpython copy, in an isolated PEP 684 subinterpreter and in the host alike. It must
never import host-side packages (httptools, msgspec, the server).
"""

from .datatypes import DATATYPES, DataType
from .model import Model, TensorSpec
from .trace import span
from .weights import load_weights

__all__ = ["DATATYPES", "DataType", "Model", "TensorSpec", "load_weights", "span"]
