"""What the policy sees, on the numpy side: the static arrays of each graph and the per-step
observation. The network's features computed from both (TensorFlow) are `features.py`.

The observation holds only what changes during an episode; everything that depends on the graph
alone is packed once per set of problems (`pack`) and kept on the TensorFlow side, so a step feeds
a few (N,) arrays per episode, not the graph. Map of the file:

  Field names        PROBLEM, STEP, PLACEMENT, ... : keys of an observation (graph_nets style).
  Dims, dims_for     padded sizes (nodes, edges, devices, steps) shared by every packed problem.
  observation_spec   the TF-Agents ArraySpec of one observation; empty_observations, zeroed.
  GraphStatics       placement-independent arrays of one Problem (`graph_statics`): node-level
                     data edges (`node_edges`), colocation classes and the visiting order
                     (steps), the ancestors and descendants of each step's class, static node
                     features, time scale, each node's topological position, and the
                     tensors with their readers (what `memory_fits` holds).
  memory_fits        whether a class fits on each device, by the peak memory of what the episode
                     has placed (the environment's memory mask, `memory_headroom`).
  step_edges         per step, the edges into and out of its class (what the device features
                     sum over).
  pack               the statics of several problems padded to one Dims and stacked: the tensors
                     the network gathers from by each observation's PROBLEM index.
  observation        one episode's observation as numpy arrays (`fill_observation`: one row of a
                     batch; `fill_observations`: the rows of several episodes of one problem, what
                     the environment writes).

Scales: times are divided by the problem's `time_scale` (its lower bound: max(critical path,
total compute / devices) on the fastest devices), so the features of a graph keep their meaning
during an episode and across graphs and clusters; memory by each device's capacity; bytes by the
graph's largest edge. Padding: the last node slot of every problem is a dummy node that padded
edges point at (it never receives a real message); padded devices are never allowed.
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

STATIC_NODE_FEATURES = 8  # columns of GraphStatics.static_nodes (features.py appends the dynamic ones)


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
    output_bytes: np.ndarray  # (N,) bytes of each node's outputs per step
    bandwidth: np.ndarray  # (D, D) bytes/s, inf on the diagonal
    latency: np.ndarray  # (D, D) seconds
    allowed: np.ndarray  # (N, D) bool
    time_scale: float  # seconds: max(critical path, total compute / D) on the fastest devices
    position: np.ndarray  # (N,) int64: each node's place in the topological order (`graph.topo_order`)
    tensor_producer: np.ndarray  # (T,) int64: the node making each tensor
    tensor_bytes: np.ndarray  # (T,) float64: bytes of one of its buffers (one iteration's)
    read_tensor: np.ndarray  # (R,) int64: tensor of each (tensor, reader) pair
    reader: np.ndarray  # (R,) int64: reader of each (tensor, reader) pair
    tensor_last_use: np.ndarray  # (T,) int64: the position of its last reader (its producer's if none)
    scratch_bytes: np.ndarray  # (N,) float64: output bytes beyond its tensors', held while it runs
    one_device_bytes: float  # `memory_fits`'s peak of every node on one device: no device holds more

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

    position = np.empty(n, np.int64)
    position[np.asarray(graph.topo_order, np.int64)] = np.arange(n)
    # Memory as the simulator holds it: each tensor until its last reader, a node's scratch
    # bytes while it runs.
    tensor_producer = np.asarray(graph.tensor_producer, np.int64)
    tensor_bytes = np.asarray(graph.tensor_bytes, np.float64)
    pairs = np.unique(np.stack([np.asarray(graph.edge_tensor, np.int64),
                                np.asarray(graph.edge_consumer, np.int64)], 1), axis=0).reshape(-1, 2)
    read_tensor, reader = pairs[:, 0], pairs[:, 1]
    tensor_last_use = position[tensor_producer]
    np.maximum.at(tensor_last_use, read_tensor, position[reader])
    scratch = np.asarray(graph.scratch_bytes, np.float64)
    one_device = float(persistent.sum() + _outputs_held(position, tensor_producer, tensor_last_use, tensor_bytes,
                                                        scratch, np.ones(n, bool)).max(initial=0.0))

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
        memory_bytes=memory, persistent_bytes=persistent, output_bytes=output,
        bandwidth=np.asarray(problem.cluster.bandwidth, np.float64),
        latency=np.asarray(problem.cluster.latency, np.float64), allowed=allowed,
        time_scale=time_scale, position=position, tensor_producer=tensor_producer, tensor_bytes=tensor_bytes,
        read_tensor=read_tensor, reader=reader, tensor_last_use=tensor_last_use, scratch_bytes=scratch,
        one_device_bytes=one_device)


def _held_bytes(n: int, begins: np.ndarray, ends: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """(n,) the bytes held at each of n topological positions by buffers of `nbytes` held from
    position `begins` through position `ends`."""
    delta = np.zeros(n + 1)
    np.add.at(delta, begins, nbytes)
    np.add.at(delta, np.asarray(ends) + 1, -np.asarray(nbytes, np.float64))
    return np.cumsum(delta)[:n]


def _outputs_held(position: np.ndarray, tensor_producer: np.ndarray, tensor_last_use: np.ndarray,
                  tensor_bytes: np.ndarray, scratch_bytes: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """(N,) the bytes held at each topological position by the outputs of `nodes` ((N,) bool) on
    their own device: each tensor until its last reader, the scratch bytes while its node runs."""
    ours = nodes[tensor_producer]
    return _held_bytes(len(position), np.concatenate([position[tensor_producer[ours]], position[nodes]]),
                       np.concatenate([tensor_last_use[ours], position[nodes]]),
                       np.concatenate([tensor_bytes[ours], scratch_bytes[nodes]]))


def memory_fits(statics: GraphStatics, steps: np.ndarray, placements: np.ndarray, visited: np.ndarray,
                headroom: float) -> np.ndarray:
    """(k, D) bool: for k episodes of one problem, whether the class of each episode's current
    step fits on each device: the peak memory of the device, within `headroom` x its memory, as
    if every device ran its ops one by one in the topological order of the step (one clock for
    all: `GraphStatics.position`). A device holds the persistent bytes of its nodes all step;
    each tensor a node makes from the node until its last reader on that device (or the node
    itself when every reader is elsewhere: it is sent and freed); the rest of a node's output
    bytes while it runs; and a copy of a tensor read from another device from its producer until
    the copy's last reader there. The nodes not yet visited (a random start's) hold nothing, and
    a reader not yet visited is taken to be on its producer's device (most are); the class's own
    nodes count where it would go, not where they are.

    On one device this is the simulator's peak when the simulator runs the ops in that order
    (ResNet50's training step: to the byte); over several it leaves out transfer times and
    queues, so a placement it fits may still peak a little higher (a headroom below 1 is for
    that). No device ever holds more than `GraphStatics.one_device_bytes` by it (what it holds
    is a part of what one device would, over shorter times)."""
    n, d = statics.num_nodes, statics.num_devices
    position, persistent, scratch = statics.position, statics.persistent_bytes, statics.scratch_bytes
    producer, nbytes = statics.tensor_producer, statics.tensor_bytes
    read_tensor, reader = statics.read_tensor, statics.reader
    read_from = producer[read_tensor]
    limit = headroom * statics.memory_bytes
    fits = np.empty((len(placements), d), bool)
    for row, step in enumerate(np.minimum(steps, statics.num_steps - 1)):
        members, placement = statics.members[step], placements[row]
        seen = np.asarray(visited[row]) > 0
        seen[members] = False  # a class visited before (a later pass) counts where it would go
        # Each visited tensor: held on its device until its last reader there, or a copy's end.
        local = ~seen[reader] | (placement[reader] == placement[read_from])
        own_end = position[producer]
        np.maximum.at(own_end, read_tensor[local], position[reader[local]])
        copy_end = np.full((len(producer), d), -1)
        remote = seen[read_from] & ~local
        np.maximum.at(copy_end, (read_tensor[remote], placement[reader[remote]]), position[reader[remote]])
        made = seen[producer]
        copied, copy_device = np.nonzero(copy_end >= 0)
        alive = np.zeros((d, n + 1))
        for device, begins, ends, held_bytes in (
                (placement[producer[made]], position[producer[made]], own_end[made], nbytes[made]),
                (placement[seen], position[seen], position[seen], scratch[seen]),
                (copy_device, position[producer[copied]], copy_end[copied, copy_device], nbytes[copied])):
            np.add.at(alive, (device, begins), held_bytes)
            np.add.at(alive, (device, ends + 1), -held_bytes)
        held = np.cumsum(alive, axis=1)[:, :n]  # (D, N): bytes held at each position
        fixed = np.bincount(placement[seen], weights=persistent[seen], minlength=d) + persistent[members].sum()
        # The class: its tensors held until their last reader (none visited yet: all local), and
        # on a device other than an input's, a copy of that input until the class reads it.
        mine = np.zeros(n, bool)
        mine[members] = True
        own = _outputs_held(position, producer, statics.tensor_last_use, nbytes, scratch, mine)
        reads = mine[reader] & seen[read_from]
        last_read = np.full(len(producer), -1)  # of each visited input, by the class
        np.maximum.at(last_read, read_tensor[reads], position[reader[reads]])
        inputs = np.flatnonzero(last_read >= 0)
        for device in range(d):
            copies = np.zeros(n + 1)
            for tensor in inputs[placement[producer[inputs]] != device].tolist():
                held_until = copy_end[tensor, device]  # -1: no copy there yet
                begins = held_until + 1 if held_until >= 0 else position[producer[tensor]]
                if last_read[tensor] >= begins:  # a new copy, or one held longer
                    copies[begins] += nbytes[tensor]
                    copies[last_read[tensor] + 1] -= nbytes[tensor]
            peak = (held[device] + own + np.cumsum(copies)[:n]).max(initial=0.0)
            fits[row, device] = fixed[device] + peak <= limit[device]
    return fits


def step_edges(statics: GraphStatics) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per step, (the edges into its class, the edges out of it): the edges between a node of
    the class and one outside it, as indices into `statics.senders`, ascending."""
    sender_class, receiver_class = statics.classes[statics.senders], statics.classes[statics.receivers]
    crossing = sender_class != receiver_class
    into = [np.flatnonzero(crossing & (receiver_class == c)) for c in statics.step_class]
    out_of = [np.flatnonzero(crossing & (sender_class == c)) for c in statics.step_class]
    return into, out_of


def pack(statics: Sequence[GraphStatics], dims: Dims) -> dict[str, np.ndarray]:
    """The statics of several problems, padded to `dims` and stacked (leading axis: problem).

    Besides `dims`' sizes, the per-step edge lists (`step_edges`) are padded to the most edges
    into (out of) any class of these problems (at least 1), with a mask."""
    p, n, e, d, s = len(statics), dims.nodes, dims.edges, dims.devices, dims.steps
    incident = [step_edges(st) for st in statics]
    k_in = max([1] + [len(edges) for into, _ in incident for edges in into])
    k_out = max([1] + [len(edges) for _, out_of in incident for edges in out_of])
    out = {
        "node_static": np.zeros((p, n, STATIC_NODE_FEATURES), np.float32),
        "node_mask": np.zeros((p, n), np.float32),
        "classes": np.full((p, n), -1, np.int32),
        "compute": np.zeros((p, n, d), np.float32),  # / time scale
        "fastest": np.ones((p, n), np.float32),  # / time scale
        "persistent": np.zeros((p, n), np.float32),  # / smallest device memory
        "claimed": np.zeros((p, n), np.float32),  # (persistent + output bytes) / smallest device memory
        "senders": np.full((p, e), n - 1, np.int32),
        "receivers": np.full((p, e), n - 1, np.int32),
        "edge_mask": np.zeros((p, e), np.float32),
        "edge_bytes": np.zeros((p, e), np.float32),  # / largest edge
        "transfer_bytes": np.zeros((p, e), np.float32),  # bytes / (time scale * 1 byte/s)
        "step_node": np.full((p, s), n - 1, np.int32),
        "step_class": np.full((p, s), -2, np.int32),
        "step_ancestors": np.zeros((p, s, n), np.float32),
        "step_descendants": np.zeros((p, s, n), np.float32),
        "step_in_edges": np.zeros((p, s, k_in), np.int32),  # edges into the step's class (`step_edges`)
        "step_in_mask": np.zeros((p, s, k_in), np.float32),
        "step_out_edges": np.zeros((p, s, k_out), np.int32),  # edges out of it
        "step_out_mask": np.zeros((p, s, k_out), np.float32),
        "memory": np.ones((p, d), np.float32),  # / smallest device memory
        "device_mask": np.zeros((p, d), np.float32),
        "inverse_bandwidth": np.zeros((p, d, d), np.float32),  # time scale^-1 bytes^-1 s... see below
        "latency": np.zeros((p, d, d), np.float32),  # / time scale
        # What moving a tensor off a device costs, whatever the placement: per edge, its transfer
        # time between two distinct devices (the mean over the pairs) / time scale; per device,
        # the mean latency / scale and inverse bandwidth (as above) to the other devices.
        "edge_cross": np.zeros((p, e), np.float32),
        "latency_from": np.zeros((p, d), np.float32),
        "inverse_bandwidth_from": np.zeros((p, d), np.float32),
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
        out["claimed"][i, :nn] = (st.persistent_bytes + st.output_bytes) / smallest
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
        for step, (into, out_of) in enumerate(zip(*incident[i])):
            out["step_in_edges"][i, step, :len(into)], out["step_in_mask"][i, step, :len(into)] = into, 1.0
            out["step_out_edges"][i, step, :len(out_of)], out["step_out_mask"][i, step, :len(out_of)] = out_of, 1.0
        out["memory"][i, :dd] = st.memory_bytes / smallest
        out["device_mask"][i, :dd] = 1.0
        with np.errstate(divide="ignore"):
            inverse = np.where(np.isfinite(st.bandwidth) & (st.bandwidth > 0), 1e6 / st.bandwidth, 0.0)
        np.fill_diagonal(inverse, 0.0)
        out["inverse_bandwidth"][i, :dd, :dd] = inverse / scale
        latency = st.latency.copy()
        np.fill_diagonal(latency, 0.0)
        out["latency"][i, :dd, :dd] = latency / scale
        if dd > 1:
            other = ~np.eye(dd, dtype=bool)
            out["latency_from"][i, :dd] = latency.sum(1) / (dd - 1) / scale
            out["inverse_bandwidth_from"][i, :dd] = inverse.sum(1) / (dd - 1) / scale
            out["edge_cross"][i, :ee] = (latency[other].mean() + out["transfer_bytes"][i, :ee]
                                         * inverse[other].mean()) / scale
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
    fill_observations(obs, np.array([row]), statics, problem, np.array([step]), np.asarray(placement)[None],
                      np.asarray(visited)[None], np.asarray(start_s)[None], np.asarray(end_s)[None],
                      np.asarray(busy_s)[None], np.asarray(peak_bytes)[None], np.array([step_time_s]))


def fill_observations(obs: dict, rows: np.ndarray, statics: GraphStatics, problem: int, steps: np.ndarray,
                      placements, visited, starts_s, ends_s, busy_s, peak_bytes, step_times_s) -> None:
    """`fill_observation` for several episodes of one problem at once: rows `rows` (k,) of the
    batched arrays `obs` from the episodes' arrays stacked (k, ...)."""
    n, d = statics.num_nodes, statics.num_devices
    scale = statics.time_scale
    obs[PROBLEM][rows] = problem
    obs[STEP][rows] = steps
    obs[PLACEMENT][rows, :n] = placements
    obs[PLACEMENT][rows, n:] = 0
    obs[VISITED][rows, :n] = visited
    obs[START][rows, :n] = np.minimum(starts_s / scale, 1e3)
    obs[END][rows, :n] = np.minimum(ends_s / scale, 1e3)
    obs[BUSY][rows, :d] = busy_s / scale
    obs[PEAK][rows, :d] = peak_bytes / statics.memory_bytes
    obs[STEP_TIME][rows] = step_times_s / scale
    obs[ACTION_MASK][rows] = False
    obs[ACTION_MASK][rows, :d] = statics.allowed[statics.steps[np.minimum(steps, statics.num_steps - 1)]]
