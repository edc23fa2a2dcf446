"""What a step runs on, modelled: the CUDA caching allocator (:mod:`.allocator`)."""
