"""`SimResult`: what one simulated step produced, and its views (Chrome trace, Gantt chart).

The scalar fields are the public contract (`tp.SimResult`): step_time_s, peak_memory_bytes, oom, busy_s,
transfer_bytes. The schedule arrays (node start/end/device, transfers) are kept for traces, for
policy features (simulated start times) and for tests. Rendering lives in `trace.py`/`gantt.py`.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from tfplaceto.sim import gantt, trace


@dataclasses.dataclass(frozen=True, eq=False)
class SimResult:
    """One simulated step.

    Attributes:
      step_time_s: end of the last node (seconds).
      peak_memory_bytes: device name -> peak bytes (persistent + live outputs + received copies).
      oom: True when some device's peak exceeds its memory_bytes.
      busy_s: device name -> total seconds of the nodes it ran (with streams > 1 this can exceed
        step_time_s: it is work, not wall time).
      transfer_bytes: total bytes sent over links (each tensor once per destination device, once
        per iteration in a loop body).
      device_names, memory_limit_bytes: the cluster's devices and their memory, in cluster order.
      node_names, node_types, node_group: per node (node_group is the colocation id, for colours).
      node_device, node_start_s, node_end_s: the schedule of every node.
      transfer_tensor, transfer_producer, transfer_src, transfer_dst, transfer_size_bytes,
        transfer_start_s, transfer_end_s: one entry per transfer, in creation order.
    """

    step_time_s: float
    peak_memory_bytes: dict[str, int]
    oom: bool
    busy_s: dict[str, float]
    transfer_bytes: int
    device_names: tuple[str, ...]
    memory_limit_bytes: tuple[int, ...]
    node_names: tuple[str, ...]
    node_types: tuple[str, ...]
    node_group: np.ndarray
    node_device: np.ndarray
    node_start_s: np.ndarray
    node_end_s: np.ndarray
    transfer_tensor: np.ndarray
    transfer_producer: np.ndarray
    transfer_src: np.ndarray
    transfer_dst: np.ndarray
    transfer_size_bytes: np.ndarray
    transfer_start_s: np.ndarray
    transfer_end_s: np.ndarray

    @property
    def num_transfers(self) -> int:
        return len(self.transfer_tensor)

    @property
    def oom_devices(self) -> tuple[str, ...]:
        """Devices whose peak exceeds their memory."""
        return tuple(name for name, limit in zip(self.device_names, self.memory_limit_bytes)
                     if self.peak_memory_bytes[name] > limit)

    @property
    def used_links(self) -> tuple[tuple[int, int], ...]:
        """(src, dst) device index pairs that carried at least one transfer, sorted."""
        pairs = {(int(s), int(d)) for s, d in zip(self.transfer_src, self.transfer_dst)}
        return tuple(sorted(pairs))

    def save_chrome_trace(self, path: str | os.PathLike) -> None:
        """Writes Chrome trace event JSON (chrome://tracing, Perfetto): a track per device and link."""
        trace.save_chrome_trace(self, path)

    def plot_gantt(self, path: str | os.PathLike, color_by: str = "group") -> None:
        """Writes a PNG Gantt chart: devices and used links as rows; color_by "group" or "node"."""
        gantt.plot_gantt(self, path, color_by=color_by)

    def __repr__(self) -> str:
        oom = f", OOM on {', '.join(self.oom_devices)}" if self.oom else ""
        return (f"SimResult(step_time_s={self.step_time_s:.6g}, {len(self.node_names)} nodes, "
                f"{self.num_transfers} transfers, {self.transfer_bytes} bytes moved{oom})")
