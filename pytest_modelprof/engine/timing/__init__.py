"""Time on real tensors: the latency of a step (:mod:`.latency`) and per-module and per-operator
times from :mod:`torch.profiler` (:mod:`.layers`)."""
