"""Figures as people write them: never in scientific notation."""

from __future__ import annotations

import math


def plain(value: float, significant: int = 4, *, grouping: bool = True) -> str:
    """``value`` with at least ``significant`` significant digits and every digit of its
    integer part: ``88958.25 -> "88,958"``, ``3.6429747 -> "3.643"``, ``0.000176 -> "0.000176"``,
    ``1e-12 -> "0.000000000001"``. Trailing zeros after the point are dropped."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, significant - 1 - magnitude)
    text = f"{value:{',' if grouping else ''}.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text
