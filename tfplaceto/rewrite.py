"""Write-back: set `NodeDef.device` on every node of a GraphDef from a placement.

`apply_placement(graph_def, placement)` returns a new GraphDef (the input is never modified)
where every node, including the nodes inside the function library, carries a device:
- a node named in the placement gets its device;
- a function call node whose body was inlined for placement (`call/inner` names, as grappler's
  inliner makes them) gets the device most of its body went to, and each node of the called
  function gets the device its inlined copy got at the first call site;
- any other node follows its colocation class, else its first placed input, else its first
  placed consumer, else the placement's most used device;
- finally colocation is enforced: every member of a `loc:@x` class and every op reading or
  updating a resource goes where the class's anchor (the variable) went, as TF's placer requires.

`DeviceResolver` is the name -> device lookup behind it, shared with the Keras callback and the
SavedModel rewrite (whose op names differ from the placed ones): a placed name's device; the
device most placed ops under a name scope got (`scope_device`, `enclosing_scope_device`); the
placement's most used device (`default`).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

from tfplaceto import errors
from tfplaceto.cluster import canonical_device_name
from tfplaceto.graph.node_defs import CALL_OPS, called_function, parse_input
from tfplaceto.graph.op_graph import joined_classes
from tfplaceto.placement import Placement, as_placement


class DeviceResolver:
    """Devices for op names from a placement (canonical device names; see the module docstring).

    `device_of`: placed name -> device. `default`: the most used device (ties: the first placed).
    """

    def __init__(self, placement: Mapping[str, str]):
        self.device_of = {op: canonical_device_name(device) for op, device in placement.items()}
        self.default = collections.Counter(self.device_of.values()).most_common(1)[0][0]
        under: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for op, device in self.device_of.items():
            parts = op.split("/")
            for i in range(1, len(parts)):
                under["/".join(parts[:i])][device] += 1
        self._scope_device = {scope: counts.most_common(1)[0][0] for scope, counts in under.items()}

    def scope_device(self, scope: str | None) -> str | None:
        """The device most placed ops named `scope/...` got (ties: the first placed), or None."""
        return None if scope is None else self._scope_device.get(scope)

    def enclosing_scope_device(self, name: str) -> str:
        """The device of the innermost name scope around `name` that has placed ops, else `default`."""
        parts = name.split("/")
        for i in range(len(parts) - 1, 0, -1):
            device = self._scope_device.get("/".join(parts[:i]))
            if device is not None:
                return device
        return self.default


def apply_placement(graph_def, placement: Placement | Mapping[str, str]):
    """A copy of graph_def with NodeDef.device set on every node (see the module docstring)."""
    import tensorflow as tf

    if not isinstance(graph_def, tf.compat.v1.GraphDef):
        raise errors.InvalidGraphError(f"apply_placement expects a GraphDef, got {type(graph_def).__name__}")
    placement = as_placement(placement)
    if not len(placement):
        raise errors.InvalidGraphError("the placement is empty")
    for device in set(placement.values()):
        _check_device_name(device)
    resolver = DeviceResolver(placement)
    device_of, default = resolver.device_of, resolver.default
    result = tf.compat.v1.GraphDef()
    result.CopyFrom(graph_def)
    nodes = {n.name: n for n in result.node}
    functions = {f.signature.name: f for f in result.library.function}

    chosen: dict[str, str] = {}
    for node in result.node:
        if node.name in device_of:
            chosen[node.name] = device_of[node.name]
            continue
        inner = resolver.scope_device(node.name)
        if inner is not None and called_function(node, functions):
            chosen[node.name] = inner
    _fill_unplaced(result, nodes, chosen, default)
    _enforce_colocation(result, nodes, chosen)
    for node in result.node:
        node.device = chosen[node.name]
    _place_function_library(result, functions, device_of, chosen, default)
    return result


def _check_device_name(device) -> None:
    """InvalidClusterError unless device is a TensorFlow device name with a device type."""
    import tensorflow as tf

    try:
        valid = isinstance(device, str) and tf.DeviceSpec.from_string(device).device_type is not None
    except (ValueError, TypeError):
        valid = False
    if not valid:
        raise errors.InvalidClusterError(
            f"the placement names the device {device!r}, which is not a TensorFlow device name such "
            "as '/job:localhost/replica:0/task:0/device:GPU:0'")


def _fill_unplaced(graph_def, nodes, chosen, default) -> None:
    consumers = collections.defaultdict(list)
    for node in graph_def.node:
        for inp in node.input:
            consumers[parse_input(inp)[0]].append(node.name)
    for _ in range(2):  # a second sweep sees devices chosen for later nodes
        for node in graph_def.node:
            if node.name in chosen:
                continue
            for source in _colocation_targets(node) + [parse_input(i)[0] for i in node.input] + consumers[node.name]:
                if source in chosen:
                    chosen[node.name] = chosen[source]
                    break
    for node in graph_def.node:
        chosen.setdefault(node.name, default)


def _colocation_targets(node) -> list[str]:
    if "_class" not in node.attr:
        return []
    return [v.decode()[5:] for v in node.attr["_class"].list.s if v.decode().startswith("loc:@")]


def _enforce_colocation(graph_def, nodes, chosen) -> None:
    """Every colocation class goes to the device of its first variable (or first member)."""
    names = [n.name for n in graph_def.node]
    index = {n: i for i, n in enumerate(names)}
    joined = []
    for i, node in enumerate(graph_def.node):
        for target in _colocation_targets(node):
            if target in index:
                joined.append((i, index[target]))
    # Resource edges: a VarHandleOp's readers and updaters live with it.
    for i, node in enumerate(graph_def.node):
        for inp in node.input:
            src, _, control = parse_input(inp)
            if control or src not in nodes:
                continue
            if nodes[src].op in ("VarHandleOp", "VariableV2") and node.op not in CALL_OPS | {"While", "If"}:
                joined.append((i, index[src]))
    classes = joined_classes(len(names), joined)
    anchor: dict[int, str] = {}
    for i, node in enumerate(graph_def.node):
        if node.op in ("VarHandleOp", "VariableV2"):
            anchor.setdefault(classes[i], chosen[node.name])
    for i, node in enumerate(graph_def.node):
        anchor.setdefault(classes[i], chosen[node.name])
    for i, node in enumerate(graph_def.node):
        chosen[node.name] = anchor[classes[i]]


def _place_function_library(graph_def, functions, device_of, chosen, default) -> None:
    call_sites = collections.defaultdict(list)
    for node in graph_def.node:
        function = called_function(node, functions)
        if function is not None:
            call_sites[function.signature.name].append(node.name)
    for name, function in functions.items():
        callers = call_sites.get(name, [])
        fallback = chosen[callers[0]] if callers else default
        for node in function.node_def:
            device = next((device_of[f"{c}/{node.name}"] for c in callers if f"{c}/{node.name}" in device_of),
                          fallback)
            node.device = device
