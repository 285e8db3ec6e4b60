"""RESIZE_BILINEAR, RESIZE_NEAREST_NEIGHBOR: TFLite -> NNAPI (output-size signature).

TFLite's size is a tensor, NNAPI's two scalars: the size must be a constant. NNAPI's rules
(types, equal quantization, positive sizes, not both align_corners and half_pixel_centers)
are hal's validate's.
"""
from __future__ import annotations

import numpy as np

from delegate.mapping.core import MappingContext, MappingError, mapper
from delegate.mapping.options import OptionsReader, bools
from delegate.tfl.graph import TfLiteNode
from delegate.tfl.schema import BuiltinOperator
from hal.types import OperationType

_OPS = {
    BuiltinOperator.RESIZE_BILINEAR: OperationType.RESIZE_BILINEAR,
    BuiltinOperator.RESIZE_NEAREST_NEIGHBOR: OperationType.RESIZE_NEAREST_NEIGHBOR,
}


def _read_resize(a: int) -> dict:
    align, half = bools(a, 2)  # TfLiteResizeBilinearParams / TfLiteResizeNearestNeighborParams
    return {"align_corners": align, "half_pixel_centers": half}


_OPTIONS = {BuiltinOperator.RESIZE_BILINEAR: OptionsReader("ResizeBilinearOptions", _read_resize),
            BuiltinOperator.RESIZE_NEAREST_NEIGHBOR: OptionsReader("ResizeNearestNeighborOptions", _read_resize)}


@mapper(*_OPS, options=_OPTIONS)
def map_resize(ctx: MappingContext, node: TfLiteNode) -> None:
    """TFLite's size tensor [new_h, new_w] must be constant; NNAPI takes width, then height."""
    size_t = ctx.input_tensor(1)
    if size_t.data is None:
        raise MappingError("the size input must be a constant tensor")
    size = np.asarray(size_t.data).reshape(-1)
    if size.size != 2:
        raise MappingError(f"the size input must hold 2 values, got {size.size}")
    align = bool(ctx.option("align_corners", False))
    half = bool(ctx.option("half_pixel_centers", False))
    x = ctx.tensor(node.inputs[0])
    params = [ctx.int32(size[1]), ctx.int32(size[0]), ctx.bool(False), ctx.bool(align), ctx.bool(half)]
    ctx.operation(_OPS[node.builtin_code], [x, *params], [ctx.tensor(node.outputs[0])])
