"""Kernel scratch of recurrent layers.

**Recurrent layers** (:func:`rnn_scratch`): the layout copies and zeros ATen makes around
cuDNN's calls. cuDNN's own RNN workspace is sized by cuDNN at run time and not included.
"""

from __future__ import annotations

from typing import Any

import torch

from ...ops import bound_arguments


def rnn_scratch(name: str, func: Any, args: Any, kwargs: dict[str, Any]) -> list[int]:
    """What cuDNN's recurrent ops allocate around the cuDNN calls (aten/src/ATen/native/cudnn/RNN.cpp),
    beyond their outputs: the input in sequence-first layout (a batch-first input is transposed
    and copied); in the backward pass, zeros for the gradients it was not given (the final states'),
    that copy again for each of its two calls, and the output's gradient copied to sequence-first
    for the first; the weights' gradient buffer is made only for the second. cuDNN's own
    workspace is not included: its size comes from cuDNN at run time."""
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

    if name == "aten._cudnn_rnn":
        return [size for size in (relaid(source),) if size]
    output, hx, cx, grad_output = bound["output"], bound["hx"], bound["cx"], bound["grad_output"]
    states = ((hx, bound["grad_hy"]), (cx, bound["grad_cy"]))
    zeros = [t.numel() * t.element_size() for t, given in states if t is not None and given is None]
    if grad_output is None:  # zeros_like(output), contiguous in the output's shape
        zeros.append(output.numel() * output.element_size())
    dy = relaid(grad_output) if grad_output is not None else relaid(output, contiguous=True)
    weights = sum(w.numel() * w.element_size() for w in bound["weight"]) if bound["output_mask"][3] else 0
    # backward-data phase: the zeros, the input's and the output gradient's copies; backward-weights
    # phase: the zeros, the input's copy, and the weights' gradient (an output, counted as one)
    held = [size for size in (*zeros, relaid(source)) if size]
    return held + ([dy - weights] if dy > weights else [])
