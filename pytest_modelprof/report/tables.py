"""Text reports of a :class:`~pytest_modelprof.Profile`: the annotated module graph, the
module tree table, top-k module types and the operator table.

Every report reads the profile only (no second measurement). Figures are shown with
decimal prefixes (``human=True``) or as raw integers; columns whose figures no module
has (memory, time: measured by other meters) are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .._format import plain
from ..results import ModuleStats, Profile
from .text import format_count, format_header, format_seconds


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[ModuleStats], float | None]
    share_of: Callable[[Profile], float] | None = None  # show "(x%)" of this total
    unit: str = ""


def module_columns(profile: Profile) -> list[Column]:
    """The figure columns this profile has figures for."""
    columns = [
        Column("params", lambda m: m.params, lambda p: p.params),
        Column("MACs", lambda m: m.macs, lambda p: p.macs),
        Column("fwd FLOPs", lambda m: m.forward_flops),
    ]
    if profile.train:
        columns.append(Column("bwd FLOPs", lambda m: m.backward_flops))
    if profile.recompute_flops:
        columns.append(Column("recomputed", lambda m: m.recompute_flops))
    if profile.memory is not None:
        if profile.train:
            columns.append(Column("activations", lambda m: m.activation_bytes, unit="B"))
        columns.append(Column("peak memory", lambda m: m.peak_bytes, unit="B"))
    if profile.modules and profile.modules[0].forward_seconds is not None:
        columns.append(Column("calls", lambda m: m.calls))
        columns.append(Column("fwd time", lambda m: m.forward_seconds, unit="s"))
        columns.append(Column("self fwd", lambda m: m.self_forward_seconds, unit="s"))
        if profile.train:
            columns.append(Column("bwd time", lambda m: m.backward_seconds, unit="s"))
            columns.append(Column("self bwd", lambda m: m.self_backward_seconds, unit="s"))
        if profile.device.startswith("cuda"):
            columns.append(Column("fwd CUDA", lambda m: m.forward_device_seconds, unit="s"))
            if profile.train:
                columns.append(Column("bwd CUDA", lambda m: m.backward_device_seconds, unit="s"))
        whole = _seconds(profile.modules[0])
        columns.append(Column("time share", lambda m: _seconds(m) / whole if whole else None))
    if profile.predicted is not None:
        target = profile.predicted.target
        columns.append(
            Column(f"{target} time", lambda m: m.predicted_seconds, lambda p: p.predicted.gpu_seconds if p.predicted else 0.0, unit="s")
        )
    if profile.world_size is not None:
        columns.append(Column("comm", lambda m: m.comm_bytes, lambda p: p.comm_bytes or 0, unit="B"))
    columns.append(Column("share", lambda m: m.share))
    return columns


def _seconds(module: ModuleStats) -> float:
    """A module's time in the workload: its forward and backward, children included."""
    return (module.forward_seconds or 0.0) + (module.backward_seconds or 0.0)


def _number(value: float | None, human: bool, unit: str = "") -> str:
    if value is None:
        return ""
    if unit == "s":
        return format_seconds(value) if human else plain(value, 6, grouping=False)
    if human:
        return format_count(value, unit)
    return f"{value:.0f}" if float(value).is_integer() else plain(value, 6, grouping=False)


def _cell(column: Column, module: ModuleStats, profile: Profile, human: bool) -> str:
    value = column.value(module)
    if column.header in ("share", "time share"):
        return f"{value:.1%}" if value is not None else ""
    text = _number(value, human, column.unit)
    if column.share_of is not None and value is not None:
        total = column.share_of(profile)
        text += f" ({value / total:.1%})" if total else ""
    return text


def _type(module: ModuleStats) -> str:
    """A module's type, marked when its figures are its children's sums (a container never called itself)."""
    return f"{module.type} (sum)" if module.container else module.type


def visible_modules(profile: Profile, depth: int | None = None, ignore: Iterable[str] = ()) -> list[ModuleStats]:
    """Modules in tree order down to ``depth``, without those whose type or path is in
    ``ignore`` (and without their descendants)."""
    ignored = set(ignore)
    hidden: list[str] = []
    shown = []
    for module in profile.modules:
        if any(module.path == h or module.path.startswith(h + ".") for h in hidden):
            continue
        if module.path and (module.type in ignored or module.path in ignored):
            hidden.append(module.path)
            continue
        if depth is None or module.depth <= depth:
            shown.append(module)
    return shown


def _children(modules: list[ModuleStats]) -> dict[str, list[ModuleStats]]:
    """Each shown module's shown children, in tree order (the nearest shown ancestor is the parent)."""
    present = {m.path for m in modules}
    children: dict[str, list[ModuleStats]] = {}
    for module in modules[1:]:
        parent = module.path
        while parent:
            parent = parent.rpartition(".")[0]
            if parent in present:
                break
        children.setdefault(parent, []).append(module)
    return children


def format_model_graph(profile: Profile, depth: int | None = None, ignore: Iterable[str] = (), human: bool = True) -> str:
    """The model printed as ``nn.Module`` prints itself, each module annotated with its figures."""
    modules = visible_modules(profile, depth, ignore)
    children = _children(modules)
    columns = [c for c in module_columns(profile) if c.header != "share"]

    def render(module: ModuleStats, indent: str) -> list[str]:
        label = f"({module.name}): {_type(module)}" if module.path else module.type
        figures = ", ".join(f"{_cell(c, module, profile, human)} {c.header}" for c in columns)
        figures += f", {module.share:.1%} of FLOPs"
        below = children.get(module.path, [])
        if not below:
            return [f"{indent}{label}({figures})"]
        lines = [f"{indent}{label}(", f"{indent}  {figures}"]
        for child in below:
            lines += render(child, indent + "  ")
        return [*lines, f"{indent})"]

    return "\n".join(render(modules[0], ""))


def format_tree_table(
    profile: Profile,
    depth: int | None = None,
    ignore: Iterable[str] = (),
    human: bool = True,
    ops: bool = False,
    name_width: int = 60,
) -> str:
    """One aligned row per module under box-drawing guides; with ``ops``, each module's own
    operators as rows beneath it."""
    modules = visible_modules(profile, depth, ignore)
    columns = module_columns(profile)
    rows: list[tuple[str, str, list[str]]] = []
    for module, guide in zip(modules, _guides(modules)):
        name = module.name if module.path else profile.model
        rows.append((_fit_tree(guide, name, name_width), _type(module), [_cell(c, module, profile, human) for c in columns]))
        if ops:
            below = _continuation(guide)
            for op in module.ops:
                if op.flops:
                    rows.append((_fit_tree(below, f"· {op.op} x{op.calls}", name_width), op.phase, _op_cells(op, columns, profile, human)))
    headers = ["module", "type", *(c.header for c in columns)]
    table = [(headers[0], headers[1], headers[2:]), *rows]
    name_col = min(name_width, max(len(r[0]) for r in table))
    type_col = min(24, max(len(r[1]) for r in table))
    widths = [max(len(r[2][i]) for r in table) for i in range(len(columns))]
    lines = []
    for name, kind, cells in table:
        figures = "  ".join(cell.rjust(width) for cell, width in zip(cells, widths))
        lines.append(f"{_fit(name, name_col)}  {_fit(kind, type_col)}  {figures}".rstrip())
    return "\n".join(lines)


_PHASE_COLUMNS = {"fwd FLOPs": "forward", "bwd FLOPs": "backward", "recomputed": "recompute"}


def _op_cells(op: Any, columns: list[Column], profile: Profile, human: bool) -> list[str]:
    """An operator row under its module: its MACs, its FLOPs in its phase's column, its share."""
    cells = []
    for column in columns:
        if column.header == "MACs":
            cells.append(_number(op.macs, human))
        elif _PHASE_COLUMNS.get(column.header) == op.phase:
            cells.append(_number(op.flops, human))
        elif column.header == "share" and profile.flops:
            cells.append(f"{op.flops / profile.flops:.1%}")
        else:
            cells.append("")
    return cells


def _guides(modules: list[ModuleStats]) -> list[str]:
    """The box-drawing prefix of each module's name, in the order of ``modules``."""
    children = _children(modules)
    prefix: dict[str, str] = {"": ""}

    def visit(path: str, above: str) -> None:
        below = children.get(path, [])
        for index, child in enumerate(below):
            last = index == len(below) - 1
            prefix[child.path] = above + ("└── " if last else "├── ")
            visit(child.path, above + ("    " if last else "│   "))

    visit("", "")
    return [prefix[m.path] for m in modules]


def _continuation(guide: str) -> str:
    """The prefix for rows under a module: its guide with the branch turned into a line."""
    if not guide:
        return ""
    return guide[:-4] + ("    " if guide.endswith("└── ") else "│   ")


def _fit_tree(guide: str, name: str, width: int) -> str:
    """``guide + name`` in ``width`` characters; in deep trees the outer guides give way
    (to a leading "…") before the name does."""
    room = max(width // 2, width - len(name))
    if len(guide) > room:
        guide = "…" + guide[len(guide) - room + 1 :]
    return guide + name


def _fit(text: str, width: int) -> str:
    return text.ljust(width) if len(text) <= width else text[: width - 1] + "…"


TOP_METRICS: dict[str, Callable[[ModuleStats], float]] = {
    "params": lambda m: m.params,
    "macs": lambda m: m.macs,
    "flops": lambda m: m.flops,
    "forward_flops": lambda m: m.forward_flops,
    "activation_bytes": lambda m: m.activation_bytes,
}


def top_module_types(profile: Profile, metric: str = "flops", depth: int = 1, k: int = 3) -> list[tuple[str, float, int]]:
    """The ``k`` module types that weigh most at ``depth``: ``(type, total, modules)``."""
    if metric not in TOP_METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of: {', '.join(TOP_METRICS)}")
    totals: dict[str, list[float]] = {}
    for module in profile.modules:
        if module.depth == depth:
            entry = totals.setdefault(module.type, [0.0, 0])
            entry[0] += TOP_METRICS[metric](module)
            entry[1] += 1
    ranked = sorted(totals.items(), key=lambda item: (-item[1][0], item[0]))[:k]
    return [(kind, value, int(count)) for kind, (value, count) in ranked]


def format_top(profile: Profile, k: int = 3, depths: Iterable[int] | None = None, metrics: Iterable[str] | None = None) -> str:
    """Top-k module types by each metric at each depth, as DeepSpeed's profiler lists them
    (by default params, MACs, FLOPs, and activation bytes when memory was followed in training)."""
    if metrics is None:
        metrics = ("params", "macs", "flops", *(("activation_bytes",) if profile.memory is not None and profile.train else ()))
    deepest = max((m.depth for m in profile.modules), default=0)
    lines = []
    for depth in depths if depths is not None else range(1, deepest + 1):
        lines.append(f"depth {depth}:")
        for metric in metrics:
            total = TOP_METRICS[metric](profile.modules[0]) if profile.modules else 0
            unit = "B" if metric.endswith("_bytes") else ""
            entries = ", ".join(
                f"{kind} {format_count(value, unit)} ({value / total:.1%}{f', {count} modules' if count > 1 else ''})" if total else kind
                for kind, value, count in top_module_types(profile, metric, depth, k)
            )
            lines.append(f"  top {k} by {metric}: {entries}")
    return "\n".join(lines)


def format_op_table(profile: Profile, top: int | None = None, human: bool = True, module_width: int = 60) -> str:
    """One row per operator and phase: calls, FLOPs, MACs, share, bytes allocated (when
    memory was followed), the modules it ran in."""
    memory = profile.memory is not None
    headers = ("operator", "phase", "calls", "FLOPs", "MACs", "share", *(("allocated",) if memory else ()), "modules")
    rows = [headers]
    for op in profile.ops[:top] if top else profile.ops:
        share = f"{op.flops / profile.flops:.1%}" if profile.flops else ""
        modules = ", ".join(m or "(model)" for m in op.modules) or "(outside the model)"
        allocated = (_number(op.allocated_bytes, human, "B"),) if memory else ()
        rows.append(
            (
                op.op,
                op.phase,
                str(op.calls),
                _number(op.flops, human),
                _number(op.macs, human),
                share,
                *allocated,
                _fit(modules, module_width),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    lines = []
    for row in rows:
        left = f"{row[0].ljust(widths[0])}  {row[1].ljust(widths[1])}"
        numbers = "  ".join(cell.rjust(width) for cell, width in zip(row[2:-1], widths[2:-1]))
        lines.append(f"{left}  {numbers}  {row[-1]}".rstrip())
    return "\n".join(lines)


def format_op_times(profile: Profile, top: int | None = None, human: bool = True, paths: Iterable[str] = ()) -> str:
    """Operator times per module and phase (torch.profiler names), costliest self time first:
    calls, self and total CPU time, and on CUDA kernel time; seconds per workload call.
    ``paths`` keeps the operators of those modules and their descendants only."""
    if not profile.op_times:
        raise ValueError("this profile has no operator times (profile(..., latency=Timing(layers=True)))")
    selected = tuple(paths)
    op_times = [o for o in profile.op_times if not selected or any(o.module == p or o.module.startswith(p + ".") for p in selected)]
    cuda = any(o.device_seconds for o in profile.op_times)
    headers = ("operator", "phase", "module", "calls", "self CPU", "CPU total", *(("self CUDA", "CUDA total") if cuda else ()))
    total = sum(o.self_seconds for o in profile.op_times)
    rows = [(*headers, "share")]
    for op in op_times[:top] if top else op_times:
        device = (_number(op.self_device_seconds, human, "s"), _number(op.device_seconds, human, "s")) if cuda else ()
        share = f"{op.self_seconds / total:.1%}" if total else ""
        row = (op.op, op.phase, op.module or "(outside the model)", f"{op.calls:g}", _number(op.self_seconds, human, "s"))
        rows.append((*row, _number(op.seconds, human, "s"), *device, share))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        left = "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths[:3]))
        numbers = "  ".join(cell.rjust(width) for cell, width in zip(row[3:], widths[3:]))
        lines.append(f"{left}  {numbers}".rstrip())
    return "\n".join(lines)


_ESTIMATES = {
    "reserved_bytes": ("reserved", "caching allocator model, cuBLAS workspace included"),
    "cuda_context_bytes": ("CUDA context", "driver, GPU and loaded kernels; outside the allocator"),
}


def format_memory_report(profile: Profile, top_parameters: int = 10) -> str:
    """The peak and what it is made of, each category's maximum, and parameter by
    parameter the weight and gradient bytes: what tuning a batch size needs."""
    memory = profile.memory
    if memory is None:
        raise ValueError("this profile did not follow memory (profile(..., memory=True))")
    where = f"in {memory.peak_phase}" + (f", in module {memory.peak_module!r}" if memory.peak_module else "")
    blocks = f", CUDA allocations rounded to {memory.block_bytes}-byte blocks" if memory.block_bytes > 1 else ""
    lines = [
        f"memory of {profile.name or profile.model} (bytes allocated{blocks})",
        f"  peak {format_count(memory.peak_bytes, 'B')} {where}",
    ]
    width = max(len(c) for c in memory.categories)
    lines.append(f"  {'category':<{width}}  {'at the peak':>11}  {'share':>6}  {'own maximum':>11}")
    for category in memory.categories:
        if category in ("workspace", "unsharded_parameters") and not memory.category_max.get(category):
            continue  # only CUDA steps have a workspace, only sharded (FSDP) steps unsharded parameters
        at_peak = memory.peak_breakdown[category]
        share = f"{at_peak / memory.peak_bytes:.1%}" if memory.peak_bytes else ""
        lines.append(
            f"  {category:<{width}}  {format_count(at_peak, 'B'):>11}  {share:>6}  {format_count(memory.category_max[category], 'B'):>11}"
        )
    if memory.kv_cache_bytes:
        inputs = memory.category_max.get("inputs", 0)
        lines.append(f"  of the inputs, KV cache: {format_count(memory.kv_cache_bytes, 'B')} (of {format_count(inputs, 'B')} at the start)")
    if memory.estimates:
        lines.append("  estimates for the CUDA process, not in the peak above:")
        for key, text in _ESTIMATES.items():
            value = memory.estimates.get(key)
            lines.append(f"    {text[0]:<22} {format_count(value, 'B') if value is not None else 'not estimated':>13}  ({text[1]})")
        if "cudnn_workspace_bytes" in memory.estimates:
            cudnn = memory.estimates["cudnn_workspace_bytes"]
            held = f"{format_count(cudnn, 'B')}, in the peak above" if cudnn is not None else "not known here, missing from the peak"
            lines.append(f"  cuDNN's largest convolution workspace: {held}")
    if memory.measured:
        lines.append(
            "  measured by the caching allocator over the step: "
            f"max allocated {format_count(memory.measured.get('max_allocated_bytes', 0), 'B')}, "
            f"max reserved {format_count(memory.measured.get('max_reserved_bytes', 0), 'B')}"
        )
    largest = sorted(memory.parameters, key=lambda p: (-p[1], p[0]))[:top_parameters]
    if largest:
        name_width = max(len(name) for name, _, _ in largest)
        lines.append(f"  {'parameter':<{name_width}}  {'weight':>10}  {'gradient':>10}")
        for name, weight, gradient in largest:
            lines.append(f"  {name:<{name_width}}  {format_count(weight, 'B'):>10}  {format_count(gradient, 'B'):>10}")
        if len(memory.parameters) > len(largest):
            rest = memory.parameters[top_parameters:]
            lines.append(f"  ... {len(rest)} more parameters")
    return "\n".join(lines)


def format_profile(profile: Profile, depth: int = 2, top_ops: int = 8, human: bool = True) -> str:
    """The header, the module tree down to ``depth`` and the ``top_ops`` costliest operators."""
    parts = [format_header(profile), format_tree_table(profile, depth=depth, human=human)]
    if top_ops:
        parts.append(format_op_table(profile, top=top_ops, human=human))
    if profile.memory is not None and profile.train:
        parts.append(format_memory_report(profile, top_parameters=5))
    if top_ops and profile.op_times:
        parts.append(format_op_times(profile, top=top_ops, human=human))
    return "\n\n".join(parts)


def format_predicted(profile: Profile, top: int = 10) -> str:
    """The predicted step on the target GPU and its most expensive operators (the roofline view):
    each with its predicted time, share, bound, arithmetic intensity and the FLOP/s it reaches."""
    predicted = profile.predicted
    if predicted is None:
        raise ValueError("this profile has no predicted time: profile it with target=<GPU>")
    calibration = predicted.calibration if predicted.calibrated else "uncalibrated: round default efficiencies"
    lines = [
        f"predicted step on {predicted.target}: {format_seconds(predicted.seconds)} "
        f"(GPU busy {format_seconds(predicted.gpu_seconds)}, host issuing {format_seconds(predicted.host_seconds)}; {calibration})"
    ]
    if predicted.comm_seconds is not None and predicted.overlapped_seconds is not None:
        lines.append(
            f"collectives: {format_seconds(predicted.comm_seconds)} on the links, after the kernels above (none overlapped); "
            f"{format_seconds(predicted.overlapped_seconds)} if all were hidden behind the kernels"
        )
    if profile.fits is not None and profile.memory is not None:
        verdict = "fits" if profile.fits else "does not fit"
        lines.append(
            f"memory: {verdict} in its {format_count(profile.target_memory_bytes or 0, 'B')} "
            f"(reserved {format_count(profile.memory.footprint_bytes, 'B')}, "
            f"allocated peak {format_count(profile.memory.peak_bytes, 'B')})"
        )
    rows = [("operator", "phase", "calls", "time", "share", "bound", "FLOP/byte", "FLOP/s")]
    for op in predicted.ops[:top]:
        share = f"{op.seconds / predicted.gpu_seconds:.1%}" if predicted.gpu_seconds else ""
        rate = format_count(op.flops / op.seconds, "FLOP/s") if op.seconds and op.flops else ""
        rows.append((op.op, op.phase, str(op.calls), format_seconds(op.seconds), share, op.bound, plain(op.intensity, 3), rate))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        left = "  ".join(cell.ljust(width) for cell, width in zip(row[:2], widths[:2]))
        right = "  ".join(cell.rjust(width) for cell, width in zip(row[2:], widths[2:]))
        lines.append(f"  {left}  {right}".rstrip())
    return "\n".join(lines)


def format_collectives(profile: Profile) -> str:
    """A sharded step's collectives, per rank: kind, phase and module, group, dtype, calls, payload
    (NCCL's bytes) and what a ring moves (bus bytes), then the step's totals by kind."""
    if profile.world_size is None:
        raise ValueError("this profile is not of a sharded step: profile it with world_size= and parallelize=")
    lines = [f"collectives of rank {profile.rank} of {profile.world_size}, per step"]
    rows = [("kind", "phase", "module", "group", "dtype", "calls", "bytes", "bus bytes")]
    for c in profile.collectives:
        rows.append(
            (
                c.kind,
                c.phase,
                c.module or "<root>",
                str(c.group_size),
                c.dtype,
                str(c.calls),
                format_count(c.bytes, "B"),
                format_count(c.bus_bytes, "B"),
            )
        )
    totals: dict[str, list[float]] = {}
    for c in profile.collectives:
        entry = totals.setdefault(c.kind, [0, 0, 0.0])
        entry[0] += c.calls
        entry[1] += c.bytes
        entry[2] += c.bus_bytes
    for kind, (calls, payload, bus) in totals.items():
        rows.append((kind, "step", "(total)", "", "", str(int(calls)), format_count(payload, "B"), format_count(bus, "B")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        left = "  ".join(cell.ljust(width) for cell, width in zip(row[:5], widths[:5]))
        right = "  ".join(cell.rjust(width) for cell, width in zip(row[5:], widths[5:]))
        lines.append(f"  {left}  {right}".rstrip())
    if not profile.collectives:
        lines.append("  none")
    return "\n".join(lines)
