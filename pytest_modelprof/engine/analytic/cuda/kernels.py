"""Kernel choices CUDA makes by asking the device, made here for a target GPU instead.

An analytic CUDA-target run takes most of CUDA's decisions from PyTorch itself: fake
tensors that claim ``cuda:0`` go through the CUDA dispatch keys (autocast's CUDA op
lists, cuDNN batch norm, the optimizers' foreach defaults). A few choices read the GPU's
properties at run time; without a GPU, PyTorch falls back to its slowest path. Those are
answered from the target's :class:`~...targets.gpus.GPUSpec`, by subject:

- :mod:`.attention`: the attention backend of ``scaled_dot_product_attention``, and what that
  function does around the chosen backend's op;
- :mod:`.rnn`: recurrent layers as one cuDNN kernel with its training reserve, the fused cells,
  and whether CTC takes cuDNN's kernel;
- :mod:`.functions`: the fused inference paths of ``nn.MultiheadAttention`` and
  ``nn.TransformerEncoderLayer``, and ``has_torch_function`` as plain CUDA tensors answer it;
- :mod:`.meta`: meta kernels of the CUDA ops PyTorch has none for;
- :mod:`.device`: the device queries a model makes, and autocast enabled as on the GPU.

:class:`CudaKernels` puts them in place for a run, but for its dispatch mode, :class:`~.rnn.CudaOps` (``CudaKernels.ops``),
which the run stacks with its other layers (see ``analytic/layers.py``): on its own, CudaKernels leaves the recurrent
ops and CTC's choice to the fake mode.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ...targets.gpus import GPUSpec
from ..fake import meta_kernels
from .attention import scaled_dot_product_attention
from .device import cuda_autocast_available, device_queries
from .functions import CudaFunctions, FusedPaths, has_torch_function
from .meta import META_KERNELS
from .rnn import RNN_MODES, CudaOps, recurrent


class CudaKernels:
    """While a fake CUDA-target run steps (a context manager): the choices of the modules above, as ``gpu`` would make them.

    ``scaled_dot_product_attention`` makes its choice inside one C++ function, without a
    dispatched op to answer; so ``torch.nn.functional.scaled_dot_product_attention`` is
    replaced for the run (and calls through a reference taken at import time are caught by
    a TorchFunctionMode) by :meth:`attention`, which does what that function does for the
    chosen backend: cast to autocast's dtype (it is on autocast's lower-precision list), call
    the backend's op (whose autograd formula runs its backward kernel), return its output.
    """

    def __init__(self, gpu: GPUSpec, values: Callable[[torch.Tensor], torch.Tensor | None] = lambda t: None) -> None:
        self.gpu = gpu
        self.values = values  # the values the run knows (engine/analytic/values.py), for choices that read them
        self.ops = CudaOps(values)  # its dispatch mode: a layer the run stacks with its others (see analytic/layers.py)

    def __enter__(self) -> CudaKernels:
        self._stock = F.scaled_dot_product_attention
        self._exits = contextlib.ExitStack()
        F.scaled_dot_product_attention = self.attention
        self._exits.callback(setattr, F, "scaled_dot_product_attention", self._stock)
        for name, mode in RNN_MODES.items():
            stock = getattr(torch._VF, name)
            setattr(torch._VF, name, recurrent(stock, mode))
            self._exits.callback(delattr, torch._VF, name)
        self._exits.enter_context(CudaFunctions(self.attention, FusedPaths(self.gpu, self.attention)))
        stock_check = torch.overrides.has_torch_function
        torch.overrides.has_torch_function = has_torch_function(stock_check)
        self._exits.callback(setattr, torch.overrides, "has_torch_function", stock_check)
        self._exits.enter_context(meta_kernels(META_KERNELS))  # ops of the fused paths PyTorch has no meta kernel for
        self._exits.enter_context(cuda_autocast_available(self.gpu))
        self._exits.enter_context(device_queries(self.gpu))
        # nn.LSTM's flatten_parameters() reads data pointers of CUDA weights (fake ones: all
        # alike, so it keeps the weights as they are); FakeTensor warns of that read
        self._exits.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="Accessing the data pointer of FakeTensor", category=UserWarning)
        return self

    def __exit__(self, *exc: object) -> None:
        self._exits.close()

    def attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        """``scaled_dot_product_attention`` as it runs on the target (:func:`.attention.scaled_dot_product_attention`)."""
        return scaled_dot_product_attention(
            self.gpu, self._stock, query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
