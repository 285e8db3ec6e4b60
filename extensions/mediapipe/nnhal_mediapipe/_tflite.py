"""What the four mappers share: which op versions MediaPipe registers, and option errors as refusals.

MediaPipe's CPU op resolver (mediapipe/util/tflite/cpu_op_resolver.cc) registers
Convolution2DTransposeBias at version 1 and the V2 kernels of TransformTensorBilinear,
TransformLandmarks and Landmarks2TransformMatrix at version 2 only; TFLite looks a CUSTOM op up by
(custom_code, version), so a model carrying another version has no MediaPipe kernel either.
But a delegate cannot see the version of a custom op TFLite has no kernel for: TFLite's stub
registration for an unresolved custom op always says version 1. So the V2 ops accept 1 or 2; the
V1 kernels they would be confused with take other input ranks (TransformLandmarks) or other
option keys (Landmarks2TransformMatrix), which the V2 specs and option readers refuse, and
TransformTensorBilinear's V1 kernel is registered under another name (TransformTensor).

Delegate imports stay inside functions: hal and the service load this package without TFLite.
"""
from __future__ import annotations

from typing import Any, Iterable

NAME = "com.google.mediapipe"


def mapping_error(message: str) -> Exception:
    from nnhal.delegate.mapping import MappingError
    return MappingError(message)


def expect_node(node, code: str, versions: tuple[int, ...], n_inputs: int, n_outputs: int = 1) -> None:
    """The CUSTOM node has an accepted version and MediaPipe's input/output counts."""
    if node.version not in versions:
        raise mapping_error(f"{code}: version {node.version} is not supported (accepted: "
                            f"{', '.join(map(str, versions))})")
    if len(node.inputs) != n_inputs or len(node.outputs) != n_outputs or min(node.inputs, default=0) < 0:
        raise mapping_error(f"{code}: expected {n_inputs} inputs and {n_outputs} output(s), got "
                            f"{len(node.inputs)} and {len(node.outputs)}")


def flexbuffer_options(node, code: str, required: Iterable[str] = ()) -> dict[str, Any]:
    """The node's FlexBuffer map; a malformed one is a refusal (the node stays with TFLite)."""
    from nnhal.extensions.options import CustomOptionsError, flexbuffer_map
    try:
        return flexbuffer_map(node.custom_options, code, required)
    except CustomOptionsError as e:
        raise mapping_error(str(e)) from None


def number(options: dict, key: str, code: str, kind: type, default=None):
    """``options[key]`` as int or float, as flexbuffers' AsInt32 / AsFloat convert either kind of number."""
    v = options.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise mapping_error(f"{code}: custom option {key} must be a number, got {v!r}")
    if kind is int and v != int(v):
        raise mapping_error(f"{code}: custom option {key} must be a whole number, got {v!r}")
    return kind(v)
