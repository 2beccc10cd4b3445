"""Public entry points of the event simulator: `simulate`, `Simulator`, input coercion.

- `Simulator(op_graph, cluster, compute_s)`: precomputes the `SimGraph` once; `.run(device_of)`
  calls the compiled kernel only (the RL loop and placers use this), `.run_batch(devices)` many
  placements in one call, `.result(device_of)` the full `SimResult`.
- `simulate(op_graph, placement, cluster, costs=None)`: the one-shot convenience (public: `tp.simulate`).
- `resolve_costs`, `device_indices`: turn what users pass (CostProfile or array; Placement, dict
  or index array) into the kernel's arrays, raising tfplaceto's typed errors on bad input.
- `default_costs(op_graph, cluster)`: the hook used when no costs are given.

The scheduling semantics are documented in `tfplaceto/sim/kernel.py`. A step's time is its
schedule's makespan plus the cluster's fixed costs (`Simulator.overhead_s`): `step_overhead_s`,
and `task_overhead_s` for each task the placement uses other than the first device's. Both are 0
unless calibrated, so presets simulate their schedules alone.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

from tfplaceto import errors
from tfplaceto.cluster import Cluster, as_cluster
from tfplaceto.graph.op_graph import OpGraph
from tfplaceto.placement import as_placement
from tfplaceto.sim import kernel
from tfplaceto.sim.plan import SimGraph, build_sim_graph, check_compute
from tfplaceto.sim.result import SimResult


def default_costs(op_graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """(nodes, devices) seconds of the analytical profile (`tfplaceto.costs.profile`)."""
    # Imported here, not at the top: the simulator runs on numpy and numba alone, and
    # tfplaceto.costs loads TensorFlow (grappler).
    from tfplaceto import costs

    return costs.profile(op_graph, cluster, source="analytical").per_device(op_graph, cluster)


def resolve_costs(op_graph: OpGraph, cluster: Cluster, costs=None) -> np.ndarray:
    """Compute seconds as a checked (nodes, devices) float64 array.

    costs: None (the analytical profile), a CostProfile (anything with `per_device`), or an array
    of shape (nodes, devices) in cluster device order.
    """
    if costs is None:
        costs = default_costs(op_graph, cluster)
    elif hasattr(costs, "per_device"):
        costs = costs.per_device(op_graph, cluster)
    return check_compute(costs, op_graph.num_ops, cluster.num_devices)


def device_indices(op_graph: OpGraph, cluster: Cluster, placement) -> np.ndarray:
    """The device index of every node as int32.

    placement: a Placement or a mapping op name -> device name (InvalidGraphError if an op is
    missing, InvalidClusterError for a device outside the cluster), or a sequence/array with one
    entry per node of device indices or device names.
    """
    if isinstance(placement, Mapping):
        return as_placement(placement).to_indices(op_graph, cluster)
    if not isinstance(placement, np.ndarray | Sequence):
        raise errors.InvalidGraphError(
            f"a placement must be a Placement, a dict op -> device or an array of device indices, "
            f"got {type(placement).__name__}")
    array = np.asarray(placement)
    if array.size == 0:  # np.asarray([]) is float64
        array = array.astype(np.int32)
    if array.shape != (op_graph.num_ops,):
        raise errors.InvalidGraphError(
            f"the placement has shape {array.shape} but the graph has {op_graph.num_ops} nodes; "
            "give one device per node")
    if array.dtype.kind in "US" or array.dtype == object:
        lookup = {name: cluster.index(str(name)) for name in set(array.tolist())}
        return np.array([lookup[name] for name in array.tolist()], np.int32)
    if array.dtype.kind not in "iu":
        raise errors.InvalidGraphError(f"device indices must be integers, got dtype {array.dtype}")
    return _checked_indices(array, cluster.num_devices)


def _checked_indices(array: np.ndarray, num_devices: int) -> np.ndarray:
    # The kernel does not bounds-check (numba), so a bad index must never reach it.
    if array.size and (array.min() < 0 or array.max() >= num_devices):
        bad = int(array[(array < 0) | (array >= num_devices)][0])
        raise errors.InvalidClusterError(
            f"device index {bad} is outside the cluster ({num_devices} devices: 0..{num_devices - 1})")
    return np.ascontiguousarray(array, dtype=np.int32)


class Simulator:
    """A compiled simulation plan for one (graph, cluster, costs): evaluate many placements fast.

    Args:
      op_graph: the graph (ops or groups).
      cluster: the Cluster (`simulate` and the other public verbs take preset names too).
      compute_s: a CostProfile, a (nodes, devices) array of seconds, or None for the analytical
        profile.
    """

    def __init__(self, op_graph: OpGraph, cluster: Cluster, compute_s=None):
        self.op_graph = op_graph
        self.cluster = cluster
        self.sim_graph: SimGraph = build_sim_graph(
            op_graph, self.cluster, resolve_costs(op_graph, self.cluster, compute_s))
        self._args = self.sim_graph.kernel_args()
        self._memory = self.sim_graph.memory_bytes
        self._num_nodes = op_graph.num_ops
        self._num_devices = self.cluster.num_devices
        # Fixed costs per step (calibrated clusters only): tasks other than the first device's.
        self._task_ids = self.cluster.task_ids()
        self._remote = self._task_ids > 0
        self._step_overhead = self.cluster.step_overhead_s
        self._task_overhead = self.cluster.task_overhead_s

    @property
    def compute_s(self) -> np.ndarray:
        """(nodes, devices) seconds the simulator uses."""
        return self.sim_graph.compute

    def device_array(self, placement) -> np.ndarray:
        """int32 device indices of a Placement, dict or index array (checked)."""
        return device_indices(self.op_graph, self.cluster, placement)

    def _fast_indices(self, device_of) -> np.ndarray:
        # The RL loop passes int arrays; skip the general coercion for them.
        if isinstance(device_of, np.ndarray) and device_of.dtype.kind in "iu":
            if device_of.shape != (self._num_nodes,):
                raise errors.InvalidGraphError(
                    f"expected {self._num_nodes} device indices, got shape {device_of.shape}")
            return _checked_indices(device_of, self._num_devices)
        return self.device_array(device_of)

    def _batch_indices(self, devices) -> np.ndarray:
        devices = np.asarray(devices)
        if devices.ndim != 2 or devices.shape[1] != self._num_nodes or devices.dtype.kind not in "iu":
            raise errors.InvalidGraphError(
                f"expected an int array of shape (batch, {self._num_nodes}), got {devices.dtype} "
                f"{devices.shape}")
        return _checked_indices(devices, self._num_devices)

    def overhead_s(self, device_of) -> float:
        """The fixed seconds a step of this placement pays beyond its schedule: the cluster's
        step_overhead_s, plus task_overhead_s per task used other than the first device's."""
        if not self._task_overhead:
            return self._step_overhead
        devices = self._fast_indices(device_of)
        used = np.zeros(self._num_devices, bool)
        used[devices] = True
        tasks = self._task_ids[used & self._remote]
        return self._step_overhead + self._task_overhead * len(np.unique(tasks))

    def run(self, device_of) -> tuple[float, np.ndarray, bool]:
        """(step time in seconds, peak bytes per device (int64, cluster order), OOM?)."""
        devices = self._fast_indices(device_of)
        step, peak, ok = kernel.simulate_step(devices, *self._args)
        if not ok:
            raise errors.InvalidGraphError("some nodes never became ready: the graph is not a DAG")
        if self._step_overhead or self._task_overhead:
            step += self.overhead_s(devices)
        return step, peak, bool((peak > self._memory).any())

    def run_batch(self, devices) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """run() for each row of a (batch, nodes) int array: (steps (B,), peaks (B, D), oom (B,))."""
        devices = self._batch_indices(devices)
        steps, peaks, ok = kernel.simulate_batch(devices, *self._args)
        if not ok:
            raise errors.InvalidGraphError("some nodes never became ready: the graph is not a DAG")
        if self._step_overhead or self._task_overhead:
            steps = steps + np.array([self.overhead_s(row) for row in devices])
        return steps, peaks, (peaks > self._memory).any(axis=1)

    def schedule(self, device_of) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start (N,), end (N,), peak bytes per device (D,)) of one placement: what the RL
        environment observes after every action, without building a SimResult. The step time is
        end.max() + overhead_s(device_of)."""
        devices = self._fast_indices(device_of)
        start, end, *_, peak, ok = kernel.simulate_schedule(devices, *self._args)
        if not ok:
            raise errors.InvalidGraphError("some nodes never became ready: the graph is not a DAG")
        return start, end, peak

    def schedule_batch(self, devices, active=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """schedule() for each row of a (batch, nodes) int array, in one kernel call: (starts
        (B, N), ends (B, N), peak bytes (B, D)).

        `active` (N,) bool: the schedule of the active nodes alone, as if the others were not
        there yet (the RL environment's "visited" schedule: what the nodes an episode has placed
        do by themselves). An inactive node takes no time and sits on the device of the nearest
        active node up the chain of its first inputs (device 0 when there is none), whatever
        its row says, so it adds no work and its first input no transfer; its other inputs on
        other devices still cross their links (and may queue before an active transfer there).
        """
        devices = self._batch_indices(devices)
        args = self._args
        if active is not None:
            active = np.asarray(active, bool)
            if active.shape != (self._num_nodes,):
                raise errors.InvalidGraphError(
                    f"expected {self._num_nodes} active flags, got shape {active.shape}")
            anchor = self._active_anchor(active)
            devices = np.where(active, devices, np.where(active[anchor], devices[:, anchor], 0)).astype(devices.dtype)
            args = (self.sim_graph.compute * active[:, None], *args[1:])
        starts, ends, peaks, ok = kernel.simulate_schedules(devices, *args)
        if not ok:
            raise errors.InvalidGraphError("some nodes never became ready: the graph is not a DAG")
        return starts, ends, peaks

    @functools.cached_property
    def _first_input(self) -> np.ndarray:
        """The producer of each node's first input (the node itself when it has none)."""
        graph = self.sim_graph
        first = np.arange(self._num_nodes)
        has_input = graph.cons_ptr[1:] > graph.cons_ptr[:-1]
        first[has_input] = graph.input_producer[graph.cons_ptr[:-1][has_input]]
        return first

    def _active_anchor(self, active: np.ndarray) -> np.ndarray:
        """For each node, the nearest active node up its chain of first inputs (itself when
        active), or the inactive first node of the chain when none is active: pointer jumping."""
        jump = np.where(active, np.arange(self._num_nodes), self._first_input)
        while True:
            further = jump[jump]
            if np.array_equal(further, jump):
                return jump
            jump = further

    def result(self, device_of) -> SimResult:
        """The full SimResult (schedule, traces) of one placement.

        Control hops (calibrated clusters) occupy their links in the schedule but are not listed
        as transfers: they move no tensor. step_time_s includes `overhead_s`.
        """
        devices = self._fast_indices(device_of)
        (start, end, tr_tensor, tr_src, tr_dst, tr_start, tr_end, peak,
         ok) = kernel.simulate_schedule(devices, *self._args)
        if not ok:
            raise errors.InvalidGraphError("some nodes never became ready: the graph is not a DAG")
        tensors = tr_tensor >= 0
        tr_tensor, tr_src, tr_dst, tr_start, tr_end = (
            a[tensors] for a in (tr_tensor, tr_src, tr_dst, tr_start, tr_end))
        names = self.cluster.device_names
        graph = self.sim_graph
        durations = end - start
        busy = np.bincount(devices, weights=durations, minlength=self._num_devices)
        # Bytes moved: a loop body's tensor crosses once per iteration.
        sizes = (graph.tensor_bytes[tr_tensor] * graph.tensor_trips[tr_tensor]).astype(np.int64)
        return SimResult(
            step_time_s=(float(end.max()) if len(end) else 0.0) + self.overhead_s(devices),
            peak_memory_bytes={name: int(p) for name, p in zip(names, peak)},
            oom=bool((peak > self._memory).any()),
            busy_s={name: float(b) for name, b in zip(names, busy)},
            transfer_bytes=int(sizes.sum()),
            device_names=names,
            memory_limit_bytes=tuple(int(m) for m in self._memory),
            node_names=self.op_graph.names,
            node_types=self.op_graph.types,
            node_group=np.asarray(self.op_graph.colocation),
            node_device=devices.copy(),
            node_start_s=start, node_end_s=end,
            transfer_tensor=tr_tensor.astype(np.int32),
            transfer_producer=graph.tensor_producer[tr_tensor],
            transfer_src=tr_src.astype(np.int32), transfer_dst=tr_dst.astype(np.int32),
            transfer_size_bytes=sizes, transfer_start_s=tr_start, transfer_end_s=tr_end)

    def __repr__(self) -> str:
        return f"Simulator({self.op_graph!r}, {self.cluster!r})"


def simulate(op_graph: OpGraph, placement, cluster: Cluster | str, costs=None) -> SimResult:
    """Simulates one step of op_graph placed by `placement` on `cluster`.

    Args:
      op_graph: the graph (ops or groups).
      placement: a Placement, a dict op -> device name, or an int array of device indices.
      cluster: a Cluster or a preset name ("4xV100", "local:4").
      costs: a CostProfile, a (nodes, devices) array of seconds, or None for the analytical profile.

    For many placements of one graph build a `Simulator` once and call `run`/`result`.
    """
    cluster = as_cluster(cluster)
    devices = device_indices(op_graph, cluster, placement)
    return Simulator(op_graph, cluster, costs).result(devices)
