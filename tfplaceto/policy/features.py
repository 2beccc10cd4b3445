"""What the policy sees: per-graph static arrays, per-step features, and their padded observation.

Everything here is a pure function of plain arrays (the Problem's and the simulator's), so the
environment (`tfplaceto.rl.environment`) and the network (`network.py`) meet only through the
observation arrays defined here. Map of the file:

  Field names      NODES, EDGES, SENDERS, ... : the keys of an observation (graph_nets style).
  Dims, dims_for   the padded sizes of an observation (nodes, edges, devices).
  observation_spec the ArraySpec of an observation for given Dims.
  GraphStatics     placement-independent arrays of one Problem, built once by `graph_statics`:
                   node-level data edges (deduplicated pairs, bytes summed), reachability
                   (ancestors/descendants as dense boolean matrices), static node features,
                   colocation classes and the step order.
  SimState         what the features need from one simulation: step time, node start/end,
                   per-device busy time and peak memory.
  node_features    (N, NODE_FEATURES): normalized per graph.
  edge_features    (E, EDGE_FEATURES).
  device_features  (D, DEVICE_FEATURES) for the current node: one row per device, so the same
                   weights serve 2, 4 or 8 devices (no one-hot of device ids anywhere).
  observation      the padded dict of arrays for one step.
  graphs_tuple     an OpGraph (plus node/edge features) as a graph_nets GraphsTuple.
  batched_graphs_tuple  a batch of padded observations as one GraphsTuple (TF, in the network).

Normalization: sizes are divided by the graph's largest (compute, bytes), times by the current
step time T, memory by the device's capacity, so graphs of any size and clusters of any speed give
features of the same scale. Padding: every observation has `Dims.nodes` node slots, the last one
a dummy node that padded edges point to (so padded edges never touch real nodes), `Dims.edges`
edge slots and `Dims.devices` device slots (padded devices are never allowed).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np

# -- observation fields -----------------------------------------------------------------------------
NODES = "nodes"  # (N, NODE_FEATURES) float32
EDGES = "edges"  # (E, EDGE_FEATURES) float32
SENDERS = "senders"  # (E,) int32, padded edges point at the dummy node N - 1
RECEIVERS = "receivers"  # (E,) int32
NODE_MASK = "node_mask"  # (N,) float32: 1 for the graph's nodes
PLACEMENT = "placement"  # (N,) int32: current device of each node (0 for padding)
CURRENT = "current"  # () int32: the node being placed
ANCESTORS = "ancestors"  # (N,) float32: nodes with a path to the current node
DESCENDANTS = "descendants"  # (N,) float32: nodes reachable from the current node
DEVICES = "devices"  # (D, DEVICE_FEATURES) float32: features of (current node, device d)
ACTION_MASK = "action_mask"  # (D,) bool: the current node may go on device d

NODE_FEATURES = 16
EDGE_FEATURES = 3
DEVICE_FEATURES = 14
LOOKAHEAD_COLUMN = 11  # of DEVICES: (step time with the node moved to d - T) / T
_CLIP = 10.0  # ratios are clipped to +-_CLIP so a pathological placement cannot blow up inputs


@dataclasses.dataclass(frozen=True)
class Dims:
    """Padded sizes of an observation: node slots (graph nodes + 1 dummy), edge and device slots."""

    nodes: int
    edges: int
    devices: int


def dims_for(statics: Sequence[GraphStatics], num_devices: Sequence[int]) -> Dims:
    """The smallest Dims that hold every graph of `statics` on every device count given."""
    return Dims(nodes=max(s.num_nodes for s in statics) + 1,
                edges=max(max(len(s.senders) for s in statics), 1),
                devices=max(num_devices))


@functools.lru_cache(maxsize=64)
def _layout(dims: Dims) -> tuple[tuple[str, tuple[int, ...], type], ...]:
    """(field, shape, dtype) of every observation field."""
    n, e, d = dims.nodes, dims.edges, dims.devices
    return ((NODES, (n, NODE_FEATURES), np.float32), (EDGES, (e, EDGE_FEATURES), np.float32),
            (SENDERS, (e,), np.int32), (RECEIVERS, (e,), np.int32), (NODE_MASK, (n,), np.float32),
            (PLACEMENT, (n,), np.int32), (CURRENT, (), np.int32), (ANCESTORS, (n,), np.float32),
            (DESCENDANTS, (n,), np.float32), (DEVICES, (d, DEVICE_FEATURES), np.float32),
            (ACTION_MASK, (d,), np.bool_))


def observation_spec(dims: Dims) -> dict:
    """The TF-Agents ArraySpec of one observation."""
    from tf_agents.specs import array_spec

    return {name: array_spec.ArraySpec(shape, dtype, name) for name, shape, dtype in _layout(dims)}


# -- static arrays of one graph ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class GraphStatics:
    """Placement-independent arrays of one Problem (see `graph_statics`)."""

    num_nodes: int
    senders: np.ndarray  # (E,) node-level data edges, one per (producer, consumer) pair
    receivers: np.ndarray
    edge_bytes: np.ndarray  # (E,) float64, bytes of all tensors of the pair
    ancestors: np.ndarray  # (N, N) bool: ancestors[i, j] = j has a path to i (data or control)
    descendants: np.ndarray  # (N, N) bool: descendants[i, j] = i has a path to j
    static_nodes: np.ndarray  # (N, 8) float32, the placement-independent node features
    fastest_s: np.ndarray  # (N,) compute seconds on the node's fastest device
    compute_s: np.ndarray  # (N, D) compute seconds on every device
    classes: np.ndarray  # (N,) colocation class id, 0..C-1
    steps: np.ndarray  # (C,) the node placed at each step: first member of each class, topo order
    members: tuple[np.ndarray, ...]  # per class, its nodes
    in_edges: tuple[np.ndarray, ...]  # per class, its edges from nodes outside the class
    out_edges: tuple[np.ndarray, ...]  # per class, its edges to nodes outside the class
    memory_bytes: np.ndarray  # (D,) device memory
    persistent_bytes: np.ndarray  # (N,)
    bandwidth: np.ndarray  # (D, D) bytes/s, inf on the diagonal
    latency: np.ndarray  # (D, D) seconds

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def num_devices(self) -> int:
        return self.compute_s.shape[1]


def node_edges(op_graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(senders, receivers, bytes) of the data edges deduplicated to node pairs, self-loops dropped."""
    senders = np.asarray(op_graph.senders, np.int64)
    receivers = np.asarray(op_graph.receivers, np.int64)
    nbytes = np.asarray(op_graph.edge_bytes, np.float64)
    keep = senders != receivers
    senders, receivers, nbytes = senders[keep], receivers[keep], nbytes[keep]
    n = max(op_graph.num_ops, 1)
    key = senders * n + receivers
    unique, inverse = np.unique(key, return_inverse=True)
    summed = np.bincount(inverse, weights=nbytes, minlength=len(unique))
    return (unique // n).astype(np.int32), (unique % n).astype(np.int32), summed


def reachability(n: int, senders: np.ndarray, receivers: np.ndarray,
                 topo_order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ancestors, descendants) as dense (n, n) boolean matrices (fine up to a few thousand nodes)."""
    parents: list[list[int]] = [[] for _ in range(n)]
    for s, r in zip(senders.tolist(), receivers.tolist()):
        parents[r].append(s)
    ancestors = np.zeros((n, n), bool)
    for node in np.asarray(topo_order).tolist():
        for parent in parents[node]:
            ancestors[node] |= ancestors[parent]
            ancestors[node, parent] = True
    return ancestors, ancestors.T.copy()


def _levels(n, senders, receivers, topo_order, weight):
    """(top level, bottom level): longest path weight before a node starts / from its start on."""
    order = np.asarray(topo_order)
    parents: list[list[int]] = [[] for _ in range(n)]
    children: list[list[int]] = [[] for _ in range(n)]
    for s, r in zip(senders.tolist(), receivers.tolist()):
        parents[r].append(s)
        children[s].append(r)
    top = np.zeros(n)
    for node in order.tolist():
        if parents[node]:
            top[node] = max(top[p] + weight[p] for p in parents[node])
    bottom = np.zeros(n)
    for node in order[::-1].tolist():
        bottom[node] = weight[node] + (max(bottom[c] for c in children[node]) if children[node] else 0.0)
    return top, bottom


def graph_statics(problem) -> GraphStatics:
    """The placement-independent arrays of a `tfplaceto.problem.Problem`."""
    graph = problem.graph
    n = graph.num_ops
    compute = np.asarray(problem.compute_s, np.float64)
    fastest = np.where(problem.allowed, compute, np.inf).min(axis=1)
    fastest = np.where(np.isfinite(fastest), fastest, compute.min(axis=1))
    senders, receivers, nbytes = node_edges(graph)
    order_s = np.concatenate([senders, graph.control_senders]).astype(np.int64)
    order_r = np.concatenate([receivers, graph.control_receivers]).astype(np.int64)
    ancestors, descendants = reachability(n, order_s, order_r, graph.topo_order)
    top, bottom = _levels(n, order_s, order_r, graph.topo_order, fastest)
    critical = max(float((top + bottom).max()) if n else 0.0, 1e-12)
    memory = np.asarray(problem.cluster.memory_bytes, np.float64)
    persistent = np.asarray(graph.persistent_bytes, np.float64)
    output = np.asarray(graph.output_bytes, np.float64)
    in_degree = np.bincount(receivers, minlength=n)
    out_degree = np.bincount(senders, minlength=n)
    static = np.stack([
        fastest / max(fastest.max(initial=0.0), 1e-12),
        fastest / critical,
        output / max(output.max(initial=0.0), 1.0),
        persistent / max(persistent.max(initial=0.0), 1.0),
        persistent / memory.min(),
        top / critical,
        bottom / critical,
        np.log1p(in_degree + out_degree) / np.log1p(max((in_degree + out_degree).max(initial=0), 1)),
    ], axis=1).astype(np.float32)

    _, classes = np.unique(np.asarray(graph.colocation), return_inverse=True)
    classes = classes.astype(np.int32)
    first = {}
    for node in np.asarray(graph.topo_order).tolist():
        first.setdefault(int(classes[node]), node)
    steps = np.array(list(first.values()), np.int32)  # class representatives in topological order
    step_class = classes[steps]
    members = tuple(np.flatnonzero(classes == c) for c in step_class)
    send_class, recv_class = classes[senders], classes[receivers]
    in_edges = tuple(np.flatnonzero((recv_class == c) & (send_class != c)) for c in step_class)
    out_edges = tuple(np.flatnonzero((send_class == c) & (recv_class != c)) for c in step_class)
    return GraphStatics(
        num_nodes=n, senders=senders, receivers=receivers, edge_bytes=nbytes,
        ancestors=ancestors, descendants=descendants, static_nodes=static, fastest_s=fastest,
        compute_s=compute, classes=classes, steps=steps, members=members, in_edges=in_edges,
        out_edges=out_edges, memory_bytes=memory, persistent_bytes=persistent,
        bandwidth=np.asarray(problem.cluster.bandwidth, np.float64),
        latency=np.asarray(problem.cluster.latency, np.float64))


# -- per-step features ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SimState:
    """The parts of one simulated step the features use (plain arrays, from any simulator)."""

    step_time_s: float
    node_start_s: np.ndarray  # (N,)
    node_end_s: np.ndarray  # (N,)
    busy_s: np.ndarray  # (D,)
    peak_bytes: np.ndarray  # (D,)


def _transfer_s(statics: GraphStatics, edges: np.ndarray, other_end: np.ndarray) -> np.ndarray:
    """(D,): seconds to move `edges`' bytes between their other end's device and each device d."""
    if len(edges) == 0:
        return np.zeros(statics.num_devices)
    src = other_end
    nbytes = statics.edge_bytes[edges][:, None]
    seconds = statics.latency[src] + nbytes / statics.bandwidth[src]  # 0 where src == d
    return seconds.sum(axis=0)


def node_features(statics: GraphStatics, placement: np.ndarray, sim: SimState, current: int,
                  visited: np.ndarray) -> np.ndarray:
    """(N, NODE_FEATURES) float32: static features, then the schedule and placement around `current`.

    Columns 0-7 static (fastest compute / max, / critical path, output bytes / max, persistent /
    max, persistent / smallest device memory, top level, bottom level, log degree); 8 start time
    relative to the current node's / T; 9 duration / T; 10 is current; 11 visited; 12 on the
    current node's device; 13 busy time of its device / T; 14 peak memory / memory of its device;
    15 log slowdown of its device for it (0 when on its fastest device).
    """
    step = max(sim.step_time_s, 1e-12)
    n = statics.num_nodes
    nodes = np.empty((n, NODE_FEATURES), np.float32)
    nodes[:, :8] = statics.static_nodes
    nodes[:, 8] = np.clip((sim.node_start_s - sim.node_start_s[current]) / step, -_CLIP, _CLIP)
    nodes[:, 9] = np.clip((sim.node_end_s - sim.node_start_s) / step, 0, _CLIP)
    nodes[:, 10] = 0.0
    nodes[current, 10] = 1.0
    nodes[:, 11] = visited
    nodes[:, 12] = placement == placement[current]
    nodes[:, 13] = np.clip(sim.busy_s[placement] / step, 0, _CLIP)
    nodes[:, 14] = np.clip(sim.peak_bytes[placement] / statics.memory_bytes[placement], 0, _CLIP)
    actual = statics.compute_s[np.arange(n), placement]
    nodes[:, 15] = np.clip(np.log((actual + 1e-9) / (statics.fastest_s + 1e-9)), 0, _CLIP)
    return nodes


def edge_features(statics: GraphStatics, placement: np.ndarray, step_time_s: float) -> np.ndarray:
    """(E, EDGE_FEATURES) float32: bytes / max bytes, crosses devices, transfer time / T."""
    src, dst = placement[statics.senders], placement[statics.receivers]
    seconds = statics.latency[src, dst] + statics.edge_bytes / statics.bandwidth[src, dst]
    edges = np.empty((len(statics.senders), EDGE_FEATURES), np.float32)
    edges[:, 0] = statics.edge_bytes / max(statics.edge_bytes.max(initial=0.0), 1.0)
    edges[:, 1] = src != dst
    edges[:, 2] = np.clip(seconds / max(step_time_s, 1e-12), 0, _CLIP)
    return edges


def device_features(statics: GraphStatics, placement: np.ndarray, sim: SimState, step: int,
                    allowed: np.ndarray, lookahead_s: np.ndarray | None = None,
                    lookahead_oom: np.ndarray | None = None) -> np.ndarray:
    """(D, DEVICE_FEATURES) float32: the current class (step `step`) against each device d.

    Columns: 0 the node is on d; 1 busy time of d / T; 2 peak memory / memory of d; 3 persistent
    memory on d (with the class moved there) / memory of d; 4, 5 seconds to receive the class's
    inputs / send its outputs if it were on d, / T; 6 its compute on d / T; 7 log slowdown of d
    for it; 8 d is its fastest device; 9, 10 share of its input / output edges whose other end is
    on d; 11 lookahead: (step time with the class moved to d - T) / T; 12 lookahead OOM; 13 d is
    allowed. Lookahead columns are 0 when `lookahead_s` is None.
    """
    members = statics.members[step]
    node = statics.steps[step]
    d = statics.num_devices
    step_time = max(sim.step_time_s, 1e-12)
    in_edges, out_edges = statics.in_edges[step], statics.out_edges[step]
    receive = _transfer_s(statics, in_edges, placement[statics.senders[in_edges]])
    send = _transfer_s(statics, out_edges, placement[statics.receivers[out_edges]])
    compute = statics.compute_s[members].sum(axis=0)
    fastest = compute[allowed].min() if allowed.any() else compute.min()
    persistent = np.bincount(placement, weights=statics.persistent_bytes, minlength=d)
    class_persistent = statics.persistent_bytes[members].sum()
    persistent = persistent - np.where(np.arange(d) == placement[node], class_persistent, 0.0) + class_persistent
    features = np.zeros((d, DEVICE_FEATURES), np.float32)
    features[placement[node], 0] = 1.0
    features[:, 1] = np.clip(sim.busy_s / step_time, 0, _CLIP)
    features[:, 2] = np.clip(sim.peak_bytes / statics.memory_bytes, 0, _CLIP)
    features[:, 3] = np.clip(persistent / statics.memory_bytes, 0, _CLIP)
    features[:, 4] = np.clip(receive / step_time, 0, _CLIP)
    features[:, 5] = np.clip(send / step_time, 0, _CLIP)
    features[:, 6] = np.clip(compute / step_time, 0, _CLIP)
    features[:, 7] = np.clip(np.log((compute + 1e-9) / (fastest + 1e-9)), 0, _CLIP)
    features[:, 8] = compute <= fastest * (1 + 1e-6)
    if len(in_edges):
        features[:, 9] = np.bincount(placement[statics.senders[in_edges]], minlength=d) / len(in_edges)
    if len(out_edges):
        features[:, 10] = np.bincount(placement[statics.receivers[out_edges]], minlength=d) / len(out_edges)
    if lookahead_s is not None:
        features[:, 11] = np.clip((lookahead_s - sim.step_time_s) / step_time, -_CLIP, _CLIP)
        features[:, 12] = lookahead_oom
    features[:, 13] = allowed
    features[~allowed, 11:13] = 0.0
    return features


def observation(statics: GraphStatics, dims: Dims, placement: np.ndarray, sim: SimState, step: int,
                visited: np.ndarray, allowed: np.ndarray, lookahead_s: np.ndarray | None = None,
                lookahead_oom: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The padded observation of step `step` (see `observation_spec`)."""
    n, e = statics.num_nodes, len(statics.senders)
    d = statics.num_devices
    if n + 1 > dims.nodes or e > dims.edges or d > dims.devices:
        raise ValueError(f"graph ({n} nodes, {e} edges, {d} devices) exceeds the padded sizes {dims}")
    current = int(statics.steps[step])
    obs = {name: np.zeros(shape, dtype) for name, shape, dtype in _layout(dims)}
    obs[NODES][:n] = node_features(statics, placement, sim, current, visited)
    obs[EDGES][:e] = edge_features(statics, placement, sim.step_time_s)
    obs[SENDERS][:] = dims.nodes - 1
    obs[RECEIVERS][:] = dims.nodes - 1
    obs[SENDERS][:e] = statics.senders
    obs[RECEIVERS][:e] = statics.receivers
    obs[NODE_MASK][:n] = 1.0
    obs[PLACEMENT][:n] = placement
    obs[CURRENT][...] = current
    obs[ANCESTORS][:n] = statics.ancestors[current]
    obs[DESCENDANTS][:n] = statics.descendants[current]
    obs[DEVICES][:d] = device_features(statics, placement, sim, step, allowed, lookahead_s, lookahead_oom)
    obs[ACTION_MASK][:d] = allowed
    return obs


# -- graph_nets views -------------------------------------------------------------------------------
def graphs_tuple(op_graph, nodes: np.ndarray, edges: np.ndarray | None = None):
    """One graph as a graph_nets GraphsTuple (numpy): node-level deduplicated data edges.

    nodes: (N, F) node features; edges: (E, F_e) features of the edges `node_edges(op_graph)`
    returns, or None for their byte counts (normalized) as a single feature.
    """
    from graph_nets import utils_np

    senders, receivers, nbytes = node_edges(op_graph)
    if edges is None:
        edges = (nbytes / max(nbytes.max(initial=0.0), 1.0))[:, None]
    return utils_np.data_dicts_to_graphs_tuple([{
        "nodes": np.asarray(nodes, np.float32), "edges": np.asarray(edges, np.float32),
        "senders": senders, "receivers": receivers, "globals": np.zeros(1, np.float32)}])


def batched_graphs_tuple(obs: dict, reverse: bool = False):
    """A batch of padded observations (leading dim B) as one GraphsTuple of B graphs (TF tensors).

    Graph b's node slots are nodes b*N .. b*N + N-1 (padding included: it only talks to itself);
    `reverse` swaps senders and receivers (messages then flow from children to parents).
    """
    import tensorflow as tf
    from graph_nets import graphs

    nodes = obs[NODES]
    batch, n = tf.shape(nodes)[0], tf.shape(nodes)[1]
    e = tf.shape(obs[SENDERS])[1]
    offsets = (tf.range(batch, dtype=tf.int32) * n)[:, None]
    senders = tf.reshape(obs[SENDERS] + offsets, [-1])
    receivers = tf.reshape(obs[RECEIVERS] + offsets, [-1])
    if reverse:
        senders, receivers = receivers, senders
    return graphs.GraphsTuple(
        nodes=tf.reshape(nodes, [-1, nodes.shape[-1]]),
        edges=tf.reshape(obs[EDGES], [-1, obs[EDGES].shape[-1]]),
        senders=senders, receivers=receivers, globals=None,
        n_node=tf.fill([batch], n), n_edge=tf.fill([batch], e))
