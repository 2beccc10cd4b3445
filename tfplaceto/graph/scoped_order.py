"""The order grouping cuts: a topological order of an OpGraph that keeps each layer together.

`grouping.group` cuts this order into contiguous intervals, so what is adjacent here ends up in
one group: a layer's ops, its variables and their updates, a colocation class.

Map of the file:
  scoped_topological_order   Kahn's algorithm preferring open colocation classes, then the
                             scope of the last op emitted, then the op nearest the end; ops
                             that depend on no input ("floating") go just before their first
                             consumer.
  floating_ops               ops that depend on no input placeholder (variables, constants ...).
  layer_scope                an op's layer scope: its name's scope, gradient prefixes removed.
  neighbours                 successors (or predecessors) of a node over an edge list, by CSR.
"""

from __future__ import annotations

import heapq

import numpy as np

from tfplaceto.graph.op_graph import OpGraph, csr


def layer_scope(name: str) -> str:
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
    other ops follow Kahn's algorithm preferring, among the ready ops:
    1. members of a colocation class that is open (some members emitted, not all): a variable's
       update follows its gradient at once, and an optimizer slot's reads follow its assignment,
       so colocated ops stay close and few classes straddle a cut;
    2. the scope of the op emitted last: a layer is followed to its end;
    3. the op closest to the end of the graph (shortest longest path to a sink), then the one
       that became ready last.
    """
    n = op_graph.num_ops
    scope_ids: dict[str, int] = {}
    scope = np.array([scope_ids.setdefault(layer_scope(name), len(scope_ids)) for name in op_graph.names])
    senders = np.concatenate([op_graph.senders, op_graph.control_senders]).astype(np.int64)
    receivers = np.concatenate([op_graph.receivers, op_graph.control_receivers]).astype(np.int64)
    successors = neighbours(senders, receivers, n)
    predecessors = neighbours(receivers, senders, n)
    main = ~floating_ops(op_graph)
    classes = op_graph.colocation
    class_size = np.bincount(classes)
    class_emitted = np.zeros_like(class_size)
    waiting_in_class: dict[int, list[int]] = {}  # ready ops of classes not open yet
    emitted = np.zeros(n, bool)
    result: list[int] = []
    height = np.zeros(n, np.int64)  # ops on the longest path to a sink
    for node in op_graph.topo_order[::-1]:
        succ = successors(node)
        height[node] = 1 + (height[succ].max() if len(succ) else 0)
    ready_open: list[tuple[int, int, int]] = []  # (height, -time readied, node)
    ready_by_scope: dict[int, list[tuple[int, int]]] = {}
    ready_any: list[tuple[int, int, int]] = []
    clock = 0

    def is_open(cls: int) -> bool:
        return 0 < class_emitted[cls] < class_size[cls]

    def emit(v: int) -> None:
        emitted[v] = True
        result.append(v)
        cls = int(classes[v])
        class_emitted[cls] += 1
        if is_open(cls):
            for waiting in waiting_in_class.pop(cls, ()):
                heapq.heappush(ready_open, (int(height[waiting]), -clock, waiting))

    def emit_floating_ancestors(node: int) -> None:
        stack = [(node, False)]
        while stack:
            v, expanded = stack.pop()
            if emitted[v]:
                continue
            if expanded:
                emit(v)
                continue
            stack.append((v, True))
            stack.extend((int(p), False) for p in predecessors(v) if not main[p] and not emitted[p])

    # A loop's NextIteration ops are sinks once back edges are dropped, and colocated with the
    # loop's control; emitted as each becomes ready they would tie every group of the body to
    # the control's device. They wait until the whole set of their class is ready, then go
    # out together: a frame's control ends up in its head group and one tail group.
    is_next = np.array([t in ("NextIteration", "RefNextIteration") for t in op_graph.types], bool)
    next_count = np.bincount(classes[is_next], minlength=len(class_size))
    held: dict[int, list[int]] = {}

    def push(node: int) -> None:
        if is_next[node]:
            cls = int(classes[node])
            held.setdefault(cls, []).append(node)
            if len(held[cls]) < next_count[cls]:
                return
            for waiting in held.pop(cls)[:-1]:
                enqueue(waiting)
        enqueue(node)

    def enqueue(node: int) -> None:
        nonlocal clock
        clock += 1
        entry = (int(height[node]), -clock, node)
        cls = int(classes[node])
        if is_open(cls):
            heapq.heappush(ready_open, entry)
        elif class_size[cls] > 1:
            waiting_in_class.setdefault(cls, []).append(node)
        heapq.heappush(ready_by_scope.setdefault(int(scope[node]), []), (-clock, node))
        heapq.heappush(ready_any, entry)

    def pop_live(heap: list, index: int) -> int | None:
        while heap and emitted[heap[0][index]]:
            heapq.heappop(heap)
        return heapq.heappop(heap)[index] if heap else None

    indegree = np.zeros(n, np.int64)
    np.add.at(indegree, receivers[main[senders]], 1)
    for node in np.flatnonzero(main & (indegree == 0)):
        push(int(node))
    current = -1
    while True:
        node = pop_live(ready_open, 2)
        if node is None:
            node = pop_live(ready_by_scope.get(current, []), 1)
        if node is None:
            node = pop_live(ready_any, 2)
            if node is None:
                break
        current = int(scope[node])
        emit_floating_ancestors(node)
        for child in successors(node):
            if main[child]:
                indegree[child] -= 1
                if indegree[child] == 0:
                    push(int(child))
    for node in (v for waiting in held.values() for v in waiting):  # not reached by design
        emit(node)
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
    successors = neighbours(senders, receivers, n)
    main = np.zeros(n, bool)
    for node in op_graph.topo_order:
        if op_graph.types[node] == "Placeholder":
            main[node] = True
        if main[node]:
            main[successors(node)] = True
    if not main.any():
        main = np.bincount(receivers, minlength=n) > 0
    return ~main


def neighbours(src: np.ndarray, dst: np.ndarray, n: int):
    """A function v -> the array of dst over the edges with src == v (n nodes)."""
    ptr, targets = csr(src, n, dst, dst.dtype)
    return lambda v: targets[ptr[v]:ptr[v + 1]]
