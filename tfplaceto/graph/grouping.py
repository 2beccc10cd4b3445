"""Grouping: an OpGraph of thousands of ops -> an acyclic OpGraph of at most a few hundred groups.

Placers and the policy work on groups (Placeto, like the hierarchical placer before it, places
groups of ops, not single ops). `group` cuts a topological order of the ops into contiguous
intervals. Edges only go forward in a topological order, so any cut into intervals is acyclic
by construction. The order (`scoped_order.py`) is chosen so intervals are meaningful:
- ties are broken by name scope (Keras layers, gradient scopes), so a layer's ops are adjacent
  and an interval tends to be one layer or a run of small ones;
- an interval never mixes ops with different kernel availability (a CPU-only string op does not
  pull a GPU layer onto the CPU), unless the group budget forces it;
- intervals are balanced by op count.
Colocation survives grouping as ties: the grouped graph's `colocation` ids are the union of its
ops' colocation classes, so groups holding a variable and the ops that update it must share a
device, exactly as their ops must.
Op pairs that must stay together are tied the same way (`kept_together`): a forward op and the
gradient op that re-reads what it read and wrote (`KEEP_TOGETHER`: MaxPool and MaxPoolGrad, whose
oneDNN kernels may share a workspace and whose gradient reads both the pooling's input and output:
split, both tensors cross devices every step). The groups holding the two ops share a device.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tfplaceto import checks, errors
from tfplaceto.graph.op_graph import OpGraph, joined_classes, make_op_graph, topological_order
from tfplaceto.graph.scoped_order import (
    floating_ops,
    layer_scope,
    neighbours,
    scoped_topological_order,
)

DEFAULT_MAX_GROUPS = 256
# gradient op type -> the forward op types it must stay with, when one of its inputs is theirs.
KEEP_TOGETHER = {
    "MaxPoolGrad": ("MaxPool",),
    "MaxPoolGradV2": ("MaxPoolV2", "MaxPool"),
    "MaxPool3DGrad": ("MaxPool3D",),
    "MaxPoolGradWithArgmax": ("MaxPoolWithArgmax",),
}


@dataclasses.dataclass(frozen=True, eq=False)
class Grouping:
    """`graph` has one node per group; `op_to_group[i]` is the group of op i of `op_graph`."""

    op_graph: OpGraph
    graph: OpGraph
    op_to_group: np.ndarray

    @property
    def num_groups(self) -> int:
        return self.graph.num_ops

    def expand(self, group_device_of: np.ndarray) -> np.ndarray:
        """Device index of every op from the device index of every group."""
        return np.asarray(group_device_of)[self.op_to_group]

    def members(self, group: int) -> np.ndarray:
        return np.flatnonzero(self.op_to_group == group)


def group(op_graph: OpGraph, max_groups: int = DEFAULT_MAX_GROUPS, weights: np.ndarray | None = None) -> Grouping:
    """Groups op_graph into at most max_groups acyclic groups (see the module docstring).

    Args:
      op_graph: the ops to group.
      max_groups: the most groups the result may have.
      weights: per-op work that intervals balance, e.g. compute seconds on the fastest device
        (what `make_problem` passes); default: output bytes, a proxy for elementwise work.
    """
    checks.check_int("max_groups", max_groups, 1)
    n = op_graph.num_ops
    order = scoped_topological_order(op_graph)
    if n <= max_groups:
        return Grouping(op_graph, _quotient(op_graph, np.arange(n, dtype=np.int32)), np.arange(n, dtype=np.int32))
    weights = op_graph.output_bytes.astype(np.float64) if weights is None else np.asarray(weights, np.float64)
    # Every op costs a little, so long runs of free ops still get cut somewhere.
    weights = weights + max(weights.mean(), 1e-30) * 0.02
    signature = op_graph.kernels.astype(np.int64) @ (1 << np.arange(op_graph.kernels.shape[1]))
    floating = floating_ops(op_graph)
    intervals = max_groups
    while True:
        open_classes = _open_classes(op_graph, order, max_span=2 * n // intervals + 1)
        cut_after = _interval_cuts(signature[order], weights[order], intervals, open_classes)
        op_to_group = np.empty(n, np.int64)
        op_to_group[order] = np.concatenate([[0], np.cumsum(cut_after[:-1])])
        _gather_floating_ops(op_graph, order, op_to_group, floating)
        op_to_group = _split_by_anchor(op_graph, order, op_to_group, floating, open_classes)
        if op_to_group.max() < max_groups or intervals == 1:
            break
        intervals = max(1, int(intervals * min(0.9, max_groups / (op_to_group.max() + 1))))
    if op_to_group.max() >= max_groups:  # even one interval splits too much: give up the splits
        op_to_group = np.zeros(n, np.int64)
    _, op_to_group = np.unique(op_to_group, return_inverse=True)  # drop emptied groups
    op_to_group = op_to_group.astype(np.int32)
    return Grouping(op_graph, _quotient(op_graph, op_to_group), op_to_group)


def _split_by_anchor(op_graph: OpGraph, order: np.ndarray, op_to_group: np.ndarray,
                     floating: np.ndarray, open_classes: np.ndarray) -> np.ndarray:
    """Splits groups so each one updates the variables of at most one other group.

    Optimizers update every variable after the last gradient, in variable order. An interval of
    those updates that holds variables read by two layers' groups would tie the two layers to one
    device, and a run of such intervals would tie the whole graph. Within each group, between the
    last op updating a class anchored in one group (the group that reads the variable) and the
    first op updating a class anchored in another, a cut goes where the fewest colocation classes
    are open (an optimizer slot's assignment and its reads stay together).
    Recurrent layers need the same in the forward pass: an unrolled LSTM reads its weights at
    every step, each read colocated with the variable, so a group holding one layer's last steps
    and the next layer's first would tie the two layers, and a run of such groups every layer
    of the network (NMT-4l: 38% of its compute in one tie class). Groups are also cut where the
    variables their ops read change for good (a layer's weights read alternately stay together).
    Pieces of an interval keep their order, so the grouping stays acyclic.
    """
    anchor: dict[int, int] = {}
    for node in order:
        if floating[node]:
            anchor.setdefault(int(op_graph.colocation[node]), int(op_to_group[node]))
    position = np.empty(op_graph.num_ops, np.int64)
    position[order] = np.arange(op_graph.num_ops)
    labels = np.empty(op_graph.num_ops, np.int64)
    next_label = 0
    computing = order[~floating[order]]
    groups = op_to_group[computing]
    starts = np.flatnonzero(np.concatenate([[True], groups[1:] != groups[:-1]]))
    senders = np.concatenate([op_graph.senders, op_graph.control_senders]).astype(np.int64)
    receivers = np.concatenate([op_graph.receivers, op_graph.control_receivers]).astype(np.int64)
    read_anchor = _read_anchor(op_graph, senders, receivers, op_to_group, floating, anchor)
    first_piece: dict[int, int] = {}
    for start, end in zip(starts, np.append(starts[1:], len(computing))):
        nodes = computing[start:end]
        g = int(op_to_group[nodes[0]])
        between = open_classes[position[nodes]]
        updated = [anchor.get(int(op_graph.colocation[v]), g) for v in nodes]
        cuts = _cuts(np.where(np.equal(updated, g), -1, updated), between, apart=False)
        cuts |= _cuts(read_anchor[nodes], between, apart=True)
        cuts = sorted(cuts)
        piece = np.zeros(len(nodes), np.int64)
        for c in cuts:
            piece[c + 1:] += 1
        labels[nodes] = next_label + piece
        first_piece[g] = next_label
        next_label += len(cuts) + 1
    # A floating op joins the earliest piece of its group that consumes it (consumers first,
    # so chains of floating ops follow), else its group's first piece.
    successors = neighbours(senders, receivers, op_graph.num_ops)
    for node in order[floating[order]][::-1]:
        g = int(op_to_group[node])
        local = [int(labels[c]) for c in successors(node) if op_to_group[c] == g]
        if local:
            labels[node] = min(local)
            continue
        if g not in first_piece:
            first_piece[g] = next_label
            next_label += 1
        labels[node] = first_piece[g]
    # A variable read by many pieces (a learning rate) keeps its reads in one piece, the earliest,
    # else its colocation class would tie all those pieces (and their layers) to one device.
    together = labels.copy()
    earliest: dict[tuple[int, int], int] = {}
    for node in order[floating[order]]:
        key = (int(op_graph.colocation[node]), int(op_to_group[node]))
        earliest[key] = min(earliest.get(key, together[node]), together[node])
    for node in order[floating[order]]:
        together[node] = earliest[(int(op_graph.colocation[node]), int(op_to_group[node]))]
    predecessors = neighbours(receivers, senders, op_graph.num_ops)
    for node in order[floating[order]]:  # inputs never after their consumer
        preds = predecessors(node)
        if len(preds):
            together[node] = max(together[node], together[preds].max())
    return together if _labels_acyclic(op_graph, together) else labels


def _cuts(keys: np.ndarray, open_classes: np.ndarray, apart: bool) -> set[int]:
    """Where a run of nodes is cut so that pieces hold different keys (-1: no key, goes anywhere).

    apart=False cuts wherever the key changes; apart=True only where every key before the cut
    has no node after it (keys that alternate, like a layer's two weights read at every step,
    stay in one piece). Each cut goes after the node, between the last keyed node before and the
    first after, where the fewest colocation classes are open.
    """
    last_of = {int(k): i for i, k in enumerate(keys) if k >= 0}
    cuts, piece_end, last = set(), -1, -1
    for i, k in enumerate(keys):
        if k < 0:
            continue
        if last >= 0 and (i > piece_end if apart else k != keys[last]):
            cuts.add(last + int(np.argmin(open_classes[last:i])))
        piece_end, last = max(piece_end, last_of[int(k)]), i
    return cuts


def _read_anchor(op_graph: OpGraph, senders: np.ndarray, receivers: np.ndarray, op_to_group: np.ndarray,
                 floating: np.ndarray, anchor: dict[int, int]) -> np.ndarray:
    """read_anchor[v]: the anchor of a variable that op v reads through a floating op of its own
    group (a ReadVariableOp, colocated with the variable), the lowest when several; else -1."""
    class_anchor = np.full(int(op_graph.colocation.max()) + 1, -1, np.int64)
    class_anchor[list(anchor)] = list(anchor.values())
    read_class = op_graph.colocation[senders]
    tied = np.bincount(op_graph.colocation)[read_class] > 1
    reads = (floating[senders] & ~floating[receivers] & tied & (class_anchor[read_class] >= 0)
             & (op_to_group[senders] == op_to_group[receivers]))
    none = np.iinfo(np.int64).max
    result = np.full(op_graph.num_ops, none)
    np.minimum.at(result, receivers[reads], class_anchor[read_class[reads]])
    result[result == none] = -1
    return result


def _labels_acyclic(op_graph: OpGraph, labels: np.ndarray) -> bool:
    edges = np.stack([labels[op_graph.senders], labels[op_graph.receivers]], 1)
    control = np.stack([labels[op_graph.control_senders], labels[op_graph.control_receivers]], 1)
    edges = np.concatenate([edges, control])
    edges = edges[edges[:, 0] != edges[:, 1]]
    try:
        topological_order(int(labels.max()) + 1, edges[:, 0], edges[:, 1])
    except errors.InvalidGraphError:
        return False
    return True


def _gather_floating_ops(op_graph: OpGraph, order: np.ndarray, op_to_group: np.ndarray,
                         floating: np.ndarray) -> None:
    """Moves floating ops (variables and their reads) into the group of their colocation class.

    A class's home is the group of its first computing member (the op that updates the variable,
    e.g. an optimizer slot's assignment), or of its first member when it has none (a variable
    only read). A variable read by many groups (a learning rate, a shared embedding) would
    otherwise leave a colocated read inside every consumer's group and tie all of them to one
    device. Each floating op moves as close to its home as its inputs and consumers allow:
    never before a group holding an input nor after a group holding a consumer, so group indices
    stay a topological labelling and the grouping stays acyclic.
    """
    home: dict[int, int] = {}
    for node in order:
        if not floating[node]:
            home.setdefault(int(op_graph.colocation[node]), int(op_to_group[node]))
    for node in order:
        home.setdefault(int(op_graph.colocation[node]), int(op_to_group[node]))
    senders = np.concatenate([op_graph.senders, op_graph.control_senders]).astype(np.int64)
    receivers = np.concatenate([op_graph.receivers, op_graph.control_receivers]).astype(np.int64)
    predecessors = neighbours(receivers, senders, op_graph.num_ops)
    successors = neighbours(senders, receivers, op_graph.num_ops)
    # A floating op alone in its class (a constant) has no home of its own: it follows the
    # earliest home of the floating ops it feeds, so it does not hold them back (the optimizer's
    # step counter increment, fed a constant emitted at the very end, would stay in the last
    # group and tie it to every group reading the counter).
    class_size = np.bincount(op_graph.colocation)
    for node in order[::-1]:
        cls = int(op_graph.colocation[node])
        succs = successors(node)
        if floating[node] and class_size[cls] == 1 and len(succs) and floating[succs].all():
            home[cls] = min(home[int(op_graph.colocation[s])] for s in succs)
    for node in order:
        if not floating[node]:
            continue
        preds, succs = predecessors(node), successors(node)
        lowest = int(op_to_group[preds].max()) if len(preds) else 0
        highest = int(op_to_group[succs].min()) if len(succs) else int(op_to_group[node])
        op_to_group[node] = min(max(home[int(op_graph.colocation[node])], lowest), highest)


def _open_classes(op_graph: OpGraph, order: np.ndarray, max_span: int) -> np.ndarray:
    """open[k]: local colocation classes with members on both sides of a cut after position k.

    Cutting where few are open keeps an optimizer slot's read, assignment and later reads in one
    group, so ties between groups do not chain across the graph. Only classes spanning at most
    max_span positions count: a variable read in the forward pass and updated at the end spans
    almost everything, cannot be kept in one interval, and is handled by `_split_by_anchor`.
    """
    n = op_graph.num_ops
    position = np.empty(n, np.int64)
    position[order] = np.arange(n)
    classes = op_graph.colocation
    first = np.full(classes.max() + 1, n)
    last = np.full_like(first, -1)
    np.minimum.at(first, classes, position)
    np.maximum.at(last, classes, position)
    spans = (last > first) & (last - first <= max_span)
    delta = np.zeros(n + 1, np.int64)
    np.add.at(delta, first[spans], 1)
    np.add.at(delta, last[spans], -1)
    return np.cumsum(delta)[:n]


def _interval_cuts(signature: np.ndarray, weights: np.ndarray, max_groups: int,
                   open_classes: np.ndarray) -> np.ndarray:
    """cut_after[k]: an interval ends after position k of the order; at most max_groups of them.

    Cuts fall where the cumulative weight crosses multiples of total / budget, each moved to the
    position with the fewest open colocation classes within a quarter interval; runs of ops with
    different kernel availability are cut apart when that costs at most half the budget.
    """
    n = len(signature)
    changes = np.flatnonzero(signature[1:] != signature[:-1])
    mandatory = changes if len(changes) + 1 <= max_groups // 2 else np.array([], np.int64)
    budget = max_groups - len(mandatory)
    cut_after = np.zeros(n, bool)
    cut_after[mandatory] = True
    cut_after[-1] = True
    cumulative = np.cumsum(weights)
    bounds = np.unique(np.searchsorted(cumulative, cumulative[-1] * np.arange(1, budget) / budget))
    window = max(1, n // max(budget, 1) // 4)
    for bound in bounds[bounds < n - 1]:
        candidates = np.arange(max(0, bound - window), min(n - 1, bound + window + 1))
        cost = open_classes[candidates] * (2 * window + 1) + np.abs(candidates - bound)
        cut_after[candidates[np.argmin(cost)]] = True
    cuts = np.flatnonzero(cut_after)
    while len(cuts) > max_groups:  # mandatory and balanced cuts together overshoot: merge lightest
        sizes = cumulative[cuts] - np.concatenate([[0.0], cumulative[cuts[:-1]]])
        pair = int(np.argmin(sizes[:-1] + sizes[1:]))
        cut_after[cuts[pair]] = False
        cuts = np.flatnonzero(cut_after)
    return cut_after


def kept_together(op_graph: OpGraph) -> np.ndarray:
    """(P, 2) op index pairs (forward, gradient) of KEEP_TOGETHER joined by a data edge."""
    types = np.asarray(op_graph.types)
    producers = op_graph.tensor_producer[op_graph.edge_tensor]
    consumers = op_graph.edge_consumer
    pairs = set()
    for k in np.flatnonzero(np.isin(types[consumers], list(KEEP_TOGETHER))):
        forward, gradient = int(producers[k]), int(consumers[k])
        if types[forward] in KEEP_TOGETHER[types[gradient]]:
            pairs.add((forward, gradient))
    return np.array(sorted(pairs), np.int64).reshape(-1, 2)


def _quotient(op_graph: OpGraph, op_to_group: np.ndarray) -> OpGraph:
    """The OpGraph whose nodes are the groups of op_to_group."""
    g = int(op_to_group.max()) + 1
    producer_group = op_to_group[op_graph.tensor_producer]
    edge_src = producer_group[op_graph.edge_tensor]
    edge_dst = op_to_group[op_graph.edge_consumer]
    crossing = edge_src != edge_dst
    pairs = np.unique(np.stack([op_graph.edge_tensor[crossing], edge_dst[crossing]], 1), axis=0)
    used_tensors, edge_tensor = np.unique(pairs[:, 0], return_inverse=True) if len(pairs) else (
        np.array([], np.int64), np.array([], np.int64))
    tensor_producer = producer_group[used_tensors]
    tensor_bytes = op_graph.tensor_bytes[used_tensors]
    edge_consumer = pairs[:, 1] if len(pairs) else np.array([], np.int64)

    c_src = op_to_group[op_graph.control_senders]
    c_dst = op_to_group[op_graph.control_receivers]
    keep = c_src != c_dst
    control = np.unique(np.stack([c_src[keep], c_dst[keep]], 1), axis=0) if keep.any() else np.zeros((0, 2), int)

    # Transient memory: tensors leaving the group, plus the largest output made inside it.
    leaving = np.bincount(tensor_producer, weights=tensor_bytes, minlength=g)
    scratch = np.zeros(g)
    np.maximum.at(scratch, op_to_group, op_graph.output_bytes)
    persistent = np.bincount(op_to_group, weights=op_graph.persistent_bytes, minlength=g)
    kernels = np.ones((g, op_graph.kernels.shape[1]), bool)
    np.logical_and.at(kernels, op_to_group, op_graph.kernels)

    # Groups sharing a colocation class are tied: join each group to its ops' classes (items
    # g + class) and keep the groups' labels (every class item is joined to some group).
    # Pairs that must stay together tie their groups likewise.
    together = op_to_group[kept_together(op_graph)].reshape(-1, 2)
    colocation = joined_classes(g + int(op_graph.colocation.max()) + 1,
                                np.concatenate([np.stack([op_to_group, g + op_graph.colocation], 1),
                                                together]))[:g]

    # A group runs as often as its most repeated op (its costs already count every iteration);
    # a tensor crossing groups keeps its per-step crossings.
    iterations = np.ones(g, np.int64)
    np.maximum.at(iterations, op_to_group, op_graph.iterations)
    lowest, highest = np.full(g, np.iinfo(np.int32).max), np.full(g, -1)
    np.minimum.at(lowest, op_to_group, op_graph.frame)
    np.maximum.at(highest, op_to_group, op_graph.frame)
    frame = np.where(lowest == highest, highest, -1)  # a group within one frame keeps it

    names = _group_names(op_graph, op_to_group, g)
    return make_op_graph(names, ["Group"] * g, tensor_producer, tensor_bytes, edge_tensor, edge_consumer,
                         control[:, 0], control[:, 1], (leaving + scratch).astype(np.int64),
                         persistent.astype(np.int64), colocation, kernels, iterations=iterations,
                         tensor_iterations=op_graph.tensor_iterations[used_tensors],
                         loops=op_graph.loops, frame=frame)


def _group_names(op_graph: OpGraph, op_to_group: np.ndarray, g: int) -> list[str]:
    """"g17:conv2d_3" style names: index and the most common scope of the group's ops."""
    counts: list[dict[str, int]] = [{} for _ in range(g)]
    for name, grp in zip(op_graph.names, op_to_group):
        scope = layer_scope(name)
        counts[grp][scope] = counts[grp].get(scope, 0) + 1
    return [f"g{i}:{max(c, key=c.get)}" for i, c in enumerate(counts)]
