"""hal: the NNAPI model (types, validation, shape inference: hal/operations) and the backends
that compute it (hal/backends: the numpy reference backend, and faster ones).

Knows nothing of gRPC or TFLite. Importing hal loads no kernel: backends load on first compile.
"""
from hal.compiler import CompiledModel, compile_model  # noqa: F401
from hal.errors import HalError  # noqa: F401
from hal.executor import execute, execute_request  # noqa: F401
from hal.model import (  # noqa: F401
                       DataLocation,
                       Model,
                       ModelBuilder,
                       Operand,
                       Operation,
                       Request,
                       RequestArgument,
                       Subgraph,
                       SymmPerChannelQuantParams,
)
from hal.support import support_reasons, supported_operations  # noqa: F401
from hal.types import ErrorStatus, OperandLifeTime, OperandType, OperationType  # noqa: F401
