"""The op registry: the engine's lowest layer, what it knows of ATen ops (torch and the standard library only).

:mod:`.registry` is to ops what :mod:`pytest_modelprof.metrics` is to metrics: one table that the
FLOP formulas, the cost model, kernel scratch and the kernel outputs of analytic runs all read.
:mod:`.calls` holds what is true of a call of any op, :mod:`.iteration` TensorIterator's order of
dimensions.
"""

from .calls import DEVICE_QUERY, VALUES_LIMIT, beneath_the_run, bound_arguments, fake_device
from .iteration import reorder_dimensions
from .registry import (
    COMMUNICATION_NAMESPACES,
    ELEMENTWISE_FLOPS,
    LOSS_BACKWARD_FLOPS,
    LOSS_FLOPS,
    MARKERS,
    METADATA,
    REDUCED_LOSSES,
    REDUCTION_FLOPS,
    REGISTRY,
    Family,
    Kernel,
    OpInfo,
    op_info,
    packet_of,
)

__all__ = [
    "COMMUNICATION_NAMESPACES",
    "DEVICE_QUERY",
    "ELEMENTWISE_FLOPS",
    "LOSS_BACKWARD_FLOPS",
    "LOSS_FLOPS",
    "MARKERS",
    "METADATA",
    "REDUCED_LOSSES",
    "REDUCTION_FLOPS",
    "REGISTRY",
    "VALUES_LIMIT",
    "Family",
    "Kernel",
    "OpInfo",
    "beneath_the_run",
    "bound_arguments",
    "fake_device",
    "op_info",
    "packet_of",
    "reorder_dimensions",
]
