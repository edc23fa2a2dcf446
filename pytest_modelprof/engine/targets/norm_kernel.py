"""How ATen's layer and RMS norm backward pass launches the kernel of the weight's (and bias's) gradient.

The backward pass runs two kernels (aten/src/ATen/native/cuda/layer_norm_kernel.cu): the input's gradient, a
block per row, at the memory's bandwidth; then ``GammaBetaBackwardCUDAKernel``, which reads the output's
gradient and the input again and sums them down the rows, for each of the ``N`` columns of the normalised
shape (``LaunchGammaBetaBackwardCUDAKernel``):

- over 65536 rows and with fewer 32-column blocks than half the SMs, it splits the rows across blocks and sums
  their partial results after (its scratch: :mod:`.scratch.norms`): every SM takes part, and the bytes set its
  time;
- otherwise one block of 32 x 32 threads takes each 32 columns and walks every row: ``ceil(N / 32)`` blocks,
  as many SMs busy. A 768-wide norm keeps 24 of an H200's 132 SMs at work, each block at a rate of its own
  (``efficiency["norm_columns_rate"]``: elements per block and clock cycle), and that, not the bytes, is the
  kernel's time wherever its blocks are fewer than the SMs. Measured on an H200 (data/gpu-truth: the one-layer
  probes and the held-out steps), a bfloat16 norm over 4096 x 768 took 22-23 us where its bytes take 10, and a
  float32 one over 25088 x 192 (ConvNeXt's: 6 blocks) 129 us where they take 34.
"""

from __future__ import annotations

from .gpus import Calibration, GPUSpec
from .products import as_tensor

NORMS = frozenset({"aten.native_layer_norm_backward", "aten._fused_rms_norm_backward"})
BLOCK_COLUMNS = 32  # a block's columns (block_dim_x)
SPLIT_ROWS = 64 * 1024  # over this many rows (and few column blocks), the rows are split across blocks


def normalized_width(shape: object) -> int:
    """The elements of a norm's ``normalized_shape`` (its columns); 1 for none."""
    width = 1
    for size in shape if isinstance(shape, (list, tuple)) else ():
        width *= int(size)
    return width


def column_blocks(width: int) -> int:
    """The blocks of 32 columns the weight-gradient kernel of a norm ``width`` wide runs in."""
    return -(-width // BLOCK_COLUMNS)


def rows_split(rows: int, width: int, sm_count: int) -> bool:
    """Whether the weight-gradient kernel splits the rows across blocks (and sums their partial results after):
    over :data:`SPLIT_ROWS` rows with fewer 32-column blocks than half of the ``sm_count`` SMs."""
    return rows > SPLIT_ROWS and width // BLOCK_COLUMNS < sm_count // 2


def weight_gradient(name: str, args: tuple[object, ...]) -> int:
    """The width ``N`` (the normalised shape's elements) of a layer or RMS norm backward pass that computes its
    weight's or bias's gradient, whose kernel works column by column; 0 for any other op (or one that computes
    neither gradient)."""
    if name not in NORMS:
        return 0
    grad, shape = as_tensor(args[0] if args else None), args[2] if len(args) > 2 else None
    mask = args[-1] if args else None
    if grad is None or not isinstance(shape, (list, tuple)) or not isinstance(mask, (list, tuple)) or not any(mask[1:]):
        return 0
    width = normalized_width(shape)
    return width if width > 0 and grad.numel() >= width else 0


def weight_gradient_seconds(gpu: GPUSpec, calibration: Calibration, width: int, elements: int) -> float:
    """The time the weight-gradient kernel of a norm's backward pass (``width`` columns, over ``elements``
    elements of its input: a :class:`~.cost.Work`'s ``columns`` and ``elements``) takes on its blocks: two reads
    of each element at ``efficiency["norm_columns_rate"]`` per block and clock cycle, on as many SMs as it has
    blocks (see the module's notes); the cost model takes it where it outlasts the kernel's bytes. 0 where the
    rows are split across blocks (:func:`rows_split`), for a calibration without the rate (one fitted before it:
    the kernel by its bytes) or a GPU whose clock is not known."""
    rate = calibration.efficiency.get("norm_columns_rate")
    if not width or not elements or not rate or not gpu.boost_clock:
        return 0.0
    if rows_split(elements // width, width, gpu.sm_count):
        return 0.0
    # the output's gradient and the input, read again: two of the elements, on as many SMs as blocks
    return 2 * elements / (min(column_blocks(width), gpu.sm_count) * rate * gpu.boost_clock)
