"""Grouping: an OpGraph of thousands of ops -> an acyclic OpGraph of at most a few hundred groups.

Placers and the policy work on groups (Placeto, like the hierarchical placer before it, places
groups of ops, not single ops). `group` cuts a topological order of the ops into contiguous
intervals. Edges only go forward in a topological order, so any cut into intervals is acyclic
by construction. The order is chosen so intervals are meaningful:
- ties are broken by name scope (Keras layers, gradient scopes), so a layer's ops are adjacent
  and an interval tends to be one layer or a run of small ones;
- an interval never mixes ops with different kernel availability (a CPU-only string op does not
  pull a GPU layer onto the CPU), unless the group budget forces it;
- intervals are balanced by op count.
Colocation survives grouping as ties: the grouped graph's `colocation` ids are the union of its
ops' colocation classes, so groups holding a variable and the ops that update it must share a
device, exactly as their ops must.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from tfplaceto.graph.from_graph_def import _UnionFind
from tfplaceto.graph.op_graph import OpGraph, make_op_graph

DEFAULT_MAX_GROUPS = 256


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


def _scope(name: str) -> str:
    """The layer scope of an op: its name without the last component, gradient prefixes removed."""
    for prefix in ("gradient_tape/", "gradients/", "training/"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.rsplit("/", 1)[0] if "/" in name else name


def scoped_topological_order(op_graph: OpGraph) -> np.ndarray:
    """A topological order that keeps each layer's ops, variables and updates close together.

    Ops that do not depend on any input placeholder ("floating": variables, their reads,
    constants, initializers) are emitted just before their first consumer, depth first, so a
    variable lands next to the layer that reads it rather than at the start of the order. The
    other ops follow Kahn's algorithm preferring (1) the scope of the op emitted last, then (2)
    the op closest to the end of the graph (fewest ops on its longest path to a sink), then the
    one that became ready last: the order follows a layer to its end, and an optimizer update
    comes right after the gradient it consumes instead of after the whole backward pass.
    """
    n = op_graph.num_ops
    scope_ids: dict[str, int] = {}
    scope = np.array([scope_ids.setdefault(_scope(name), len(scope_ids)) for name in op_graph.names])
    senders = np.concatenate([op_graph.senders, op_graph.control_senders]).astype(np.int64)
    receivers = np.concatenate([op_graph.receivers, op_graph.control_receivers]).astype(np.int64)
    successors = _csr(senders, receivers, n)
    predecessors = _csr(receivers, senders, n)
    main = ~floating_ops(op_graph)
    emitted = np.zeros(n, bool)
    result: list[int] = []

    def emit_floating_ancestors(node: int) -> None:
        stack = [(node, False)]
        while stack:
            v, expanded = stack.pop()
            if emitted[v]:
                continue
            if expanded:
                emitted[v] = True
                result.append(v)
                continue
            stack.append((v, True))
            stack.extend((int(p), False) for p in predecessors(v) if not main[p] and not emitted[p])

    height = np.zeros(n, np.int64)  # ops on the longest path to a sink
    for node in op_graph.topo_order[::-1]:
        succ = successors(node)
        height[node] = 1 + (height[succ].max() if len(succ) else 0)
    indegree = np.zeros(n, np.int64)
    np.add.at(indegree, receivers[main[senders]], 1)
    ready_by_scope: dict[int, list[tuple[int, int]]] = {}
    recent: list[tuple[int, int, int]] = []  # (height, -time readied, node)
    clock = 0

    def push(node: int) -> None:
        nonlocal clock
        clock += 1
        heapq.heappush(ready_by_scope.setdefault(int(scope[node]), []), (-clock, node))
        heapq.heappush(recent, (int(height[node]), -clock, node))

    for node in np.flatnonzero(main & (indegree == 0)):
        push(int(node))
    current = -1
    while recent:
        heap = ready_by_scope.get(current)
        while heap and emitted[heap[0][1]]:
            heapq.heappop(heap)
        if heap:
            node = heapq.heappop(heap)[1]
        else:
            while emitted[recent[0][2]]:
                heapq.heappop(recent)
            node = heapq.heappop(recent)[2]
            current = int(scope[node])
        emit_floating_ancestors(node)
        for child in successors(node):
            if main[child]:
                indegree[child] -= 1
                if indegree[child] == 0:
                    push(int(child))
        while recent and emitted[recent[0][2]]:
            heapq.heappop(recent)
    for node in op_graph.topo_order:  # floating sinks: initializers and the like
        emit_floating_ancestors(int(node))
    return np.asarray(result, np.int32)


def floating_ops(op_graph: OpGraph) -> np.ndarray:
    """Ops that depend on no input placeholder: variables, their reads, constants, initializers.

    In a graph without placeholders, the ops without inputs.
    """
    n = op_graph.num_ops
    senders = np.concatenate([op_graph.senders, op_graph.control_senders]).astype(np.int64)
    receivers = np.concatenate([op_graph.receivers, op_graph.control_receivers]).astype(np.int64)
    successors = _csr(senders, receivers, n)
    main = np.zeros(n, bool)
    for node in op_graph.topo_order:
        if op_graph.types[node] == "Placeholder":
            main[node] = True
        if main[node]:
            main[successors(node)] = True
    if not main.any():
        main = np.bincount(receivers, minlength=n) > 0
    return ~main


def _csr(src: np.ndarray, dst: np.ndarray, n: int):
    """neighbours(v) -> array of dst over edges src == v."""
    order = np.argsort(src, kind="stable")
    starts = np.searchsorted(src[order], np.arange(n + 1))
    targets = dst[order]
    return lambda v: targets[starts[v]:starts[v + 1]]


def group(op_graph: OpGraph, max_groups: int = DEFAULT_MAX_GROUPS) -> Grouping:
    """Groups op_graph into at most max_groups acyclic groups (see the module docstring)."""
    if max_groups < 1:
        raise ValueError("max_groups must be >= 1")
    n = op_graph.num_ops
    order = scoped_topological_order(op_graph)
    signature = op_graph.kernels.astype(np.int64) @ (1 << np.arange(op_graph.kernels.shape[1]))
    if n <= max_groups:
        cut_after = np.ones(n, bool)
    else:
        cut_after = _interval_cuts(signature[order], max_groups, _open_classes(op_graph, order))
    op_to_group = np.empty(n, np.int32)
    op_to_group[order] = np.concatenate([[0], np.cumsum(cut_after[:-1])]).astype(np.int32)
    _gather_floating_ops(op_graph, order, op_to_group)
    _, op_to_group = np.unique(op_to_group, return_inverse=True)  # drop emptied groups
    return Grouping(op_graph, _quotient(op_graph, op_to_group.astype(np.int32)), op_to_group.astype(np.int32))


def _gather_floating_ops(op_graph: OpGraph, order: np.ndarray, op_to_group: np.ndarray) -> None:
    """Moves floating ops (variables and their reads) next to the first op of their colocation class.

    A variable read by many groups (Adam's step counter, a shared embedding) would otherwise leave
    a colocated read inside every consumer's group and tie all of them to one device. Each
    floating op moves to the group of its class's first op, but never before a group holding one
    of its inputs: group indices stay a topological labelling, so the grouping stays acyclic.
    """
    floating = floating_ops(op_graph)
    anchor: dict[int, int] = {}
    for node in order:
        cls = int(op_graph.colocation[node])
        anchor.setdefault(cls, int(op_to_group[node]))
    senders = np.concatenate([op_graph.senders, op_graph.control_senders]).astype(np.int64)
    receivers = np.concatenate([op_graph.receivers, op_graph.control_receivers]).astype(np.int64)
    predecessors = _csr(receivers, senders, op_graph.num_ops)
    for node in order:
        if not floating[node]:
            continue
        preds = predecessors(node)
        earliest = max(anchor[int(op_graph.colocation[node])], int(op_to_group[preds].max()) if len(preds) else 0)
        op_to_group[node] = min(op_to_group[node], earliest)


def _open_classes(op_graph: OpGraph, order: np.ndarray) -> np.ndarray:
    """open[k]: colocation classes with computing (non-floating) members on both sides of a cut
    after position k. Cutting where few are open keeps a variable's update ops in one group, so
    ties between groups do not chain across the whole graph."""
    n = op_graph.num_ops
    position = np.empty(n, np.int64)
    position[order] = np.arange(n)
    main = ~floating_ops(op_graph)
    classes = op_graph.colocation[main]
    first = np.full(classes.max() + 1 if len(classes) else 1, n)
    last = np.full_like(first, -1)
    np.minimum.at(first, classes, position[main])
    np.maximum.at(last, classes, position[main])
    spans = last > first
    delta = np.zeros(n + 1, np.int64)
    np.add.at(delta, first[spans], 1)
    np.add.at(delta, last[spans], -1)
    return np.cumsum(delta)[:n]


def _interval_cuts(signature: np.ndarray, max_groups: int, open_classes: np.ndarray) -> np.ndarray:
    """cut_after[k]: the interval ends after position k; at most max_groups intervals.

    Each cut goes to the position with the fewest open colocation classes within a quarter
    interval of its balanced position."""
    n = len(signature)
    changes = np.flatnonzero(signature[1:] != signature[:-1])  # cut after these positions
    mandatory = changes if len(changes) + 1 <= max_groups // 2 else np.array([], np.int64)
    budget = max_groups - len(mandatory)
    target = n / max(budget, 1)
    cut_after = np.zeros(n, bool)
    cut_after[mandatory] = True
    cut_after[-1] = True
    run_start = 0
    for end in list(mandatory) + [n - 1]:
        length = end - run_start + 1
        pieces = max(1, int(round(length / target)))
        bounds = np.linspace(run_start, end + 1, pieces + 1).round().astype(int)[1:-1]
        window = max(int(target // 4), 0)
        for bound in bounds:
            low, high = max(run_start, bound - 1 - window), min(end - 1, bound - 1 + window)
            if high < low:
                continue
            candidates = np.arange(low, high + 1)
            cost = open_classes[candidates] * (2 * window + 1) + np.abs(candidates - (bound - 1))
            cut_after[candidates[np.argmin(cost)]] = True
        run_start = end + 1
    # Rounding can overshoot the budget by a little: merge the smallest neighbours.
    cuts = np.flatnonzero(cut_after)
    while len(cuts) > max_groups:
        sizes = np.diff(np.concatenate([[-1], cuts]))
        pair = int(np.argmin(sizes[:-1] + sizes[1:]))
        cut_after[cuts[pair]] = False
        cuts = np.flatnonzero(cut_after)
    return cut_after


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

    ties = _UnionFind(g)
    first_group_of_class: dict[int, int] = {}
    for op, cls in enumerate(op_graph.colocation):
        grp = int(op_to_group[op])
        ties.union(first_group_of_class.setdefault(int(cls), grp), grp)
    _, colocation = np.unique([ties.find(i) for i in range(g)], return_inverse=True)

    names = _group_names(op_graph, op_to_group, g)
    return make_op_graph(names, ["Group"] * g, tensor_producer, tensor_bytes, edge_tensor, edge_consumer,
                         control[:, 0], control[:, 1], (leaving + scratch).astype(np.int64),
                         persistent.astype(np.int64), colocation, kernels)


def _group_names(op_graph: OpGraph, op_to_group: np.ndarray, g: int) -> list[str]:
    """"g17:conv2d_3" style names: index and the most common scope of the group's ops."""
    counts: list[dict[str, int]] = [{} for _ in range(g)]
    for name, grp in zip(op_graph.names, op_to_group):
        scope = _scope(name)
        counts[grp][scope] = counts[grp].get(scope, 0) + 1
    return [f"g{i}:{max(c, key=c.get)}" for i, c in enumerate(counts)]
