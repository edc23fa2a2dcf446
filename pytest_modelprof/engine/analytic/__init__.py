"""Analytic runs: the step on fake tensors, as the real device would run it, with no allocation
and no computation.

- :mod:`.modes`: the mode stack an analytic step runs under, in its order, in one place;
- :mod:`.fake`: the run's fake tensors and the meta kernels that stand in for real ones;
- :mod:`.values`: values an analytic run knows (constants, the caller's real tensors);
- :mod:`.beside`: ops made above the fake mode as it would make them (detaches, unsafe views, in-place foreach ops);
- :mod:`.paths`: the paths Python takes where it reads a fake tensor (libraries' eager paths, passing checks);
- :mod:`.routing`: data-dependent sizes of mixture-of-experts routing;
- :mod:`.kernel_outputs`: outputs a real kernel makes otherwise than its meta kernel;
- :mod:`.backward`: the Python backward pass of CUDA-target runs;
- :mod:`.cuda`: CUDA's own kernel choices, made for a target GPU without a driver.
"""
