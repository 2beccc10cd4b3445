"""A placement people can read: per-layer (name-scope) figures and a scope -> device mapping.

- `layer_of(op_name, model)`: the layer an op belongs to: its name scope, two levels under the
  model's scope (`model/conv2d`), one elsewhere (`SGD`, the loss), with the backward pass's
  `gradient_tape/` prefix removed so a layer's gradients count with it.
- `layer_table(op_graph, placement, cluster, costs)`: one `LayerRow` per layer (the device that
  runs most of its compute, compute ms per device, bytes in and out across devices) and the
  simulated peak memory per device; `format_table` prints it.
- `device_scopes(...)`: layer -> device, for `with tf.device(...)` in the user's own model code.

`OptimizeResult.explain()` / `device_scopes()` and `tfplaceto place --explain` use these.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from tfplaceto.errors import format_bytes
from tfplaceto.sim import Simulator

TOP_LEVEL = "(top level)"
_BACKWARD_PREFIXES = ("gradient_tape/", "gradients/")


def _forward_name(op_name: str) -> str:
    for prefix in _BACKWARD_PREFIXES:
        if op_name.startswith(prefix):
            return op_name[len(prefix):]
    return op_name


def model_scope(op_names) -> str | None:
    """The top-level name scope of the model: in a training step, the scope the backward pass
    mirrors (`gradient_tape/model/...`); else the scope with the most sub-scopes (layers)."""
    backward = collections.Counter(name.split("/")[1] for name in op_names
                                   if name.startswith(_BACKWARD_PREFIXES) and name.count("/") >= 2)
    if backward:
        return backward.most_common(1)[0][0]
    layers: dict[str, set] = collections.defaultdict(set)
    for name in op_names:
        parts = name.split("/")
        if len(parts) >= 3:
            layers[parts[0]].add(parts[1])
    return max(layers, key=lambda scope: len(layers[scope])) if layers else None


def layer_of(op_name: str, model: str | None = None) -> str:
    """The layer of an op: its name scope, two levels deep under the `model` scope (model/layer),
    else one level (the loss, the optimizer); gradients count with their forward layer; ops
    outside any scope are TOP_LEVEL."""
    parts = _forward_name(op_name).split("/")[:-1]
    if not parts:
        return TOP_LEVEL
    return "/".join(parts[:2] if parts[0] == model else parts[:1])


@dataclasses.dataclass(frozen=True)
class LayerRow:
    layer: str
    device: str  # the device with most of the layer's compute (its first op's when none)
    ops: int
    compute_s: dict[str, float]  # device -> seconds of this layer's ops there
    bytes_in: int  # bytes this layer's ops receive from other devices
    bytes_out: int  # bytes this layer's ops send to other devices


@dataclasses.dataclass(frozen=True)
class LayerTable:
    rows: list[LayerRow]
    peak_memory_bytes: dict[str, int]
    memory_limit_bytes: dict[str, int]
    step_time_s: float


def layer_table(op_graph, placement, cluster, costs=None) -> LayerTable:
    """Per-layer figures of a placement, from one op-level simulated step."""
    simulator = Simulator(op_graph, cluster, costs.per_device(op_graph, cluster) if costs is not None else None)
    device_of = simulator.device_array(placement)
    sim = simulator.result(device_of)
    names = sim.device_names
    model = model_scope(op_graph.names)
    layers = [layer_of(name, model) for name in op_graph.names]
    duration = np.asarray(sim.node_end_s - sim.node_start_s, np.float64)
    compute: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    first_device: dict[str, str] = {}
    op_count: collections.Counter = collections.Counter()
    for i, layer in enumerate(layers):
        device = names[device_of[i]]
        compute[layer][device] += float(duration[i])
        first_device.setdefault(layer, device)
        op_count[layer] += 1
    bytes_in: collections.Counter = collections.Counter()
    bytes_out: collections.Counter = collections.Counter()
    sent, received = set(), set()
    for tensor, consumer in zip(op_graph.edge_tensor, op_graph.edge_consumer):
        producer = int(op_graph.tensor_producer[tensor])
        src, dst = int(device_of[producer]), int(device_of[consumer])
        if src == dst:
            continue
        size = int(op_graph.tensor_bytes[tensor]) * int(op_graph.tensor_iterations[tensor])
        if (int(tensor), dst) not in sent:  # one transfer per destination device
            sent.add((int(tensor), dst))
            bytes_out[layers[producer]] += size
        if (int(tensor), layers[consumer]) not in received:
            received.add((int(tensor), layers[consumer]))
            bytes_in[layers[consumer]] += size
    rows = []
    for layer in dict.fromkeys(layers):  # in graph order
        times = compute[layer]
        busiest = max(times.items(), key=lambda kv: kv[1])
        device = busiest[0] if busiest[1] > 0 else first_device[layer]
        rows.append(LayerRow(layer, device, op_count[layer], dict(times), bytes_in[layer], bytes_out[layer]))
    return LayerTable(rows, dict(sim.peak_memory_bytes), dict(zip(names, sim.memory_limit_bytes)), sim.step_time_s)


def _short(device: str) -> str:
    parts = device.split("/")
    return "/".join(p for p in parts if p.startswith(("device:", "job:", "task:")) and not p == "job:localhost"
                    and not p == "task:0") or device


def format_table(table: LayerTable) -> str:
    """The table as text: layer, device, ops, compute ms, bytes in/out across devices; then peak
    memory per device (GiB)."""
    width = max([len(r.layer) for r in table.rows] + [5])
    dev_width = max([len(_short(r.device)) for r in table.rows] + [6])
    lines = [f"{'layer':<{width}}  {'device':<{dev_width}}  {'ops':>5}  {'compute ms':>10}  "
             f"{'in (other devices)':>18}  {'out (other devices)':>19}"]
    for row in table.rows:
        compute_ms = sum(row.compute_s.values()) * 1e3
        split = " (split)" if sum(1 for s in row.compute_s.values() if s > 0) > 1 else ""
        lines.append(f"{row.layer:<{width}}  {_short(row.device):<{dev_width}}  {row.ops:>5}  {compute_ms:>10.3f}  "
                     f"{format_bytes(row.bytes_in):>18}  {format_bytes(row.bytes_out):>19}{split}")
    lines.append(f"simulated step {table.step_time_s * 1e3:.3f} ms; peak memory per device:")
    for device, peak in table.peak_memory_bytes.items():
        limit = table.memory_limit_bytes.get(device)
        flag = " OUT OF MEMORY" if limit is not None and peak > limit else ""
        of = f" of {format_bytes(limit)}" if limit is not None else ""
        lines.append(f"  {device}: {format_bytes(peak)}{of}{flag}")
    return "\n".join(lines)


def device_scopes(table: LayerTable) -> dict[str, str]:
    """layer (name scope) -> the device that runs most of its compute."""
    return {row.layer: row.device for row in table.rows if row.layer != TOP_LEVEL}


__all__ = ["LayerRow", "LayerTable", "TOP_LEVEL", "device_scopes", "format_table", "layer_of", "layer_table", "model_scope"]
