"""Kernel scratch of recurrent layers.

**Recurrent layers** (:func:`rnn_scratch`): the layout copies and zeros ATen makes around
cuDNN's calls, and cuDNN's workspace for each call (:func:`workspace_bytes`).
"""

from __future__ import annotations

from typing import Any

import torch

from ...ops import bound_arguments
from ..recurrent import GATES


def workspace_bytes(mode: int, rows: int, hidden: int, layers: int, directions: int, element: int) -> int:
    """The workspace ``cudnnGetRNNTempSpaceSizes`` asks for a recurrent call over ``rows`` rows (steps times batch):
    each layer's and direction's gate pre-activations for every row, the products of the inputs with the input
    weights that cuDNN runs for the whole sequence at once before stepping through it, every layer's kept at once
    (cuDNN runs a layer's step beside the layer below's next one). PyTorch allocates it inside each call: the
    forward's (at the inference mode's size without grad, the training mode's with it) and each of the backward's
    two (the data's, then the weights', at the training mode's). Measured on an H100 and an H200 (cuDNN 9.19): an
    LSTM of 2 layers of 1024, 256 steps of 32 in float32 allocates 256 MiB more than its outputs and ATen's copies,
    in inference and in training alike. Not measured: other shapes and cells, float16 and bfloat16 (priced at the
    input's element size, though cuDNN computes them in float), packed sequences (priced as padded to the longest)."""
    return directions * layers * rows * GATES[mode] * hidden * element


def rnn_scratch(name: str, func: Any, args: Any, kwargs: dict[str, Any]) -> list[int]:
    """What cuDNN's recurrent ops allocate around the cuDNN calls (aten/src/ATen/native/cudnn/RNN.cpp),
    beyond their outputs: the input in sequence-first layout (a batch-first input is transposed
    and copied); in the backward pass, zeros for the gradients it was not given (the final states'),
    that copy again for each of its two calls, and the output's gradient copied to sequence-first
    for the first; the weights' gradient buffer is made only for the second. Each call holds cuDNN's
    workspace (:func:`workspace_bytes`) while it runs."""
    if name not in ("aten._cudnn_rnn", "aten._cudnn_rnn_backward"):
        return []
    bound = bound_arguments(func, args, kwargs)
    source, batch_first, packed = bound["input"], bound["batch_first"], bool(bound["batch_sizes"])

    def relaid(tensor: torch.Tensor, contiguous: bool = False) -> int:
        """Bytes of the copy ``tensor.transpose(0, 1).contiguous()`` (batch first) or ``.contiguous()``
        makes (``contiguous``: of a contiguous tensor of ``tensor``'s shape)."""
        if batch_first and not packed and tensor.dim() == 3:
            copies = tensor.shape[0] > 1 and tensor.shape[1] > 1 if contiguous else not tensor.transpose(0, 1).is_contiguous()
        else:
            copies = not contiguous and not tensor.is_contiguous()
        return tensor.numel() * tensor.element_size() if copies else 0

    sizes = list(bound["batch_sizes"] or ())
    rows = len(sizes) * int(sizes[0]) if packed else source.numel() // max(source.shape[-1], 1)  # packed: as padded
    directions = 2 if bound["bidirectional"] else 1
    workspace = workspace_bytes(bound["mode"], rows, bound["hidden_size"], bound["num_layers"], directions, source.element_size())
    if name == "aten._cudnn_rnn":
        return [size for size in (relaid(source), workspace) if size]
    output, hx, cx, grad_output = bound["output"], bound["hx"], bound["cx"], bound["grad_output"]
    states = ((hx, bound["grad_hy"]), (cx, bound["grad_cy"]))
    zeros = [t.numel() * t.element_size() for t, given in states if t is not None and given is None]
    if grad_output is None:  # zeros_like(output), contiguous in the output's shape
        zeros.append(output.numel() * output.element_size())
    dy = relaid(grad_output) if grad_output is not None else relaid(output, contiguous=True)
    weights = sum(w.numel() * w.element_size() for w in bound["weight"]) if bound["output_mask"][3] else 0
    # backward-data phase: the zeros, the input's and the output gradient's copies; backward-weights
    # phase: the zeros, the input's copy, and the weights' gradient (an output, counted as one)
    held = [size for size in (*zeros, relaid(source), workspace) if size]
    return held + ([dy - weights] if dy > weights else [])
