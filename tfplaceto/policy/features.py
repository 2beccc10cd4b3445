"""What the network reads: node, edge and (current class, device) features of a batch of
observations (TensorFlow), from the packed statics. The numpy side (observation fields, Dims,
GraphStatics, `pack`, the observation itself) is `observation.py`.

  NODE_FEATURES, EDGE_FEATURES, DEVICE_FEATURES   the width of each kind of feature (the network's
                     input sizes), and `widths`: with `transfer_costs`' columns or without (what a
                     policy directory records).
  Features           the tensors the network reads (batch, node, edge and device slots).
  compute_features   Features of a batch of observations: gathers each observation's problem
                     from the packed statics by its PROBLEM index, then the dynamic features.
  VIEWS              what of the current placement a policy sees ("full", "placed" or
                     "scheduled").
  SCHEDULE_OF        what schedule each view reads (the environment's `schedule`).

Views. "full" (the paper's): every node's current device and the simulated schedule of the whole
current placement. "placed": only what the episode has placed so far: the devices of the visited
nodes, nothing of the schedule, of the current class's own device or of where its consumers are;
in place of the simulated peak memory of each device it sees the memory the visited nodes there
claim (their persistent and output bytes, with the current class's added on the device it would
go to; on the single device of the built-in graphs within 1.0-2.3x of the simulated peak), so a
policy can see a device fill up before the OOM penalty says so. On a later pass of an episode
(`PlacementEnvironment(passes=...)`) every node has been visited: it sees the whole placement the
episode made, the current class's own device and its consumers' included.
From a random start the nodes not yet visited sit on random devices and every one of them will be
visited again; what "full" shows of them is noise for the end placement, and a policy must learn
to ignore it. With "placed" a greedy episode ends at the same placement from every start; the
columns a view does not see are zero (the widths, and so the network, are the same for both).
"scheduled": "placed", plus the simulated schedule of the visited nodes alone (the environment's
`schedule="visited"`): when each placed node runs, how long each device is busy, when the current
class's inputs could reach each device, the makespan so far; the nodes not yet visited take no
time there. In topological order these are what a list scheduler (HEFT, m-ETF) decides by, and
they do not depend on the start either.

Scales are those of `observation.py` (times / the problem's time scale, memory / device memory,
bytes / the largest edge); ratios are clipped to +-CLIP.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from tfplaceto.policy.observation import (
    ACTION_MASK,
    BUSY,
    END,
    PEAK,
    PLACEMENT,
    PROBLEM,
    START,
    STATIC_NODE_FEATURES,
    STEP,
    STEP_TIME,
    VISITED,
)

NODE_FEATURES = STATIC_NODE_FEATURES + 8
EDGE_FEATURES = 3
DEVICE_FEATURES = 17
TRANSFER_COST_FEATURES = {"edge": 1, "device": 1}  # the columns `transfer_costs` adds
UNVISITED_WORK_FEATURES = 2  # the device columns `unvisited_work` adds
CLIP = 10.0
VIEWS = ("full", "placed", "scheduled")
SCHEDULE_OF = {"full": "placement", "placed": "placement", "scheduled": "visited"}


def widths(transfer_costs: bool = False, unvisited_work: bool = False) -> dict[str, int]:
    """The width of each kind of feature (what a policy directory records), with or without
    the `transfer_costs` and `unvisited_work` columns."""
    return {"node": NODE_FEATURES,
            "edge": EDGE_FEATURES + TRANSFER_COST_FEATURES["edge"] * transfer_costs,
            "device": DEVICE_FEATURES + TRANSFER_COST_FEATURES["device"] * transfer_costs
            + UNVISITED_WORK_FEATURES * unvisited_work}


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
    seen: object  # (B, N): the nodes whose device the view shows (with "placed": the visited ones)
    devices: object  # (B, D, DEVICE_FEATURES)
    action_mask: object  # (B, D) bool


def compute_features(statics: dict, obs: dict, view: str = "full", transfer_costs: bool = False,
                     unvisited_work: bool = False) -> Features:
    """Node, edge and (class, device) features of a batch of observations (TensorFlow) as `view`
    sees them (module docstring: "full", "placed" or "scheduled"), with `transfer_costs` one
    column more of edges and of devices.

    Node features: the static ones (fastest compute / max and / scale, output bytes, persistent
    bytes / max and / memory, top and bottom level, log degree), then start relative to the
    current class's start, duration, is-current, visited, on the current class's device, peak
    memory of its device, log slowdown of its device for it, it is a parent or child of the class.
    Edge features: bytes / max, crosses devices, transfer time.
    Device features of (current class, d): on d now, busy time of d, peak memory of d, persistent
    memory on d with the class moved there, seconds to receive its inputs / send its outputs if on
    d, earliest time its inputs could all be on d (relative to its start), compute on d, log
    slowdown on d, d is its fastest, byte shares of its inputs / outputs on d, compute of the
    visited nodes on d (relative to a fair share; "placed": of the visited nodes that may run at
    the same time as the class), d allowed, the step time, the number of devices.
    `transfer_costs`: what a tensor costs to move whatever the placement: every edge's transfer
    time between two distinct devices (the pairs' mean), and per device, the seconds to send the
    class's outputs from d to another device. Why: the other features price an edge only once
    the view shows both its ends on devices; with "placed" in topological order that is never
    the case for the class's outputs (its consumers are not yet visited), so a policy sees what
    leaving its inputs' device costs, but not what its consumers pay to come back (a split's
    other half).
    `unvisited_work`: the work the episode has yet to visit, relative to a fair share: of the nodes
    that may run at the same time as the class, and of its descendants (the same for every
    device). Why: in topological order the class that begins a branch is placed before any of
    the work in parallel with it is visited, so the visited work alone cannot tell a branch
    worth its own device from one that is not.
    """
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    placed = view != "full"  # "placed" or "scheduled": what the episode has visited
    problem = obs[PROBLEM]

    step = obs[STEP]

    def static(name):
        return tf.gather(statics[name], problem)

    # The per-step statics are gathered at (problem, step) directly: gathering the problem's
    # (S, N) arrays for every observation first costs ~0.1 s for a 512-step update batch.
    problem_step = tf.stack([problem, step], -1)

    def static_at_step(name):
        return tf.gather_nd(statics[name], problem_step)

    placement = obs[PLACEMENT]
    node_mask = static("node_mask")
    num_devices = tf.shape(obs[ACTION_MASK])[1]  # device slots
    devices_f = tf.reduce_sum(static("device_mask"), -1, keepdims=True)  # (B, 1) real devices
    step_class = static_at_step("step_class")  # (B,)
    rep = static_at_step("step_node")  # (B,)
    current = tf.cast(tf.equal(static("classes"), step_class[:, None]), tf.float32) * node_mask
    ancestors = static_at_step("step_ancestors")
    descendants = static_at_step("step_descendants")
    seen = node_mask * obs[VISITED] if placed else node_mask  # the nodes whose device the view shows
    on_device = tf.one_hot(placement, num_devices) * seen[..., None]  # (B, N, D)
    current_device = tf.gather(placement, rep, batch_dims=1)  # (B,)
    # "placed" shows the class's own device once the episode has chosen it: on a later pass
    # (`PlacementEnvironment(passes=...)`), never on the first, where the class is not yet visited.
    current_seen = tf.gather(seen, rep, batch_dims=1)[:, None]  # (B, 1)
    current_onehot = tf.one_hot(current_device, num_devices) * current_seen  # (B, D)
    start, end, peak, busy, step_time = (obs[START], obs[END], obs[PEAK], obs[BUSY], obs[STEP_TIME])
    if view == "placed":  # the schedule of a placement that is partly random
        start, end, busy, step_time = (tf.zeros_like(x) for x in (start, end, busy, step_time))
    if placed:
        claimed = static("claimed")  # (B, N) / smallest device memory
        class_claimed = tf.reduce_sum(claimed * current, -1, keepdims=True)
        peak = (tf.einsum("bn,bnd->bd", claimed, on_device) + class_claimed * (1.0 - current_onehot)) / static("memory")
    current_start = tf.gather(start, rep, batch_dims=1)[:, None]
    compute = static("compute")  # (B, N, D)
    fastest = static("fastest")
    # A one-hot row of `on_device` selects one entry of what it multiplies: the node and edge
    # features gather that entry (the same value: the other terms of the sum are exact zeros)
    # instead of forming (B, N, D) and (B, E, D) products.
    problem_node = tf.stack([tf.broadcast_to(problem[:, None], tf.shape(placement)),
                             tf.broadcast_to(tf.range(tf.shape(placement)[1])[None], tf.shape(placement))], -1)
    actual = tf.gather_nd(statics["compute"], tf.concat([problem_node, placement[..., None]], -1)) * seen

    # -- edges
    senders, receivers = static("senders"), static("receivers")
    edge_mask = static("edge_mask")
    latency, inverse_bandwidth = static("latency"), static("inverse_bandwidth")  # (B, D, D)
    nbytes = static("transfer_bytes")

    def rows(matrix, nodes):  # (B, D, D) at the devices of nodes (B, K): (B, K, D), 0 where unseen
        # What the product of the node's one-hot row with `matrix` selects, without the product.
        return (tf.gather(matrix, tf.gather(placement, nodes, batch_dims=1), batch_dims=1)
                * tf.gather(seen, nodes, batch_dims=1)[..., None])

    sender_device, receiver_device = (tf.gather(placement, nodes, batch_dims=1) for nodes in (senders, receivers))
    seen_senders, seen_receivers = (tf.gather(seen, nodes, batch_dims=1) for nodes in (senders, receivers))

    def entry(matrix):  # (B, D, D) at each edge's (sender's device, receiver's device): (B, E), 0 where unseen
        return tf.gather_nd(matrix, tf.stack([sender_device, receiver_device], -1), batch_dims=1) * seen_senders

    # Seconds (/ scale) to move each edge's tensor from its sender's device to its receiver's
    # (the device features below price the class's own edges to and from every device alike).
    transfer = (entry(latency) + nbytes * entry(inverse_bandwidth)) * seen_receivers
    crosses = 1.0 - seen_senders * seen_receivers * tf.cast(tf.equal(sender_device, receiver_device), tf.float32)
    edge_columns = [static("edge_bytes"), crosses * edge_mask, tf.clip_by_value(transfer, 0.0, CLIP) * edge_mask]
    if transfer_costs:
        edge_columns.append(tf.clip_by_value(static("edge_cross"), 0.0, CLIP) * edge_mask)
    edges = tf.stack(edge_columns, -1)

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
    same_device = seen * tf.cast(tf.equal(placement, current_device[:, None]), tf.float32) * current_seen
    dynamic = tf.stack([
        tf.clip_by_value(start - current_start, -CLIP, CLIP),
        tf.clip_by_value(end - start, 0.0, CLIP),
        current, obs[VISITED], same_device,
        tf.clip_by_value(tf.gather(peak, placement, batch_dims=1) * seen, 0.0, CLIP),
        tf.clip_by_value(tf.math.log((actual + 1e-6) / (fastest + 1e-6)), 0.0, CLIP),
        parent - child,
    ], -1) * node_mask[..., None]
    nodes = tf.concat([static("node_static"), dynamic], -1)

    # -- (current class, device)
    # Sums over the edges into (out of) the class, from the step's own edge lists (`pack`): the
    # same terms as summing over all E edges weighted by `into` (`out_of`), which are 0 elsewhere,
    # without the (B, E, D) arrays of every edge (most of what scoring a step cost).
    in_edges, in_mask = static_at_step("step_in_edges"), static_at_step("step_in_mask")  # (B, K)
    out_edges, out_mask = static_at_step("step_out_edges"), static_at_step("step_out_mask")

    def at_edges(name, edges):  # a per-edge static (B, E) at edges (B, K)
        return tf.gather_nd(statics[name], tf.stack([tf.broadcast_to(problem[:, None], tf.shape(edges)), edges], -1))

    inputs, outputs = at_edges("senders", in_edges), at_edges("receivers", out_edges)  # (B, K) nodes

    def masked_sum(weights, values):  # (B, K) x (B, K, D) -> (B, D)
        return tf.einsum("bk,bkd->bd", weights, values)

    transpose = [0, 2, 1]
    in_to_device = (rows(latency, inputs)
                    + at_edges("transfer_bytes", in_edges)[..., None] * rows(inverse_bandwidth, inputs))
    out_from_device = (rows(tf.transpose(latency, transpose), outputs)
                       + at_edges("transfer_bytes", out_edges)[..., None]
                       * rows(tf.transpose(inverse_bandwidth, transpose), outputs))
    receive = masked_sum(in_mask, in_to_device)
    send = masked_sum(out_mask, out_from_device)
    sender_end = tf.gather(end, inputs, batch_dims=1)[..., None]
    # Every term is >= 0, so a masked slot (0) is the max of a class without inputs, as before.
    ready = tf.reduce_max(in_mask[..., None] * (sender_end + in_to_device), axis=1) - current_start
    in_bytes = in_mask * at_edges("edge_bytes", in_edges)
    out_bytes = out_mask * at_edges("edge_bytes", out_edges)
    in_share = (masked_sum(in_bytes, tf.gather(on_device, inputs, batch_dims=1))
                / tf.maximum(tf.reduce_sum(in_bytes, -1, keepdims=True), 1e-9))
    out_share = (masked_sum(out_bytes, tf.gather(on_device, outputs, batch_dims=1))
                 / tf.maximum(tf.reduce_sum(out_bytes, -1, keepdims=True), 1e-9))
    class_compute = tf.einsum("bn,bnd->bd", current, compute)
    allowed = obs[ACTION_MASK]
    allowed_f = tf.cast(allowed, tf.float32)
    best = tf.reduce_min(tf.where(allowed, class_compute, 1e9), -1, keepdims=True)
    persistent = static("persistent")
    memory = static("memory")
    on_persistent = tf.einsum("bn,bnd->bd", persistent, on_device)
    class_persistent = tf.reduce_sum(persistent * current, -1, keepdims=True)
    moved_persistent = on_persistent - class_persistent * current_onehot + class_persistent
    # "placed": only visited work that may run at the same time as the class (neither its ancestor
    # nor its descendant), where a parallel branch would wait; the visited work of its ancestors
    # is on the devices its inputs already name.
    beside = node_mask * (1.0 - ancestors) * (1.0 - descendants) * (1.0 - current)  # may run with the class
    counted = obs[VISITED] * (beside if placed else 1.0)
    visited_compute = tf.einsum("bn,bnd->bd", counted * fastest, on_device)
    fair_share = tf.maximum(tf.reduce_sum(fastest * node_mask, -1, keepdims=True) / devices_f, 1e-9)
    per_device = tf.ones_like(allowed_f)
    device_columns = [
        current_onehot,
        tf.clip_by_value(busy, 0.0, CLIP),
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
        per_device * tf.clip_by_value(step_time, 0.0, CLIP)[:, None],
        per_device * tf.math.log(devices_f),  # (B, 1) broadcast
        per_device * tf.cast(tf.reduce_sum(in_bytes, -1, keepdims=True) > 0, tf.float32),
    ]
    if unvisited_work:
        unvisited = (1.0 - obs[VISITED]) * fastest
        parallel = tf.reduce_sum(unvisited * beside, -1, keepdims=True)
        below = tf.reduce_sum(unvisited * node_mask * descendants, -1, keepdims=True)
        device_columns += [per_device * tf.clip_by_value(x / fair_share, 0.0, CLIP) for x in (parallel, below)]
    if transfer_costs:  # the class's outputs sent from d to another device, wherever they go
        out_count = tf.reduce_sum(out_mask, -1, keepdims=True)
        out_transfer = tf.reduce_sum(out_mask * at_edges("transfer_bytes", out_edges), -1, keepdims=True)
        device_columns.append(tf.clip_by_value(
            out_count * static("latency_from") + out_transfer * static("inverse_bandwidth_from"), 0.0, CLIP))
    devices = tf.stack(device_columns, -1) * allowed_f[..., None]
    return Features(nodes=nodes, edges=edges, senders=senders, receivers=receivers,
                    node_mask=node_mask, current=current, ancestors=ancestors,
                    descendants=descendants, placement=placement, seen=seen, devices=devices,
                    action_mask=allowed)
