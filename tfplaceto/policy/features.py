"""What the policy sees: static arrays of each graph (numpy), the per-step observation, and the
features the network computes from both (TensorFlow).

The observation holds only what changes during an episode; everything that depends on the graph
alone is packed once per set of problems (`pack`) and kept on the TensorFlow side, so a step feeds
a few (N,) arrays per episode, not the graph. Map of the file:

  Field names        PROBLEM, STEP, PLACEMENT, ... : keys of an observation (graph_nets style).
  Dims, dims_for     padded sizes (nodes, edges, devices, steps) shared by every packed problem.
  observation_spec   the TF-Agents ArraySpec of one observation.
  GraphStatics       placement-independent arrays of one Problem (`graph_statics`): node-level
                     data edges, colocation classes and the visiting order (steps), the ancestors
                     and descendants of each step's class, static node features, time scale.
  pack               the statics of several problems padded to one Dims and stacked: the tensors
                     the network gathers from by each observation's PROBLEM index.
  observation        one episode's observation as numpy arrays (the environment's output).
  Features, compute  (TensorFlow) node, edge and (current class, device) features of a batch of
                     observations, from the packed statics.

Scales: times are divided by the problem's `time_scale` (its lower bound: max(critical path,
total compute / devices) on the fastest devices), so the features of a graph keep their meaning
during an episode and across graphs and clusters; memory by each device's capacity; bytes by the
graph's largest edge. Ratios are clipped to +-CLIP. Padding: the last node slot of every problem
is a dummy node that padded edges point at (it never receives a real message); padded devices are
never allowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

# -- observation fields (per episode) ----------------------------------------------------------------
PROBLEM = "problem"  # () int32: index of the episode's problem among the packed ones
STEP = "step"  # () int32: index of the class being placed (into the problem's step arrays)
PLACEMENT = "placement"  # (N,) int32: current device of each node (0 for padding)
VISITED = "visited"  # (N,) float32: placed by the policy this episode
START = "start"  # (N,) float32: simulated start time / time scale
END = "end"  # (N,) float32: simulated end time / time scale
BUSY = "busy"  # (D,) float32: busy time of each device / time scale
PEAK = "peak"  # (D,) float32: peak memory / device memory
STEP_TIME = "step_time"  # () float32: current step time / time scale
ACTION_MASK = "action_mask"  # (D,) bool: the current class may go on device d

STATIC_NODE_FEATURES = 8
NODE_FEATURES = STATIC_NODE_FEATURES + 8
EDGE_FEATURES = 3
DEVICE_FEATURES = 17
CLIP = 10.0


@dataclasses.dataclass(frozen=True)
class Dims:
    """Padded sizes: node slots (graph nodes + 1 dummy), edge slots, device slots, step slots."""

    nodes: int
    edges: int
    devices: int
    steps: int


def dims_for(statics: Sequence[GraphStatics]) -> Dims:
    """The smallest Dims that hold every graph (and cluster) of `statics`."""
    return Dims(nodes=max(s.num_nodes for s in statics) + 1,
                edges=max(max(len(s.senders) for s in statics), 1),
                devices=max(s.num_devices for s in statics),
                steps=max(s.num_steps for s in statics))


def _layout(dims: Dims) -> tuple[tuple[str, tuple[int, ...], type], ...]:
    n, d = dims.nodes, dims.devices
    return ((PROBLEM, (), np.int32), (STEP, (), np.int32), (PLACEMENT, (n,), np.int32),
            (VISITED, (n,), np.float32), (START, (n,), np.float32), (END, (n,), np.float32),
            (BUSY, (d,), np.float32), (PEAK, (d,), np.float32), (STEP_TIME, (), np.float32),
            (ACTION_MASK, (d,), np.bool_))


def observation_spec(dims: Dims) -> dict:
    """The TF-Agents ArraySpec of one observation."""
    from tf_agents.specs import array_spec

    return {name: array_spec.ArraySpec(shape, dtype, name) for name, shape, dtype in _layout(dims)}


def empty_observations(dims: Dims, batch: int) -> dict[str, np.ndarray]:
    """Zeroed observations for `batch` episodes."""
    return {name: np.zeros((batch,) + shape, dtype) for name, shape, dtype in _layout(dims)}


# -- static arrays of one graph -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, eq=False)
class GraphStatics:
    """Placement-independent arrays of one Problem (see `graph_statics`)."""

    num_nodes: int
    senders: np.ndarray  # (E,) node-level data edges, one per (producer, consumer) pair
    receivers: np.ndarray
    edge_bytes: np.ndarray  # (E,) float64, bytes per step of all tensors of the pair
    static_nodes: np.ndarray  # (N, STATIC_NODE_FEATURES) float32
    fastest_s: np.ndarray  # (N,) compute seconds on the node's fastest allowed device
    compute_s: np.ndarray  # (N, D) compute seconds on every device
    classes: np.ndarray  # (N,) colocation class id, 0..C-1
    steps: np.ndarray  # (S,) the node that represents each step's class, in visiting order
    step_class: np.ndarray  # (S,) class of each step
    members: tuple[np.ndarray, ...]  # per step, the nodes of its class
    step_ancestors: np.ndarray  # (S, N) bool: nodes with a path to a node of the class
    step_descendants: np.ndarray  # (S, N) bool: nodes reachable from a node of the class
    memory_bytes: np.ndarray  # (D,)
    persistent_bytes: np.ndarray  # (N,)
    bandwidth: np.ndarray  # (D, D) bytes/s, inf on the diagonal
    latency: np.ndarray  # (D, D) seconds
    allowed: np.ndarray  # (N, D) bool
    time_scale: float  # seconds: max(critical path, total compute / D) on the fastest devices

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def num_devices(self) -> int:
        return self.compute_s.shape[1]


def node_edges(op_graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(senders, receivers, bytes per step) of the data edges deduplicated to node pairs,
    self-loops dropped; a tensor in a while-loop body moves every iteration (its trips)."""
    senders = np.asarray(op_graph.senders, np.int64)
    receivers = np.asarray(op_graph.receivers, np.int64)
    trips = np.asarray(op_graph.tensor_iterations, np.float64)[np.asarray(op_graph.edge_tensor)]
    nbytes = np.asarray(op_graph.edge_bytes, np.float64) * trips
    keep = senders != receivers
    senders, receivers, nbytes = senders[keep], receivers[keep], nbytes[keep]
    n = max(op_graph.num_ops, 1)
    key = senders * n + receivers
    unique, inverse = np.unique(key, return_inverse=True)
    summed = np.bincount(inverse, weights=nbytes, minlength=len(unique))
    return (unique // n).astype(np.int32), (unique % n).astype(np.int32), summed


def _reachability(n: int, senders: np.ndarray, receivers: np.ndarray,
                  topo_order: np.ndarray) -> np.ndarray:
    """ancestors (n, n) bool: ancestors[i, j] = j has a path to i (fine up to a few thousand)."""
    parents: list[list[int]] = [[] for _ in range(n)]
    for s, r in zip(senders.tolist(), receivers.tolist()):
        parents[r].append(s)
    ancestors = np.zeros((n, n), bool)
    for node in np.asarray(topo_order).tolist():
        for parent in parents[node]:
            ancestors[node] |= ancestors[parent]
            ancestors[node, parent] = True
    return ancestors


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
    """The placement-independent arrays of a `tfplaceto.problem.Problem`.

    Steps visit each colocation class once, by its first node's topological position.
    """
    graph = problem.graph
    n = graph.num_ops
    compute = np.asarray(problem.compute_s, np.float64)
    allowed = np.asarray(problem.allowed, bool)
    fastest = np.where(allowed, compute, np.inf).min(axis=1)
    fastest = np.where(np.isfinite(fastest), fastest, compute.min(axis=1))
    senders, receivers, nbytes = node_edges(graph)
    order_s = np.concatenate([senders, graph.control_senders]).astype(np.int64)
    order_r = np.concatenate([receivers, graph.control_receivers]).astype(np.int64)
    ancestors = _reachability(n, order_s, order_r, graph.topo_order)
    top, bottom = _levels(n, order_s, order_r, graph.topo_order, fastest)
    critical = max(float((top + bottom).max()) if n else 0.0, 1e-12)
    num_devices = compute.shape[1]
    time_scale = max(critical, float(fastest.sum()) / num_devices, 1e-12)
    memory = np.asarray(problem.cluster.memory_bytes, np.float64)
    persistent = np.asarray(graph.persistent_bytes, np.float64)
    output = np.asarray(graph.output_bytes, np.float64)
    degree = np.bincount(receivers, minlength=n) + np.bincount(senders, minlength=n)
    static = np.stack([
        fastest / max(fastest.max(initial=0.0), 1e-12),
        fastest / time_scale,
        output / max(output.max(initial=0.0), 1.0),
        persistent / max(persistent.max(initial=0.0), 1.0),
        persistent / memory.min(),
        top / critical,
        bottom / critical,
        np.log1p(degree) / np.log1p(max(degree.max(initial=0), 1)),
    ], axis=1).astype(np.float32)

    _, classes = np.unique(np.asarray(graph.colocation), return_inverse=True)
    classes = classes.astype(np.int32)
    first: dict[int, int] = {}
    for node in np.asarray(graph.topo_order).tolist():
        first.setdefault(int(classes[node]), node)
    steps = np.array(list(first.values()), np.int32)  # class representatives in topological order
    step_class = classes[steps]
    members = tuple(np.flatnonzero(classes == c) for c in step_class)
    member_matrix = np.zeros((len(steps), n), bool)
    for s, m in enumerate(members):
        member_matrix[s, m] = True
    step_ancestors = (member_matrix.astype(np.float32) @ ancestors.astype(np.float32)) > 0
    step_descendants = (member_matrix.astype(np.float32) @ ancestors.T.astype(np.float32)) > 0
    step_ancestors &= ~member_matrix
    step_descendants &= ~member_matrix
    return GraphStatics(
        num_nodes=n, senders=senders, receivers=receivers, edge_bytes=nbytes, static_nodes=static,
        fastest_s=fastest, compute_s=compute, classes=classes, steps=steps, step_class=step_class,
        members=members, step_ancestors=step_ancestors, step_descendants=step_descendants,
        memory_bytes=memory, persistent_bytes=persistent,
        bandwidth=np.asarray(problem.cluster.bandwidth, np.float64),
        latency=np.asarray(problem.cluster.latency, np.float64), allowed=allowed,
        time_scale=time_scale)


def pack(statics: Sequence[GraphStatics], dims: Dims) -> dict[str, np.ndarray]:
    """The statics of several problems, padded to `dims` and stacked (leading axis: problem)."""
    p, n, e, d, s = len(statics), dims.nodes, dims.edges, dims.devices, dims.steps
    out = {
        "node_static": np.zeros((p, n, STATIC_NODE_FEATURES), np.float32),
        "node_mask": np.zeros((p, n), np.float32),
        "classes": np.full((p, n), -1, np.int32),
        "compute": np.zeros((p, n, d), np.float32),  # / time scale
        "fastest": np.ones((p, n), np.float32),  # / time scale
        "persistent": np.zeros((p, n), np.float32),  # / smallest device memory
        "senders": np.full((p, e), n - 1, np.int32),
        "receivers": np.full((p, e), n - 1, np.int32),
        "edge_mask": np.zeros((p, e), np.float32),
        "edge_bytes": np.zeros((p, e), np.float32),  # / largest edge
        "transfer_bytes": np.zeros((p, e), np.float32),  # bytes / (time scale * 1 byte/s)
        "step_node": np.full((p, s), n - 1, np.int32),
        "step_class": np.full((p, s), -2, np.int32),
        "step_ancestors": np.zeros((p, s, n), np.float32),
        "step_descendants": np.zeros((p, s, n), np.float32),
        "memory": np.ones((p, d), np.float32),  # / smallest device memory
        "device_mask": np.zeros((p, d), np.float32),
        "inverse_bandwidth": np.zeros((p, d, d), np.float32),  # time scale^-1 bytes^-1 s... see below
        "latency": np.zeros((p, d, d), np.float32),  # / time scale
    }
    for i, st in enumerate(statics):
        nn, ee, dd, ss = st.num_nodes, len(st.senders), st.num_devices, st.num_steps
        scale = st.time_scale
        smallest = float(st.memory_bytes.min())
        out["node_static"][i, :nn] = st.static_nodes
        out["node_mask"][i, :nn] = 1.0
        out["classes"][i, :nn] = st.classes
        out["compute"][i, :nn, :dd] = st.compute_s / scale
        out["fastest"][i, :nn] = st.fastest_s / scale
        out["persistent"][i, :nn] = st.persistent_bytes / smallest
        out["senders"][i, :ee] = st.senders
        out["receivers"][i, :ee] = st.receivers
        out["edge_mask"][i, :ee] = 1.0
        out["edge_bytes"][i, :ee] = st.edge_bytes / max(st.edge_bytes.max(initial=0.0), 1.0)
        # Transfer time of edge e from device a to b, / scale = latency[a, b] / scale +
        # transfer_bytes[e] * inverse_bandwidth[a, b], with both factors of moderate size.
        out["transfer_bytes"][i, :ee] = st.edge_bytes / 1e6
        out["step_node"][i, :ss] = st.steps
        out["step_class"][i, :ss] = st.step_class
        out["step_ancestors"][i, :ss, :nn] = st.step_ancestors
        out["step_descendants"][i, :ss, :nn] = st.step_descendants
        out["memory"][i, :dd] = st.memory_bytes / smallest
        out["device_mask"][i, :dd] = 1.0
        with np.errstate(divide="ignore"):
            inverse = np.where(np.isfinite(st.bandwidth) & (st.bandwidth > 0), 1e6 / st.bandwidth, 0.0)
        np.fill_diagonal(inverse, 0.0)
        out["inverse_bandwidth"][i, :dd, :dd] = inverse / scale
        latency = st.latency.copy()
        np.fill_diagonal(latency, 0.0)
        out["latency"][i, :dd, :dd] = latency / scale
    return out


def observation(statics: GraphStatics, dims: Dims, problem: int, step: int, placement: np.ndarray,
                visited: np.ndarray, start_s: np.ndarray, end_s: np.ndarray, busy_s: np.ndarray,
                peak_bytes: np.ndarray, step_time_s: float) -> dict[str, np.ndarray]:
    """One episode's observation (numpy, padded to dims). `step` is the index of the class to place."""
    obs = empty_observations(dims, 1)
    fill_observation(obs, 0, statics, problem, step, placement, visited, start_s, end_s, busy_s,
                     peak_bytes, step_time_s)
    return {k: v[0] for k, v in obs.items()}


def fill_observation(obs: dict, row: int, statics: GraphStatics, problem: int, step: int, placement,
                     visited, start_s, end_s, busy_s, peak_bytes, step_time_s) -> None:
    """Writes one episode's observation into row `row` of the batched arrays `obs`."""
    n, d = statics.num_nodes, statics.num_devices
    scale = statics.time_scale
    obs[PROBLEM][row] = problem
    obs[STEP][row] = step
    obs[PLACEMENT][row, :n] = placement
    obs[PLACEMENT][row, n:] = 0
    obs[VISITED][row, :n] = visited
    obs[START][row, :n] = np.minimum(start_s / scale, 1e3)
    obs[END][row, :n] = np.minimum(end_s / scale, 1e3)
    obs[BUSY][row, :d] = busy_s / scale
    obs[PEAK][row, :d] = peak_bytes / statics.memory_bytes
    obs[STEP_TIME][row] = step_time_s / scale
    obs[ACTION_MASK][row] = False
    obs[ACTION_MASK][row, :d] = statics.allowed[statics.steps[min(step, statics.num_steps - 1)]]


# -- TensorFlow: features of a batch of observations ----------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Features:
    """Tensors the network reads (B: batch, N: node slots, E: edge slots, D: device slots)."""

    nodes: object  # (B, N, NODE_FEATURES)
    edges: object  # (B, E, EDGE_FEATURES)
    senders: object  # (B, E) int32
    receivers: object  # (B, E) int32
    node_mask: object  # (B, N)
    current: object  # (B, N): 1 on the nodes of the class being placed
    ancestors: object  # (B, N)
    descendants: object  # (B, N)
    placement: object  # (B, N) int32
    devices: object  # (B, D, DEVICE_FEATURES)
    action_mask: object  # (B, D) bool


def compute_features(statics: dict, obs: dict) -> Features:
    """Node, edge and (class, device) features of a batch of observations (TensorFlow).

    Node features: the static ones (fastest compute / max and / scale, output bytes, persistent
    bytes / max and / memory, top and bottom level, log degree), then start relative to the
    current class's start, duration, is-current, visited, on the current class's device, peak
    memory of its device, log slowdown of its device for it, it is a parent or child of the class.
    Edge features: bytes / max, crosses devices, transfer time.
    Device features of (current class, d): on d now, busy time of d, peak memory of d, persistent
    memory on d with the class moved there, seconds to receive its inputs / send its outputs if on
    d, earliest time its inputs could all be on d (relative to its start), compute on d, log
    slowdown on d, d is its fastest, byte shares of its inputs / outputs on d, compute of the
    visited nodes on d (relative to a fair share), d allowed, the step time, the number of devices.
    """
    import tensorflow as tf

    problem = obs[PROBLEM]

    def static(name):
        return tf.gather(statics[name], problem)

    step = obs[STEP]
    placement = obs[PLACEMENT]
    node_mask = static("node_mask")
    num_devices = tf.shape(obs[ACTION_MASK])[1]  # device slots
    devices_f = tf.reduce_sum(static("device_mask"), -1, keepdims=True)  # (B, 1) real devices
    step_class = tf.gather(static("step_class"), step, batch_dims=1)  # (B,)
    rep = tf.gather(static("step_node"), step, batch_dims=1)  # (B,)
    current = tf.cast(tf.equal(static("classes"), step_class[:, None]), tf.float32) * node_mask
    ancestors = tf.gather(static("step_ancestors"), step, batch_dims=1)
    descendants = tf.gather(static("step_descendants"), step, batch_dims=1)
    on_device = tf.one_hot(placement, num_devices) * node_mask[..., None]  # (B, N, D)
    current_device = tf.gather(placement, rep, batch_dims=1)  # (B,)
    current_onehot = tf.one_hot(current_device, num_devices)  # (B, D)
    start, end = obs[START], obs[END]
    current_start = tf.gather(start, rep, batch_dims=1)[:, None]
    compute = static("compute")  # (B, N, D)
    fastest = static("fastest")
    actual = tf.reduce_sum(compute * on_device, -1)
    peak = obs[PEAK]

    # -- edges
    senders, receivers = static("senders"), static("receivers")
    edge_mask = static("edge_mask")
    src = tf.gather(on_device, senders, batch_dims=1)  # (B, E, D) one-hot of the sender's device
    dst = tf.gather(on_device, receivers, batch_dims=1)
    latency, inverse_bandwidth = static("latency"), static("inverse_bandwidth")  # (B, D, D)
    nbytes = static("transfer_bytes")[..., None]
    # Seconds (/ scale) to move each edge's tensor from its sender's device to device d, and from
    # device d to its receiver's device.
    to_device = (tf.einsum("bea,bad->bed", src, latency)
                 + nbytes * tf.einsum("bea,bad->bed", src, inverse_bandwidth))
    from_device = (tf.einsum("bea,bda->bed", dst, latency)
                   + nbytes * tf.einsum("bea,bda->bed", dst, inverse_bandwidth))
    transfer = tf.reduce_sum(to_device * dst, -1)
    crosses = 1.0 - tf.reduce_sum(src * dst, -1)
    edges = tf.stack([static("edge_bytes"), crosses * edge_mask,
                      tf.clip_by_value(transfer, 0.0, CLIP) * edge_mask], -1)

    # -- nodes
    sender_current = tf.gather(current, senders, batch_dims=1)
    receiver_current = tf.gather(current, receivers, batch_dims=1)
    into = receiver_current * (1.0 - sender_current) * edge_mask  # (B, E) inputs of the class
    out_of = sender_current * (1.0 - receiver_current) * edge_mask
    n = tf.shape(node_mask)[1]
    parent = tf.minimum(tf.math.unsorted_segment_sum(
        tf.reshape(into, [-1]), tf.reshape(senders + n * tf.range(tf.shape(senders)[0])[:, None], [-1]),
        tf.size(node_mask)), 1.0)
    child = tf.minimum(tf.math.unsorted_segment_sum(
        tf.reshape(out_of, [-1]), tf.reshape(receivers + n * tf.range(tf.shape(senders)[0])[:, None],
                                             [-1]), tf.size(node_mask)), 1.0)
    parent, child = tf.reshape(parent, tf.shape(node_mask)), tf.reshape(child, tf.shape(node_mask))
    same_device = tf.reduce_sum(on_device * current_onehot[:, None, :], -1)
    dynamic = tf.stack([
        tf.clip_by_value(start - current_start, -CLIP, CLIP),
        tf.clip_by_value(end - start, 0.0, CLIP),
        current, obs[VISITED], same_device,
        tf.clip_by_value(tf.reduce_sum(on_device * peak[:, None, :], -1), 0.0, CLIP),
        tf.clip_by_value(tf.math.log((actual + 1e-6) / (fastest + 1e-6)), 0.0, CLIP),
        parent - child,
    ], -1) * node_mask[..., None]
    nodes = tf.concat([static("node_static"), dynamic], -1)

    # -- (current class, device)
    def masked_sum(weights, values):  # (B, E) x (B, E, D) -> (B, D)
        return tf.einsum("be,bed->bd", weights, values)

    receive = masked_sum(into, to_device)
    send = masked_sum(out_of, from_device)
    sender_end = tf.gather(end, senders, batch_dims=1)[..., None]
    ready = tf.reduce_max(into[..., None] * (sender_end + to_device), axis=1) - current_start
    in_bytes = into * static("edge_bytes")
    out_bytes = out_of * static("edge_bytes")
    in_share = masked_sum(in_bytes, src) / tf.maximum(tf.reduce_sum(in_bytes, -1, keepdims=True), 1e-9)
    out_share = masked_sum(out_bytes, dst) / tf.maximum(tf.reduce_sum(out_bytes, -1, keepdims=True), 1e-9)
    class_compute = tf.einsum("bn,bnd->bd", current, compute)
    allowed = obs[ACTION_MASK]
    allowed_f = tf.cast(allowed, tf.float32)
    best = tf.reduce_min(tf.where(allowed, class_compute, 1e9), -1, keepdims=True)
    persistent = static("persistent")
    memory = static("memory")
    on_persistent = tf.einsum("bn,bnd->bd", persistent, on_device)
    class_persistent = tf.reduce_sum(persistent * current, -1, keepdims=True)
    moved_persistent = on_persistent - class_persistent * current_onehot + class_persistent
    visited_compute = tf.einsum("bn,bnd->bd", obs[VISITED] * fastest, on_device)
    fair_share = tf.maximum(tf.reduce_sum(fastest * node_mask, -1, keepdims=True) / devices_f, 1e-9)
    per_device = tf.ones_like(allowed_f)
    devices = tf.stack([
        current_onehot,
        tf.clip_by_value(obs[BUSY], 0.0, CLIP),
        tf.clip_by_value(peak, 0.0, CLIP),
        tf.clip_by_value(moved_persistent / memory, 0.0, CLIP),
        tf.clip_by_value(receive, 0.0, CLIP),
        tf.clip_by_value(send, 0.0, CLIP),
        tf.clip_by_value(ready, -CLIP, CLIP),
        tf.clip_by_value(class_compute, 0.0, CLIP),
        tf.clip_by_value(tf.math.log((class_compute + 1e-6) / (best + 1e-6)), 0.0, CLIP),
        tf.cast(class_compute <= best * (1 + 1e-6), tf.float32),
        in_share, out_share,
        tf.clip_by_value(visited_compute / fair_share, 0.0, CLIP),
        allowed_f,
        per_device * tf.clip_by_value(obs[STEP_TIME], 0.0, CLIP)[:, None],
        per_device * tf.math.log(devices_f),  # (B, 1) broadcast
        per_device * tf.cast(tf.reduce_sum(in_bytes, -1, keepdims=True) > 0, tf.float32),
    ], -1) * allowed_f[..., None]
    return Features(nodes=nodes, edges=edges, senders=senders, receivers=receivers,
                    node_mask=node_mask, current=current, ancestors=ancestors,
                    descendants=descendants, placement=placement, devices=devices,
                    action_mask=allowed)
