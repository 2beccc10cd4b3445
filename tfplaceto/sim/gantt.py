"""Gantt chart PNG of a SimResult (matplotlib, Agg canvas; pyplot's global state is not touched).

Rows: the devices (top, cluster order), then one row per link that carried a transfer. Node bars
are coloured by colocation group (or by node), so the parts of one layer read as one colour even
with thousands of ops; a row is drawn with one `broken_barh` call, which stays fast at that size.
Transfers take their producer's colour. The legend says what the colours mean and gives each
device's peak memory against its limit (OOM devices flagged, in binary units like every figure
tfplaceto prints: GiB = 2**30 bytes); the title gives the step time.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING

import numpy as np

from tfplaceto.errors import format_bytes
from tfplaceto.outputs import atomic_write
from tfplaceto.sim.trace import short_device

if TYPE_CHECKING:  # only for annotations: result.py imports this module
    from tfplaceto.sim.result import SimResult

_ROW_HEIGHT_IN = 0.42
_MAX_ROWS_LABELLED = 40


def _time_unit(step_s: float) -> tuple[float, str]:
    if step_s < 1e-3:
        return 1e6, "µs"
    if step_s < 1.0:
        return 1e3, "ms"
    return 1.0, "s"


def _colors(keys: np.ndarray) -> np.ndarray:
    """RGBA per key from a 20-colour qualitative map; neighbouring ids get distinct colours."""
    from matplotlib import colormaps

    palette = colormaps["tab20"](np.arange(20))
    # Multiply by a number coprime with 20 so ids 0, 1, 2... do not walk the palette in order
    # (tab20 pairs a dark and a light shade of one hue at consecutive positions).
    return palette[(np.asarray(keys, np.int64) * 7) % 20]


def colour_key(color_by: str = "group") -> tuple[str, ...]:
    """What the chart's colours mean (the legend's first lines)."""
    what = "its op group (ops kept together: a layer's parts)" if color_by == "group" else "its op"
    return (f"device rows: one bar per op, coloured by {what}",
            "link rows: one bar per tensor sent, in its producer's colour",
            "red text: peak memory over the device's limit")


def plot_gantt(result: SimResult, path: str | os.PathLike, color_by: str = "group") -> None:
    """Writes the chart to path (PNG, atomically). color_by: "group" (colocation id) or "node"."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if color_by not in ("group", "node"):
        raise ValueError(f"color_by must be 'group' or 'node', got {color_by!r}")
    devices = result.device_names
    links = result.used_links
    num_rows = len(devices) + len(links)
    scale, unit = _time_unit(max(result.step_time_s, 1e-12))
    keys = result.node_group if color_by == "group" else np.arange(len(result.node_names))
    node_colors = _colors(keys)

    fig = Figure(figsize=(14, 1.6 + _ROW_HEIGHT_IN * num_rows), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    starts = np.asarray(result.node_start_s) * scale
    widths = (np.asarray(result.node_end_s) - np.asarray(result.node_start_s)) * scale
    for d in range(len(devices)):
        on_device = np.flatnonzero(result.node_device == d)
        if on_device.size:
            ax.broken_barh(list(zip(starts[on_device], widths[on_device])), (d - 0.4, 0.8),
                           facecolors=node_colors[on_device], linewidth=0)
    tr_starts = np.asarray(result.transfer_start_s) * scale
    tr_widths = (np.asarray(result.transfer_end_s) - np.asarray(result.transfer_start_s)) * scale
    for row, (src, dst) in enumerate(links, start=len(devices)):
        on_link = np.flatnonzero((result.transfer_src == src) & (result.transfer_dst == dst))
        colors = node_colors[result.transfer_producer[on_link]]
        ax.broken_barh(list(zip(tr_starts[on_link], tr_widths[on_link])), (row - 0.3, 0.6),
                       facecolors=colors, linewidth=0, alpha=0.75)

    labels = [short_device(name) for name in devices]
    labels += [f"{short_device(devices[s])}→{short_device(devices[d])}" for s, d in links]
    ax.set_yticks(range(num_rows))
    ax.set_yticklabels(labels if num_rows <= _MAX_ROWS_LABELLED else [""] * num_rows, fontsize=8)
    ax.set_ylim(num_rows - 0.5, -0.5)
    ax.set_xlim(0, max(result.step_time_s * scale, 1e-9) * 1.01)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", alpha=0.3)
    if links:
        ax.axhline(len(devices) - 0.5, color="0.5", linewidth=0.8)

    handles = [Patch(facecolor="none", edgecolor="none", label=line) for line in colour_key(color_by)]
    handles.append(Patch(facecolor="none", edgecolor="none", label="peak memory / limit:"))
    for name, limit in zip(devices, result.memory_limit_bytes):
        peak = result.peak_memory_bytes[name]
        flag = "  OOM" if peak > limit else ""
        handles.append(Patch(facecolor="none", edgecolor="none",
                             label=f"{short_device(name)}: {format_bytes(peak)} / "
                                   f"{format_bytes(limit)}{flag}"))
    legend = ax.legend(handles=handles, title="legend", loc="upper left",
                       bbox_to_anchor=(1.01, 1.0), fontsize=8, title_fontsize=8,
                       handlelength=0, handletextpad=0, frameon=False)
    memory_texts = legend.get_texts()[len(handles) - len(devices):]
    for text, name, limit in zip(memory_texts, devices, result.memory_limit_bytes):
        if result.peak_memory_bytes[name] > limit:
            text.set_color("tab:red")
    oom = f" — OOM on {', '.join(short_device(d) for d in result.oom_devices)}" if result.oom else ""
    ax.set_title(f"Simulated step: {result.step_time_s * scale:.4g} {unit}, "
                 f"{len(result.node_names)} nodes, {format_bytes(result.transfer_bytes)} moved{oom}")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    atomic_write(path, buffer.getvalue())
