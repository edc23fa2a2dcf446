"""Reports: where raw numbers from the engine get units and layout."""

from .export import write_modules_csv, write_ops_csv
from .plots import plot_monitor
from .tables import (
    format_collectives,
    format_memory_report,
    format_model_graph,
    format_op_table,
    format_predicted,
    format_profile,
    format_top,
    format_tree_table,
    top_module_types,
)
from .text import format_count, format_header

__all__ = [
    "format_collectives",
    "format_count",
    "format_header",
    "format_memory_report",
    "format_model_graph",
    "format_op_table",
    "format_predicted",
    "format_profile",
    "format_top",
    "format_tree_table",
    "plot_monitor",
    "top_module_types",
    "write_modules_csv",
    "write_ops_csv",
]
