"""What a step runs on, modelled: a lower layer of the engine, importing nothing above it (only the op
registry, :mod:`..ops`).

- :mod:`.gpus`: the GPUs a profile can target, with named figures, and what each compute capability
  fixes (:class:`.gpus.Architecture`); calibration files of the predicted-time model.
- :mod:`.allocator`: the CUDA caching allocator's reserved bytes and the cuBLAS workspaces.
- :mod:`.cost`: the predicted-time model, one kernel at a time.
- :mod:`.cudnn`: cuDNN's convolution workspaces, asked of cuDNN itself without a GPU.
- :mod:`.scratch`: what a CUDA kernel allocates inside one op call, one module per kind of op.
"""
