"""AVERAGE_POOL_2D, MAX_POOL_2D, L2_POOL_2D: TFLite -> NNAPI (implicit-padding signature).

TFLite's Pool2DOptions are NNAPI's implicit signature one for one; NNAPI's rules (float-only
L2_POOL_2D, the output keeping the input's quantization) are hal's validate's to check."""
from __future__ import annotations

from delegate.mapping.core import MappingContext, mapper
from delegate.mapping.options import PADDING, OptionsReader, ints
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator
from hal.types import OperationType

_OPS = {
    BuiltinOperator.AVERAGE_POOL_2D: OperationType.AVERAGE_POOL_2D,
    BuiltinOperator.MAX_POOL_2D: OperationType.MAX_POOL_2D,
    BuiltinOperator.L2_POOL_2D: OperationType.L2_POOL_2D,
}


def _read_pool(a: int) -> dict:
    padding, sw, sh, fw, fh, act = ints(a, 6)  # TfLitePoolParams
    return {"padding": PADDING.get(padding, -1), "stride_w": sw, "stride_h": sh, "filter_width": fw,
            "filter_height": fh, "fused_activation_function": act}


@mapper(*_OPS, options=OptionsReader("Pool2DOptions", _read_pool))
def map_pool(ctx: MappingContext, node: TfLiteNode) -> None:
    x = ctx.tensor(node.inputs[0])
    params = [ctx.padding(), ctx.int32(ctx.option("stride_w", 1)), ctx.int32(ctx.option("stride_h", 1)),
              ctx.int32(ctx.option("filter_width", 1)), ctx.int32(ctx.option("filter_height", 1)),
              ctx.fused_activation()]
    ctx.operation(_OPS[node.builtin_code], [x, *params], [ctx.tensor(node.outputs[0])])
