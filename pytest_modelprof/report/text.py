"""Plain-text report of a :class:`~pytest_modelprof.Profile`."""

from __future__ import annotations

from ..engine.result import Profile

_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_count(value: float, unit: str = "") -> str:
    """``3_642_974_696, "FLOPs"`` -> ``"3.64 GFLOPs"`` (decimal prefixes)."""
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.0f} {unit}".rstrip()


def format_profile(profile: Profile, depth: int = 2, top_ops: int = 8) -> str:
    """Totals, the module tree down to ``depth`` and the costliest operators."""
    title = profile.name or profile.model
    mode = "training step" if profile.train else "inference"
    where = f"analytic, as on {profile.device}" if profile.analytic else profile.device
    lines = [
        f"{title}: {mode} ({where})",
        f"  FLOPs    {format_count(profile.flops, 'FLOPs'):>16}   forward {format_count(profile.forward_flops)}"
        + (f", loss {format_count(profile.loss_flops)}, backward {format_count(profile.backward_flops)}" if profile.train else "")
        + (f", recomputed {format_count(profile.recompute_flops)}" if profile.recompute_flops else ""),
        f"  MACs     {format_count(profile.macs, 'MACs'):>16}",
        f"  params   {format_count(profile.params):>16}   trainable {format_count(profile.trainable_params)}, "
        f"size {profile.model_size_bytes / 2**20:.1f} MiB",
    ]
    if profile.uncounted:
        lines.append("  uncounted ops: " + ", ".join(f"{op} x{calls}" for op, calls in profile.uncounted.items()))
    rows = [m for m in profile.modules if m.depth <= depth]
    if rows:
        width = max(len(_tree_label(m.path, m.type, m.depth)) for m in rows)
        lines.append("")
        lines.append(f"  {'module':<{width}} {'params':>10} {'forward':>12} {'backward':>12} {'share':>7}")
        for m in rows:
            lines.append(
                f"  {_tree_label(m.path, m.type, m.depth):<{width}} {format_count(m.params):>10} "
                f"{format_count(m.forward_flops):>12} {format_count(m.backward_flops):>12} {m.share:>7.1%}"
            )
    costly = [op for op in profile.ops if op.flops][:top_ops]
    if costly:
        width = max(len(op.op) for op in costly)
        lines.append("")
        lines.append(f"  {'operator':<{width}} {'phase':<9} {'calls':>6} {'FLOPs':>12}")
        for op in costly:
            lines.append(f"  {op.op:<{width}} {op.phase:<9} {op.calls:>6} {format_count(op.flops):>12}")
    return "\n".join(lines)


def _tree_label(path: str, type_name: str, depth: int) -> str:
    name = path.rpartition(".")[2] if path else "(model)"
    return f"{'  ' * depth}{name} ({type_name})"
