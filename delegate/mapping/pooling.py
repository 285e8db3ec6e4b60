"""AVERAGE_POOL_2D, MAX_POOL_2D, L2_POOL_2D: TFLite -> NNAPI (implicit-padding signature)."""
from __future__ import annotations

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import PADDING, OptionsReader, ints
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator, TensorType
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
    x_t, y_t = ctx.input_tensor(0), ctx.output_tensor(0)
    if node.builtin_code == BuiltinOperator.L2_POOL_2D and x_t.type != TensorType.FLOAT32:
        raise MappingError("L2_POOL_2D is float32 only in NNAPI")
    if x_t.is_quantized and (x_t.scales[:1] != y_t.scales[:1]
                             or x_t.zero_points[:1] != y_t.zero_points[:1]):
        raise MappingError("NNAPI pooling needs the same input and output quantization")
    x = ctx.tensor(node.inputs[0])
    params = [ctx.padding(), ctx.int32(ctx.option("stride_w", 1)), ctx.int32(ctx.option("stride_h", 1)),
              ctx.int32(ctx.option("filter_width", 1)), ctx.int32(ctx.option("filter_height", 1)),
              ctx.fused_activation()]
    ctx.operation(_OPS[node.builtin_code], [x, *params], [ctx.tensor(node.outputs[0])])
