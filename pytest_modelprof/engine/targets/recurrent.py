"""cuDNN's recurrent layers as PyTorch runs them: which algorithm a call takes, the kernels it runs, their time and the host's.

``aten._cudnn_rnn`` and ``aten._cudnn_rnn_backward`` (``nn.LSTM``, ``nn.GRU``, ``nn.RNN`` on a GPU) ask cuDNN for one of
three algorithms, chosen per call by ATen (``aten/src/ATen/native/cudnn/RNN.cpp``, ``get_algo``):

- ``"small"`` (``CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H``), for small hidden sizes: each layer and direction is one
  kernel that keeps its recurrent weights on chip and steps through time inside it;
- ``"static"`` (``CUDNN_RNN_ALGO_PERSIST_STATIC``), float16 only, one layer in one direction with sizes a multiple of
  128 and a batch the GPU's heuristics take (:func:`algorithm`): likewise one kernel over every step;
- ``"standard"``: every step of every layer and direction is a product with the recurrent weights (cuBLAS) and the
  cell's pointwise kernel (:data:`STEP_KERNELS`), each launched by the host, the weights read again each step.

Measured on an H100 and an H200 (cuDNN 9.19, torch 2.11; ``pytest_modelprof/data/gpu-truth/launch_probes.py``, its
``h100-rnn-algo.json``, ``h100-launch.json``, ``h200-launch.json`` and ``h200-rnn-split.json``):

- the choice follows ATen's rules but for bfloat16, which ran the standard algorithm at every size (ATen asks for the
  small one; cuDNN runs it step by step);
- a persistent kernel's time is a start (loading its weights) and a time per step, each a constant plus a cost per
  recurrent weight, in SM cycles (:data:`SMALL_CYCLES`); the small algorithm in float16 with a batch of 8 or more ran
  kernels on tensor cores with constants of their own; the static one's step grows with the batch, not the hidden
  size (:data:`STATIC_CYCLES`); a backward pass's persistent kernels start sooner and step slower than the forward's
  (:data:`BACKWARD_FACTORS`);
- the standard algorithm's products read the recurrent weights again each step, from the L2 where a layer's fit it
  (:func:`reread_seconds`);
- the host: a call costs it :data:`CALL_HOST` (its descriptors and workspaces; a backward call more, per layer and
  direction), and each step of the standard algorithm :data:`STEP_HOST` (a cuBLAS call and a launch), forward or
  backward: a two-layer LSTM over 256 steps issues 1,043 kernels in 10-14 ms where they run in 5.5-5.9 ms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple

import torch

from .products import argument, as_tensor

if TYPE_CHECKING:
    from .gpus import GPUSpec

Algorithm = Literal["standard", "small", "static"]

MODES = {0: "RNN_RELU", 1: "RNN_TANH", 2: "LSTM", 3: "GRU"}  # cuDNN's cudnnRNNMode_t, as ATen passes it
GATES = {0: 1, 1: 1, 2: 4, 3: 3}  # products with the recurrent weights a cell runs per step (rows of its weight)
# ATen's argument positions, forward and backward: mode, hidden size, projection, layers, batch_first, bidirectional,
# batch_sizes (a packed sequence's)
_FORWARD = (6, 7, 8, 9, 10, 13, 14)
_BACKWARD = (10, 11, 12, 13, 14, 17, 18)

# the standard algorithm, per step, layer and direction: forward the product and the cell's kernel (a GRU's and a plain
# RNN's in float32 a memset before the product too: 1,566 and 1,558 kernels over 2 layers and 256 steps, as the H100
# and the H200 ran at batch 32; at some other sizes cuBLAS's product took none), backward a memset beside them; and
# the products with the input, over chunks of steps: forward one per 32 steps, backward two per 16 (the input's
# gradient), then the weights' gradients (two): 1,040 and 1,644 kernels for a two-layer LSTM over 256 steps
STEP_KERNELS = {False: 2, True: 3}
CHUNK_STEPS = {False: 32, True: 8}
LAYER_KERNELS = {False: 0, True: 2}
# persistent algorithms, per layer and direction: the persistent kernel and its input's product; backward, also the
# weights' gradients and their memsets (a one-layer LSTM's training step ran 21 kernels, its inference 4, the initial
# states' and the loss's among them)
PERSISTENT_KERNELS = {False: 2, True: 8}

# a persistent kernel: start + per_weight * W, then each step step + step_weight * W + per_gate * gates, in SM cycles
# (W: the layer's recurrent weights, gates x hidden^2); fitted by benchmarks/recurrent.py on the forward persistent
# kernels of h100-rnn-algo.json and the two launch files (124 on CUDA cores, median |error| 6%, largest 22%; 60 on
# tensor cores, 5% and 21%)
SMALL_CYCLES = {  # (start, per_weight, step, step_weight, per_gate)
    "cuda_cores": (1344.0, 1.245, 526.0, 0.0154, 11.7),
    "tensor_cores": (62.0, 0.0019, 990.0, 0.0305, 293.0),
}
STATIC_CYCLES = (1192.0, 1928.0, 163.0)  # (start, step, step per sample in the batch): 18 kernels, median 16%, largest 42%
# a backward pass's persistent kernel against its forward's: its start and its steps (the launch files' one-layer to
# three-layer probes over 32 and 256 steps: the steps 1.55 times an LSTM's, 1.2 a GRU's, 1.47 a plain RNN's; the start
# 0.1 to 0.25 times)
BACKWARD_FACTORS = (0.2, 1.5)
TENSOR_CORE_BATCH = 8  # the small algorithm in float16 ran on tensor cores from this batch (1: on CUDA cores)

CALL_HOST = {False: (160e-6, 0.0), True: (200e-6, 330e-6)}  # seconds a call costs the host: (fixed, per layer and
# direction), forward and backward (over 12 persistent calls of one and two layers: forward 0.13-0.30 ms)
# the L2's rate against the memory's for what it holds: an elementwise kernel over what the kernel before it wrote, 24 to
# 36 MB in all, ran 1.9 (H100) and 1.6 (H200) times as fast as over what the L2 did not hold (h100-l2.json, h200-l2.json)
L2_REREAD = 1.7
# seconds each step of the standard algorithm costs the host, per layer and direction: by least squares over 16 to 256
# steps, an LSTM's 26 us in inference, 19 in a training forward, 20 backward; a GRU's 22, 23 and 38 (h200-rnn-split.json)
STEP_HOST = 20e-6


class Recurrent(NamedTuple):
    """One call of cuDNN's recurrent op, as the cost model needs it."""

    mode: int  # cuDNN's (:data:`MODES`)
    hidden: int
    inputs: int  # the input's features
    batch: int
    steps: int
    layers: int
    directions: int
    dtype: torch.dtype
    backward: bool
    packed: bool  # a packed sequence (batch_sizes given)
    projected: bool  # an LSTM with proj_size
    weight_bytes: int  # every layer's and direction's recurrent weights: what the standard algorithm reads each step

    @property
    def sequences(self) -> int:
        """The recurrences it runs one after another: its layers times its directions."""
        return self.layers * self.directions

    @property
    def recurrent_weights(self) -> int:
        """One layer's and direction's recurrent weights (elements): gates x hidden^2."""
        return GATES.get(self.mode, 1) * self.hidden * self.hidden


def recurrent_of(name: str, args: tuple[object, ...]) -> Recurrent | None:
    """The call's shape, from ``aten._cudnn_rnn``'s or ``aten._cudnn_rnn_backward``'s arguments; None for another op
    or arguments it cannot read."""
    if name not in ("aten._cudnn_rnn", "aten._cudnn_rnn_backward"):
        return None
    backward = name.endswith("_backward")
    x = as_tensor(argument(args, 0))
    positions = _BACKWARD if backward else _FORWARD
    mode, hidden, proj, layers, batch_first, bidirectional, batch_sizes = (argument(args, i) for i in positions)
    if x is None or x.dim() < 2 or not (isinstance(mode, int) and isinstance(hidden, int) and isinstance(layers, int)):
        return None
    sizes = batch_sizes if isinstance(batch_sizes, (list, tuple)) else ()  # a packed sequence's, one per step
    packed = len(sizes) > 0
    if packed:
        steps, batch = len(sizes), int(max(sizes))
    elif x.dim() == 3:  # (nn.LSTM and its kin give an unbatched sequence a batch of one before calling ATen)
        steps, batch = (x.shape[1], x.shape[0]) if batch_first is True else (x.shape[0], x.shape[1])
    else:
        return None
    directions = 2 if bidirectional is True else 1
    fields = (mode, hidden, int(x.shape[-1]), int(batch), int(steps), layers, directions, x.dtype, backward, packed, bool(proj))
    return Recurrent(*fields, _weight_bytes(args))


def algorithm(call: Recurrent, capability: tuple[int, int], sm_count: int) -> Algorithm:
    """The algorithm ATen asks cuDNN for on a GPU of ``capability`` with ``sm_count`` SMs (see the module's notes)."""
    if call.projected or call.packed or call.dtype in (torch.float64, torch.bfloat16):
        return "standard"
    if capability[0] >= 6 and call.hidden <= _small_limit(call.mode, call.backward):
        return "small"
    if call.dtype == torch.float16 and _static_common(call) and _static_device(call, capability, sm_count):
        return "static"
    return "standard"


def _small_limit(mode: int, backward: bool) -> int:
    """The largest hidden size ATen runs on the small algorithm: forward 384 (RNN) and 192 (LSTM, GRU), backward
    256 and 128."""
    plain = mode in (0, 1)
    if backward:
        return 256 if plain else 128
    return 384 if plain else 192


def _static_common(call: Recurrent) -> bool:
    return call.layers == 1 and call.directions == 1 and call.hidden <= 1024 and call.hidden % 128 == 0 and call.inputs % 128 == 0


def _static_device(call: Recurrent, capability: tuple[int, int], sm_count: int) -> bool:
    """ATen's batch rules for the static algorithm by GPU: Volta's by batch and length, Ampere and later with 98 SMs
    or more (not sm_86, nor GRUs) up to a batch of 128."""
    major, minor = capability
    batch = call.batch
    if major == 7:
        if minor == 5:
            return False
        steps = call.steps
        return ((batch % 16 == 0 and batch not in (80, 112)) or batch == 8) and (
            (steps >= 40 and batch <= 128) or (steps >= 20 and batch <= 96) or (steps >= 10 and batch <= 32)
        )
    if major >= 8 and sm_count >= 98 and minor != 6:
        if call.mode == 3:
            return False
        if call.mode == 2:
            return batch % 8 == 0 and batch <= 128
        return batch % 8 == 0 and batch <= 128 and (batch < 96 or call.hidden < 896)
    return False


def algorithm_on(gpu: GPUSpec, call: Recurrent) -> Algorithm:
    """:func:`algorithm` on ``gpu``; the standard one where its clock is not known (a persistent kernel's time is in
    cycles)."""
    return algorithm(call, gpu.compute_capability, gpu.sm_count) if gpu.boost_clock else "standard"


def kernels(call: Recurrent, chosen: Algorithm) -> int:
    """The kernels the call runs."""
    if chosen == "standard":
        backward = call.backward
        chunks = -(-call.steps // CHUNK_STEPS[backward])
        per_step = STEP_KERNELS[backward] + (not backward and call.mode != 2 and call.dtype == torch.float32)
        return (per_step * call.steps + chunks + LAYER_KERNELS[backward]) * call.sequences
    return PERSISTENT_KERNELS[call.backward] * call.sequences


def persistent_cycles(call: Recurrent, chosen: Algorithm) -> float:
    """SM cycles of the call's persistent kernels, one layer and direction after another (0 for the standard algorithm)."""
    if chosen == "standard":
        return 0.0
    if chosen == "static":
        start, step, per_sample = STATIC_CYCLES
        first, each = start, step + per_sample * call.batch
    else:
        unit = "tensor_cores" if call.dtype == torch.float16 and call.batch >= TENSOR_CORE_BATCH else "cuda_cores"
        start, per_weight, step, step_weight, per_gate = SMALL_CYCLES[unit]
        weights = call.recurrent_weights
        first, each = start + per_weight * weights, step + step_weight * weights + per_gate * GATES.get(call.mode, 1)
    if call.backward:
        first, each = first * BACKWARD_FACTORS[0], each * BACKWARD_FACTORS[1]
    return (first + call.steps * each) * call.sequences


def host_seconds(call: Recurrent, chosen: Algorithm) -> tuple[float, float]:
    """What the call costs the host beside an op's own issue: its fixed cost (before its first kernel), and the
    standard algorithm's steps (each launching its kernels, which the GPU runs meanwhile)."""
    fixed, per_sequence = CALL_HOST[call.backward]
    steps = call.steps * call.sequences if chosen == "standard" else 0
    return fixed + per_sequence * call.sequences, STEP_HOST * steps


def reread_seconds(call: Recurrent, chosen: Algorithm, bandwidth: float, l2_bytes: int) -> float:
    """The time the standard algorithm takes to read the recurrent weights again at every step beyond the first (its
    products are with them; the persistent algorithms keep them on chip), at ``bandwidth``, or :data:`L2_REREAD` times
    it where one layer's and direction's weights fit the GPU's L2 (``l2_bytes``; 0: not known)."""
    if chosen != "standard" or call.steps < 2:
        return 0.0
    cached = 0 < call.weight_bytes / call.sequences <= l2_bytes
    return call.weight_bytes * (call.steps - 1) / (bandwidth * (L2_REREAD if cached else 1.0))


def _weight_bytes(args: tuple[object, ...]) -> int:
    """Every layer's and direction's recurrent weights (``w_hh``, the second of each layer's weights), in bytes."""
    weights, stride = argument(args, 1), argument(args, 2)
    if not isinstance(weights, (list, tuple)) or not isinstance(stride, int) or stride < 2:
        return 0
    return sum(
        w.numel() * w.element_size() for w in (weights[i + 1] for i in range(0, len(weights) - 1, stride)) if isinstance(w, torch.Tensor)
    )
