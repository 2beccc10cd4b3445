"""`lower_bound`: no placement of the graph on the cluster can take less time than this.

bound = max(critical path, total work / device capacity), both on the fastest device per node:
- critical path: the longest path through data and control edges, each node weighing its minimum
  compute time over the cluster's devices (transfers only add to it);
- work: the sum of those per-node minimums, divided by the cluster's capacity.

Capacity is "the number of devices of the fastest kind", made exact: each device counts
streams x its best-case speed relative to the per-node fastest device, rho_d = max over nodes of
min_compute[n] / compute[n, d] (<= 1). A device of the fastest kind counts 1 per stream; a host
CPU that is at best 10x slower counts 0.1. Counting only the accelerators would stop being a bound
whenever the other devices can take some of the work; counting every device as a full one would
make it loose on GPU clusters with a host CPU. Memory limits are ignored (they can make the bound
unreachable, never wrong).
"""

from __future__ import annotations

import numba
import numpy as np

from tfplaceto.cluster import Cluster, as_cluster
from tfplaceto.graph.op_graph import OpGraph, csr
from tfplaceto.sim.simulator import resolve_costs


@numba.njit(cache=True)
def _longest_path(topo_order, pred_ptr, preds, weight):
    finish = np.zeros(weight.shape[0])
    longest = 0.0
    for n in topo_order:
        ready = 0.0
        for k in range(pred_ptr[n], pred_ptr[n + 1]):
            if finish[preds[k]] > ready:
                ready = finish[preds[k]]
        finish[n] = ready + weight[n]
        if finish[n] > longest:
            longest = finish[n]
    return longest


def critical_path(op_graph: OpGraph, weight: np.ndarray) -> float:
    """Longest path through data and control edges with node weights `weight` (seconds)."""
    senders = np.concatenate([op_graph.senders, op_graph.control_senders]).astype(np.int32)
    receivers = np.concatenate([op_graph.receivers, op_graph.control_receivers]).astype(np.int32)
    pred_ptr, preds = csr(receivers, op_graph.num_ops, senders, np.int32)
    return float(_longest_path(np.asarray(op_graph.topo_order, np.int64), pred_ptr, preds,
                               np.asarray(weight, np.float64)))


def device_capacity(compute: np.ndarray, streams: np.ndarray) -> float:
    """Sum over devices of streams x best-case relative speed (see the module docstring)."""
    fastest = compute.min(axis=1)
    positive = fastest > 0
    if not positive.any():
        return float(streams.sum())
    rho = (fastest[positive, None] / compute[positive]).max(axis=0)
    return float((streams * rho).sum())


def lower_bound(op_graph: OpGraph, cluster: Cluster | str, costs=None) -> float:
    """Seconds no placement can beat: max(critical path, work / capacity) on the fastest devices.

    costs: a CostProfile, a (nodes, devices) array of seconds, or None for the analytical profile.
    """
    cluster = as_cluster(cluster)
    compute = resolve_costs(op_graph, cluster, costs)
    if op_graph.num_ops == 0:
        return 0.0
    fastest = compute.min(axis=1)
    streams = np.array([d.streams for d in cluster.devices], np.float64)
    work = float(fastest.sum()) / device_capacity(compute, streams)
    return max(critical_path(op_graph, fastest), work)
