"""Robust statistics of timing samples, in plain Python (no torch, no numpy).

Latency samples on a shared machine are skewed and heavy-tailed: a preempted
repeat can take several times the usual. Everything here is order-based (median,
quartiles, a distribution-free interval for the median) so that one such repeat
moves nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation between order statistics."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def iqr(values: Sequence[float]) -> float:
    """The interquartile range: the spread of the middle half."""
    return quantile(values, 0.75) - quantile(values, 0.25)


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def std(values: Sequence[float]) -> float:
    """The sample standard deviation (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    centre = mean(values)
    return math.sqrt(math.fsum((v - centre) ** 2 for v in values) / (len(values) - 1))


def median_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """A two-sided distribution-free confidence interval for the median.

    The interval between the k-th smallest and k-th largest value covers the true
    median with probability ``1 - 2 P(Binomial(n, 1/2) < k)``; k is the largest that
    keeps this at least ``confidence``. It assumes only independent samples (no normal
    distribution, no equal spread). With too few samples for that confidence the
    interval is the whole range.
    """
    if not values:
        raise ValueError("median_interval of no values")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    ordered = sorted(values)
    n = len(ordered)
    tail = (1 - confidence) / 2
    # ordered[k] lies above the median when at most k samples fall below it: P(B <= k)
    k = -1
    cumulative = 0.0
    while k + 1 < (n + 1) // 2:
        cumulative += math.comb(n, k + 1) / 2**n
        if cumulative > tail:
            break
        k += 1
    k = max(k, 0)
    return ordered[k], ordered[n - 1 - k]
