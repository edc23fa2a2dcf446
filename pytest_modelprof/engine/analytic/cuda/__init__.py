"""CUDA's kernel choices for a target GPU, made without a driver (attention backends, fused paths,
cuDNN RNN and CTC, device queries): see :mod:`.kernels`."""

from .attention import CUDNN, EFFICIENT, FLASH, MATH, sdp_backend
from .kernels import CudaKernels
from .rnn import reserve_bytes

__all__ = ["CUDNN", "EFFICIENT", "FLASH", "MATH", "CudaKernels", "reserve_bytes", "sdp_backend"]
