"""Chrome trace event JSON of a SimResult (opens in Perfetto and chrome://tracing).

One process ("tfplaceto simulated step"); thread ids 0..D-1 are the devices (every device gets a
track, idle or not), then one track per link that carried a transfer, in (src, dst) order. Events
are complete ("X") events in microseconds; op name, type and device, or the transfer's tensor,
producer and bytes, go in `args`. Written atomically (`tfplaceto.outputs.atomic_write`).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from tfplaceto.outputs import atomic_write

if TYPE_CHECKING:  # only for annotations: result.py imports this module
    from tfplaceto.sim.result import SimResult

_PID = 0
_US = 1e6


def short_device(name: str) -> str:
    """"/job:localhost/replica:0/task:0/device:GPU:1" -> "GPU:1" (the job prefix kept if not local)."""
    prefix, _, device = name.partition("/device:")
    if not device:
        return name
    return device if prefix == "/job:localhost/replica:0/task:0" else f"{prefix}/{device}"


def _metadata(tid: int, label: str) -> list[dict]:
    return [{"ph": "M", "pid": _PID, "tid": tid, "name": "thread_name", "args": {"name": label}},
            {"ph": "M", "pid": _PID, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}]


def trace_events(result: SimResult) -> dict:
    """The trace as a JSON-ready dict {"traceEvents": [...], "otherData": {...}}."""
    devices = result.device_names
    events: list[dict] = [{"ph": "M", "pid": _PID, "name": "process_name",
                           "args": {"name": "tfplaceto simulated step"}}]
    for d, name in enumerate(devices):
        peak = result.peak_memory_bytes[name]
        events += _metadata(d, f"{short_device(name)} (peak {peak / 1e9:.3g} GB)")
    link_tid = {}
    for src, dst in result.used_links:
        link_tid[(src, dst)] = len(devices) + len(link_tid)
        events += _metadata(link_tid[(src, dst)],
                            f"link {short_device(devices[src])} -> {short_device(devices[dst])}")
    for n, name in enumerate(result.node_names):
        d = int(result.node_device[n])
        start = float(result.node_start_s[n])
        events.append({"ph": "X", "pid": _PID, "tid": d, "name": name, "cat": "op",
                       "ts": start * _US, "dur": (float(result.node_end_s[n]) - start) * _US,
                       "args": {"op": name, "type": result.node_types[n], "device": devices[d]}})
    for r in range(result.num_transfers):
        src, dst = int(result.transfer_src[r]), int(result.transfer_dst[r])
        producer = result.node_names[int(result.transfer_producer[r])]
        start = float(result.transfer_start_s[r])
        events.append({"ph": "X", "pid": _PID, "tid": link_tid[(src, dst)], "cat": "transfer",
                       "name": f"{producer} -> {short_device(devices[dst])}",
                       "ts": start * _US, "dur": (float(result.transfer_end_s[r]) - start) * _US,
                       "args": {"producer": producer, "tensor": int(result.transfer_tensor[r]),
                                "bytes": int(result.transfer_size_bytes[r]),
                                "src": devices[src], "dst": devices[dst]}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"step_time_s": result.step_time_s, "oom": result.oom,
                          "transfer_bytes": result.transfer_bytes,
                          "peak_memory_bytes": result.peak_memory_bytes}}


def save_chrome_trace(result: SimResult, path: str | os.PathLike) -> None:
    atomic_write(path, json.dumps(trace_events(result), separators=(",", ":")).encode())
