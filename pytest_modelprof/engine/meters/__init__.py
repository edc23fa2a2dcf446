"""Meters: peers that each see the run's one stream of events and know nothing of each other.

A meter subclasses :class:`Meter` and overrides what it needs:

- :meth:`~Meter.start` sees the run's resident tensors before the step (parameters,
  buffers, inputs, gradients, optimizer state);
- :meth:`~Meter.op` sees every ATen op the step dispatches, with where it ran (an
  :class:`Op`: phase, module stack, autograd node);
- :meth:`~Meter.saved` sees each tensor autograd saves for the backward pass (a meter
  that overrides it costs a saved-tensors hook);
- :meth:`~Meter.region` hears the step move on: ``"loss"``, ``"optimizer"``, ``"end"``;
- :meth:`~Meter.contribute` writes the meter's figures into the :class:`~pytest_modelprof.results.Profile`.

The engine's own meters live here (:mod:`.flops`, :mod:`.memory`); one more is one more
file, handed to :func:`~pytest_modelprof.profile` as ``meters=[...]``::

    class OpsPerModule(Meter):
        def __init__(self):
            self.counts = collections.Counter()

        def op(self, op):
            self.counts[op.key[-1] if op.key else "<outside the model>"] += 1
"""

from ..observe.stream import Meter, Op, Place, overrides

__all__ = ["Meter", "Op", "Place", "overrides"]
