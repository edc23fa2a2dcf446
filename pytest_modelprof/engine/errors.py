"""Errors the engine raises."""


class ProfileError(RuntimeError):
    """The workload could not be profiled: bad input, or the model raised."""


class FormulaError(ProfileError):
    """A FLOP formula failed or returned something that is not a cost."""
