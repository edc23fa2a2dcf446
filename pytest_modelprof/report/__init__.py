"""Reports: where raw numbers from the engine get units and layout."""

from .text import format_count, format_profile

__all__ = ["format_count", "format_profile"]
