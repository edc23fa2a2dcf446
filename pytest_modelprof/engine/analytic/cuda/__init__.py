"""CUDA's kernel choices for a target GPU, made without a driver (attention backends, fused paths,
cuDNN RNN and CTC, device queries)."""
