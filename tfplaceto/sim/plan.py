"""`SimGraph`: the placement-independent part of a simulation, precomputed once.

The simulator is called after every action of the RL loop, always on the same graph, cluster and
costs with a different device array. Everything that does not depend on the placement is turned
here, once, into flat contiguous arrays the compiled kernel (`tfplaceto.sim.kernel`) walks:

  compute      (N, D) float64  seconds of node n on device d (per step: all loop iterations).
  tensor_trips (T,) float64    times tensor t crosses a link per step (> 1 in a loop body).
  prod_ptr / prod_tensors      CSR: tensors produced by each node.
  cons_ptr / input_tensor, input_producer
                               CSR over data edges grouped by consumer ("input k" of a node):
                               the tensor read and the node producing it.
  tensor_ptr / tensor_cons, tensor_cpos
                               CSR over the same edges grouped by tensor (ordered by consumer):
                               the consumer, and the edge's input position k in the first CSR.
  ctrl_ptr / ctrl_succ         CSR: control successors of each node.
  indegree     (N,) int32      data plus control in-edges: a node is ready when all have arrived.
  scratch_bytes (N,) int64     output bytes held only while the node runs (`OpGraph.scratch_bytes`).
  streams, bandwidth, latency, control_hop
                               per device / per directed link, from the Cluster (control_hop
                               all 0: control edges cost nothing).
  wait_idle    (D, D) bool     transfers src -> dst start only while src is idle (the src
                               device's `sends_wait_idle`, for dst on another task).
  group_of, group_slow         contention: each device's group (-1: none) and each group's
                               slowdown per extra busy device (empty: contention off).

Edges are stored by value in both orders (not as edge ids to look up) so the kernel's loops read
consecutive memory instead of chasing indices. The arrays are private writable copies (numba
compiles one specialization for writable arrays, and OpGraph/Cluster arrays are read-only);
treat them as read-only. Nodes are OpGraph nodes (ops, or groups after grouping): nothing here
cares which.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfplaceto import errors
from tfplaceto.cluster import Cluster
from tfplaceto.graph.op_graph import OpGraph, csr


def _owned(array, dtype) -> np.ndarray:
    """A private writable C-contiguous copy: numba compiles one specialization for writable arrays,
    and OpGraph/Cluster arrays are read-only, which would make a second one."""
    return np.array(array, dtype=dtype, order="C", copy=True)


def check_compute(compute_s: np.ndarray, num_nodes: int, num_devices: int) -> np.ndarray:
    """compute_s as a C-contiguous float64 (nodes, devices) array; CostProfileError if it is not one."""
    compute = _owned(compute_s, np.float64)
    if compute.shape != (num_nodes, num_devices):
        raise errors.CostProfileError(
            f"compute times have shape {compute.shape}, expected ({num_nodes} nodes, {num_devices} "
            "devices); pass a CostProfile or CostProfile.per_device(op_graph, cluster)")
    if not np.all(np.isfinite(compute)) or (compute < 0).any():
        raise errors.CostProfileError("compute times must be finite and >= 0 seconds")
    return compute


@dataclasses.dataclass(frozen=True, eq=False)
class SimGraph:
    """Placement-independent arrays of one (graph, cluster, costs) triple; see the module docstring."""

    compute: np.ndarray
    tensor_producer: np.ndarray
    tensor_bytes: np.ndarray
    tensor_trips: np.ndarray
    prod_ptr: np.ndarray
    prod_tensors: np.ndarray
    tensor_ptr: np.ndarray
    tensor_cons: np.ndarray
    tensor_cpos: np.ndarray
    cons_ptr: np.ndarray
    input_tensor: np.ndarray
    input_producer: np.ndarray
    ctrl_ptr: np.ndarray
    ctrl_succ: np.ndarray
    indegree: np.ndarray
    scratch_bytes: np.ndarray
    persistent_bytes: np.ndarray
    streams: np.ndarray
    bandwidth: np.ndarray
    latency: np.ndarray
    memory_bytes: np.ndarray
    control_hop: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0)))
    wait_idle: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0), np.bool_))
    group_of: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int32))
    group_slow: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float64))

    @property
    def num_nodes(self) -> int:
        return self.compute.shape[0]

    @property
    def num_devices(self) -> int:
        return self.compute.shape[1]

    def kernel_args(self) -> tuple[np.ndarray, ...]:
        """The arrays in the order `tfplaceto.sim.kernel` takes them after the device array."""
        return (self.compute, self.tensor_producer, self.tensor_bytes, self.tensor_trips, self.prod_ptr,
                self.prod_tensors, self.tensor_ptr, self.tensor_cons, self.tensor_cpos,
                self.cons_ptr, self.input_tensor, self.input_producer, self.ctrl_ptr,
                self.ctrl_succ, self.indegree, self.scratch_bytes, self.persistent_bytes, self.streams,
                self.bandwidth, self.latency, self.control_hop, self.wait_idle, self.group_of,
                self.group_slow)


def build_sim_graph(op_graph: OpGraph, cluster: Cluster, compute_s: np.ndarray) -> SimGraph:
    """Precomputes the CSR structure of op_graph and the cluster's link and memory arrays."""
    n = op_graph.num_ops
    compute = check_compute(compute_s, n, cluster.num_devices)
    tensor_producer = _owned(op_graph.tensor_producer, np.int32)
    edge_tensor = _owned(op_graph.edge_tensor, np.int32)
    edge_consumer = _owned(op_graph.edge_consumer, np.int32)
    num_tensors = len(tensor_producer)
    prod_ptr, prod_tensors = csr(tensor_producer, n, dtype=np.int32)
    # Inputs: edges grouped by consumer. cons_order[k] is the edge at input position k.
    cons_ptr, cons_order = csr(edge_consumer, n, dtype=np.int32)
    input_tensor = _owned(edge_tensor[cons_order], np.int32)
    input_producer = _owned(tensor_producer[input_tensor], np.int32)
    # Readers: the same positions grouped by tensor; stable, so each tensor's consumers keep
    # increasing index and transfers and readiness are generated in a fixed order.
    tensor_ptr, tensor_cpos = csr(input_tensor, num_tensors, dtype=np.int32)
    tensor_cons = _owned(edge_consumer[cons_order][tensor_cpos], np.int32)
    control_senders = np.asarray(op_graph.control_senders, np.int32)
    control_receivers = np.asarray(op_graph.control_receivers, np.int32)
    ctrl_ptr, ctrl_succ = csr(control_senders, n, control_receivers, np.int32)
    indegree = (np.bincount(edge_consumer, minlength=n)
                + np.bincount(control_receivers, minlength=n)).astype(np.int32)
    streams = np.array([d.streams for d in cluster.devices], np.int32)
    off_diagonal = ~np.eye(cluster.num_devices, dtype=bool)
    # Cluster validates its links; this guards the kernel itself: a NaN time never compares
    # smaller, so the event loop would wait on it forever.
    if not (np.isfinite(cluster.latency[off_diagonal]).all() and np.isfinite(cluster.control_hop).all()
            and (cluster.bandwidth[off_diagonal] > 0).all() and not np.isnan(cluster.bandwidth).any()):
        raise errors.InvalidClusterError(
            f"cluster {cluster.name!r} has a link with a NaN, infinite or non-positive figure")
    group_of, group_slow = cluster.contention_arrays()
    tasks = cluster.task_ids()
    waits = np.array([d.sends_wait_idle for d in cluster.devices], np.bool_)
    wait_idle = waits[:, None] & (tasks[:, None] != tasks[None, :])
    return SimGraph(
        compute=compute, tensor_producer=tensor_producer,
        tensor_bytes=_owned(op_graph.tensor_bytes, np.int64),
        tensor_trips=_owned(op_graph.tensor_iterations, np.float64),
        prod_ptr=prod_ptr, prod_tensors=prod_tensors, tensor_ptr=tensor_ptr, tensor_cons=tensor_cons,
        tensor_cpos=tensor_cpos, cons_ptr=cons_ptr, input_tensor=input_tensor,
        input_producer=input_producer, ctrl_ptr=ctrl_ptr, ctrl_succ=ctrl_succ,
        indegree=indegree,
        scratch_bytes=_owned(op_graph.scratch_bytes, np.int64),
        persistent_bytes=_owned(op_graph.persistent_bytes, np.int64),
        streams=streams,
        bandwidth=_owned(cluster.bandwidth, np.float64),
        latency=_owned(cluster.latency, np.float64),
        control_hop=_owned(cluster.control_hop, np.float64),
        wait_idle=_owned(wait_idle, np.bool_),
        memory_bytes=_owned(cluster.memory_bytes, np.int64),
        group_of=_owned(group_of, np.int32), group_slow=_owned(group_slow, np.float64))
