"""TFLite builtin -> NNAPI mapping table. Importing this package registers every mapper."""
from delegate.mapping import (  # noqa: F401  (each module registers its mappers)
    activations,
    concatenation,
    conv,
    elementwise,
    fully_connected,
    pad,
    pooling,
    quantization,
    reduce,
    resize,
    shape,
    softmax,
    strided_slice,
)
from delegate.mapping.core import (  # noqa: F401
    ConvertedPartition,
    InvalidNnapiOperation,
    MappingContext,
    MappingError,
    convert_partition,
    lookup_mapper,
    map_node,
    mapper,
    partition_io,
)
