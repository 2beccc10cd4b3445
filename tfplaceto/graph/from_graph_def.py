"""Builds an `OpGraph` from a self-contained TensorFlow GraphDef.

`op_graph_from_graph_def` is the one place where TensorFlow's view of a graph becomes arrays:
- batch sizes: placeholders with an unknown leading dimension get `batch_size`, then TensorFlow's
  own shape inference (import into a tf.Graph) gives every output its static shape and bytes;
- edges: one per (tensor, consumer) pair; control inputs become control edges; the back edges of
  TF1 while loops (NextIteration -> Merge) are dropped so the result is a DAG;
- loops: each op's loop frame and the frame's trip count (`tfplaceto.graph.loops`) give how many
  times each op runs and each tensor moves per step (`iterations`, `tensor_iterations`); a
  TensorList accumulated for the gradient leaves its loop holding one element per iteration;
  shapes TensorFlow's shape inference cannot see through a loop (loop variables, TensorList
  elements and lengths) are written into the GraphDef (`loop_shapes.with_loop_shapes`), so the sizes
  in a loop body and after a recurrent layer are known;
- pruning: only the ops the fetches depend on are kept (as a Session would run them);
- memory: variables (VarHandleOp, VariableV2, optimizer slots alike) and constants are persistent;
- colocation: `_class: loc:@x` attributes, and resource/reference edges (a variable and the ops
  that read or update it must share a device, as TensorFlow's placer enforces);
- kernels: the device types with a registered kernel for each node's op and dtype attributes
  (TensorFlow's kernel registry lists GPU kernels even in a CPU-only process).
The NodeDef helpers it shares with the source dispatch, the inliner, the LSTM/GRU selector and
the write-back are in `node_defs.py`.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Mapping, Sequence

import numpy as np

from tfplaceto import errors
from tfplaceto.cluster import DEVICE_TYPES
from tfplaceto.graph import loop_shapes, loops
from tfplaceto.graph.node_defs import op_name, parse_input, sinks
from tfplaceto.graph.op_graph import OpGraph, joined_classes, make_op_graph

# Ops that take a resource input without TensorFlow colocating them with the resource.
_RESOURCE_COLOCATION_EXEMPT = frozenset({
    "While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase", "PartitionedCall",
    "StatefulPartitionedCall", "IdentityN",
})
_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable", "VarHandleOpV2"})
_BACK_EDGE_OPS = frozenset({"NextIteration", "RefNextIteration"})
# Bytes per element assumed for strings, whose size shape inference cannot know.
_STRING_ELEMENT_BYTES = 64


def op_graph_from_graph_def(graph_def, fetches: Sequence[str] | None = None,
                            batch_size: int | None = None,
                            variable_values: Mapping[str, np.ndarray] | None = None,
                            output_fetches: Sequence[tuple[str, int]] = (),
                            loop_iterations: loops.LoopIterations = None) -> OpGraph:
    """The OpGraph of a self-contained GraphDef (function calls inlined, variables as nodes).

    Args:
      graph_def: a tf.compat.v1.GraphDef; it is copied, never modified.
      fetches: op or tensor names the step computes; default: the graph's sinks.
      batch_size: fills unknown leading dimensions of placeholders.
      variable_values: known values of variables, carried along for measurement.
      output_fetches: (op name, output index) of fetches named as tensors: the op must have
        that output.
      loop_iterations: trips of while loops whose count is not static: an int for all, or a
        dict loop frame name -> trips (see `tfplaceto.graph.loops`).

    Raises:
      InvalidGraphError: empty graph, unknown fetch, unknown shapes with no batch_size, cycles,
        a bad loop_iterations.
    """
    import tensorflow as tf

    if not isinstance(graph_def, tf.compat.v1.GraphDef):
        raise errors.InvalidGraphError(f"expected a GraphDef, got {type(graph_def).__name__}")
    if not graph_def.node:
        raise errors.InvalidGraphError("the graph has no ops")
    graph_def = _fill_batch_dims(graph_def, batch_size)
    nodes = {n.name: n for n in graph_def.node}
    fetch_ops = _normalize_fetches(fetches, nodes)
    roots = fetch_ops or sinks(graph_def)
    keep = _fanin(roots, nodes) if roots else set(nodes)  # no sinks at all: a cycle, found below
    pruned = tf.compat.v1.GraphDef()
    pruned.versions.CopyFrom(graph_def.versions)
    pruned.library.CopyFrom(graph_def.library)
    pruned.node.extend(n for n in graph_def.node if n.name in keep)

    graph = _import(pruned)
    for name, index in output_fetches:
        outputs = len(graph.get_operation_by_name(name).outputs) if name in keep else index + 1
        if index >= outputs:
            raise errors.InvalidGraphError(
                f"fetch '{name}:{index}': op {name!r} has {outputs} output(s), so it has no output "
                f"{index}; fetch the op by its name {name!r}")
    if any(node.op in ("Enter", "RefEnter") for node in pruned.node):
        pruned, graph = loop_shapes.with_loop_shapes(pruned, graph, _import)
    return _build(graph, pruned, fetch_ops, variable_values, loop_iterations)


def _import(graph_def):
    import tensorflow as tf

    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
    except (ValueError, TypeError, tf.errors.OpError) as e:
        raise errors.InvalidGraphError(f"TensorFlow cannot import the graph: {errors.first_line(e)}") from None
    return graph


def _fill_batch_dims(graph_def, batch_size: int | None):
    """A copy of graph_def whose placeholders have a known leading dimension."""
    import tensorflow as tf

    result = tf.compat.v1.GraphDef()
    result.CopyFrom(graph_def)
    for node in result.node:
        if node.op != "Placeholder" or "shape" not in node.attr:
            continue
        shape = node.attr["shape"].shape
        dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
        if dtype == tf.resource or dtype == tf.variant:
            continue
        if shape.unknown_rank:
            raise errors.InvalidGraphError(
                f"placeholder {node.name!r} has an unknown rank; give it a shape so tensor sizes "
                "can be computed")
        dims = [d.size for d in shape.dim]
        if dims and dims[0] < 0:
            if batch_size is None:
                raise errors.InvalidGraphError(
                    f"placeholder {node.name!r} has shape {_shape_str(dims)} with an unknown batch "
                    "dimension; pass batch_size=N (--batch-size N on the command line) so tensor sizes "
                    "can be computed")
            shape.dim[0].size = int(batch_size)
        if any(d.size < 0 for d in shape.dim):
            raise errors.InvalidGraphError(
                f"placeholder {node.name!r} has shape {_shape_str([d.size for d in shape.dim])}: "
                "only the leading (batch) dimension may be unknown")
    return result


def _shape_str(dims) -> str:
    return "[" + ", ".join("?" if d < 0 else str(d) for d in dims) + "]"


def _normalize_fetches(fetches, nodes) -> tuple[str, ...]:
    if fetches is None:
        return ()
    if isinstance(fetches, str):
        fetches = [fetches]
    result = []
    for fetch in fetches:
        name = op_name(str(fetch))
        if name not in nodes:
            import difflib

            close = difflib.get_close_matches(name, list(nodes), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise errors.InvalidGraphError(f"fetch {fetch!r} is not an op of the graph{hint}")
        result.append(name)
    return tuple(dict.fromkeys(result))


def _fanin(roots, nodes) -> set[str]:
    keep, stack = set(), list(roots)
    while stack:
        name = stack.pop()
        if name in keep or name not in nodes:
            continue
        keep.add(name)
        node = nodes[name]
        stack.extend(parse_input(i)[0] for i in node.input)
        # TensorFlow refuses a graph whose `loc:@x` colocation names a missing node.
        if "_class" in node.attr:
            stack.extend(v.decode()[5:] for v in node.attr["_class"].list.s if v.startswith(b"loc:@"))
    return keep


def _tensor_bytes(tensor, fallback: int) -> tuple[int, bool]:
    """(bytes, known) of a tf.Tensor's static shape; unknown sizes take `fallback`."""
    import tensorflow as tf

    dtype = tensor.dtype.base_dtype
    if dtype in (tf.resource, tf.variant):
        return 0, True
    shape = tensor.shape
    if shape.rank is None or any(d is None for d in shape.as_list()):
        return fallback, False
    elements = int(np.prod(shape.as_list(), dtype=np.int64))
    size = _STRING_ELEMENT_BYTES if dtype == tf.string else dtype.size
    return elements * size, True


def _variable_bytes(node) -> int:
    import tensorflow as tf

    shape = node.attr["shape"].shape
    if shape.unknown_rank or any(d.size < 0 for d in shape.dim):
        return 0
    dtype = tf.dtypes.as_dtype(node.attr["dtype"].type).base_dtype
    return int(np.prod([d.size for d in shape.dim], dtype=np.int64)) * dtype.size


@functools.cache
def _registered_kernels(op_type: str):
    from tensorflow.python.framework import kernels

    try:
        return tuple(kernels.get_registered_kernels_for_op(op_type).kernel)
    except Exception:  # an op type this TensorFlow does not know
        return ()


@functools.cache
def _constrained_attrs(op_type: str) -> tuple[str, ...]:
    """The attributes any kernel of op_type constrains: all that kernel matching depends on."""
    return tuple(sorted({c.name for k in _registered_kernels(op_type) for c in k.constraint}))


def kernel_device_types(node_def) -> tuple[bool, ...]:
    """For each of DEVICE_TYPES, whether a registered kernel matches the node's type attributes."""
    available = {t: False for t in DEVICE_TYPES}
    for kernel in _registered_kernels(node_def.op):
        kinds = DEVICE_TYPES if kernel.device_type == "DEFAULT" else (kernel.device_type,)
        if not any(k in available and not available[k] for k in kinds):
            continue
        if all(_satisfies(node_def, c) for c in kernel.constraint):
            for k in kinds:
                if k in available:
                    available[k] = True
    return tuple(available[t] for t in DEVICE_TYPES)


def _satisfies(node_def, constraint) -> bool:
    if constraint.name not in node_def.attr:
        return True  # a default value: TF's own defaults are allowed by registration
    allowed = set(constraint.allowed_values.list.type)
    if not allowed:
        return True
    value = node_def.attr[constraint.name]
    if value.HasField("type"):
        return value.type in allowed
    if value.HasField("list"):
        return all(t in allowed for t in value.list.type)
    return True


def _build(graph, graph_def, fetches, variable_values, loop_iterations) -> OpGraph:
    import tensorflow as tf

    ops = graph.get_operations()
    loop_info = loops.analyze_loops(ops, loop_iterations)
    index = {op.name: i for i, op in enumerate(ops)}
    node_defs = {n.name: n for n in graph_def.node}
    n = len(ops)
    colocated: list[tuple[int, int]] = []  # (op, op) pairs that must share a device
    kernel_cache: dict = {}
    kernels = np.zeros((n, len(DEVICE_TYPES)), bool)
    output_bytes = np.zeros(n, np.int64)
    unknown_shapes = np.zeros(n, bool)
    persistent = np.zeros(n, np.int64)
    tensor_ids: dict[tuple[int, int], int] = {}
    tensor_producer, tensor_bytes = [], []
    edge_tensor, edge_consumer = [], []
    control_senders, control_receivers = [], []
    out_bytes_of: dict[tuple[int, int], int] = {}
    # Tensors whose shape is unknown because a graph input's (a variable's) is: costs read input
    # shapes, so an op reading one has a guessed cost (`unknown_shapes`).
    shapeless: dict[tuple[int, int], bool] = {}

    for i, op in enumerate(ops):
        node = node_defs[op.name]
        key = (node.op,) + tuple(node.attr[a].SerializeToString() if a in node.attr else b""
                                 for a in _constrained_attrs(node.op))
        if key not in kernel_cache:
            kernel_cache[key] = kernel_device_types(node)
        kernels[i] = kernel_cache[key]
        known_inputs = [out_bytes_of.get((index[t.op.name], t.value_index), 0) for t in op.inputs]
        unknown_shapes[i] = any(shapeless.get((index[t.op.name], t.value_index), False) for t in op.inputs)
        # A source with no data inputs (a variable read, a dequeue) and an output of unknown shape
        # starts a run of shapeless tensors; unknown shapes of other ops (a Unique, an opaque
        # FusedBatchNorm reserve) are the op's nature, not missing information, and stay out.
        is_source = not any(t.dtype.base_dtype not in (tf.resource, tf.variant) for t in op.inputs)
        fallback = max(known_inputs, default=0)
        for t in op.outputs:
            size, known = _tensor_bytes(t, fallback)
            shapeless[(i, t.value_index)] = not known and (is_source or unknown_shapes[i])
            out_bytes_of[(i, t.value_index)] = size
            output_bytes[i] += size
        if node.op in _VARIABLE_OPS:
            persistent[i] = _variable_bytes(node)
        elif node.op == "Const":
            persistent[i] = output_bytes[i]
        for value in node.attr["_class"].list.s if "_class" in node.attr else ():
            target = value.decode()
            if target.startswith("loc:@") and target[5:] in index:
                colocated.append((i, index[target[5:]]))
    list_readers = _accumulator_bytes(ops, index, loop_info, out_bytes_of, output_bytes)
    colocated.extend(_loop_control_pairs(ops, loop_info))

    for i, op in enumerate(ops):
        node = node_defs[op.name]
        seen = set()
        for t in list(op.inputs) + list_readers.get(i, []):
            p = index[t.op.name]
            if t.op.type in _BACK_EDGE_OPS:
                continue  # TF1 while loop back edge: ordering within an iteration only
            if (t.dtype.base_dtype == tf.resource or t.dtype._is_ref_dtype) and \
                    node.op not in _RESOURCE_COLOCATION_EXEMPT:
                colocated.append((i, p))
            key = (p, t.value_index)
            if key not in tensor_ids:
                tensor_ids[key] = len(tensor_producer)
                tensor_producer.append(p)
                tensor_bytes.append(out_bytes_of[key])
            if (tensor_ids[key], i) not in seen:
                seen.add((tensor_ids[key], i))
                edge_tensor.append(tensor_ids[key])
                edge_consumer.append(i)
        # The NodeDef's "^x" inputs, in order (op.control_inputs has no stable order).
        for name in dict.fromkeys(parse_input(x)[0] for x in node.input if x.startswith("^")):
            control_senders.append(index[name])
            control_receivers.append(i)

    colocation_ids = joined_classes(n, colocated)
    values = dict(variable_values or {})
    tensor_iterations = _tensor_iterations(ops, loop_info, tensor_producer, edge_tensor, edge_consumer)
    return make_op_graph(
        [op.name for op in ops], [op.type for op in ops], tensor_producer, tensor_bytes, edge_tensor,
        edge_consumer, control_senders, control_receivers, output_bytes, persistent, colocation_ids,
        kernels, graph_def=graph_def, fetches=fetches, variable_values=values, unknown_shapes=unknown_shapes,
        iterations=loop_info.op_iterations, tensor_iterations=tensor_iterations,
        loops=loop_info.frames, frame=loop_info.op_frame)


_EXIT_OPS = frozenset({"Exit", "RefExit"})
_LIST_PASSING_OPS = frozenset({"Identity", "NextIteration", "Merge", "Switch"})
# The ops that drive a loop's iterations, colocated per frame: the control of a frame then runs
# on one device (no transfers of its own every iteration), and grouping ties the groups holding
# it, while the body's compute ops stay free to go anywhere.
_LOOP_CONTROL_OPS = frozenset({"LoopCond", "Merge", "RefMerge", "Switch", "RefSwitch",
                               "NextIteration", "RefNextIteration", "Exit", "RefExit"})


def _loop_control_pairs(ops, loop_info: loops.LoopInfo) -> list[tuple[int, int]]:
    """(op, op) pairs colocating the control ops of each loop frame with its LoopCond."""
    cond = {int(loop_info.op_frame[i]): i for i, op in enumerate(ops) if op.type == "LoopCond"}
    return [(i, cond[int(loop_info.op_frame[i])]) for i, op in enumerate(ops)
            if op.type in _LOOP_CONTROL_OPS and int(loop_info.op_frame[i]) in cond]


def _tensor_iterations(ops, loop_info: loops.LoopInfo, tensor_producer, edge_tensor,
                       edge_consumer) -> np.ndarray:
    """Times each tensor crosses its edges per step: every iteration of the frame its producer's
    outputs live in (an Enter's output: the loop's), but once when it only feeds Exits (the
    Switch output that leaves the loop carries a value on the last iteration only)."""
    if not loop_info.frames:
        return np.ones(len(tensor_producer), np.int64)
    tensor_producer = np.asarray(tensor_producer, np.int64)
    produced = np.array([loop_info.output_iterations(int(p)) for p in tensor_producer], np.int64)
    if not len(produced):
        return produced
    read = np.ones(len(tensor_producer), np.int64)
    for t, c in zip(edge_tensor, edge_consumer):
        op = ops[c]
        times = loop_info.output_iterations(c) if op.type in _EXIT_OPS else int(loop_info.op_iterations[c])
        read[t] = max(read[t], times)
    return np.minimum(produced, read)


def _accumulator_bytes(ops, index, loop_info: loops.LoopInfo, out_bytes_of,
                       output_bytes) -> dict[int, list]:
    """Gives the Exit of each TensorList accumulated in a loop (TensorListPushBack, what while_v2
    keeps for the gradient) the bytes of all its elements: a variant's static size is 0, but
    the stacked activations are held from the forward loop until the gradient loop reads them.

    Returns reader op -> [Exit output]: the ops that read such a list (TensorListPopBack in the
    gradient loop), reached through the Identity/Enter/Merge/Switch ops that pass the list
    along. Each gets an edge from the Exit, so the list is held until its reader ends (and is
    sent to the reader's device), not only until the Enter that forwards it without a copy."""
    readers: dict[int, list] = {}
    for i, op in enumerate(ops):
        if op.type != "TensorListPushBack" or loop_info.op_frame[i] == loops.ROOT:
            continue
        element = out_bytes_of.get((index[op.inputs[1].op.name], op.inputs[1].value_index), 0)
        stacked = element * loop_info.frames[loop_info.op_frame[i]].trips
        # The list goes round the loop (NextIteration -> Merge -> Switch) and leaves by an Exit.
        stack, seen = [op.outputs[0]], set()
        while stack:
            tensor = stack.pop()
            for consumer in tensor.consumers():
                if consumer.name in seen:
                    continue
                seen.add(consumer.name)
                if consumer.type in _EXIT_OPS:
                    e = index[consumer.name]
                    output_bytes[e] += stacked - out_bytes_of[(e, 0)]
                    out_bytes_of[(e, 0)] = stacked
                    for reader in _list_readers(consumer.outputs[0]):
                        readers.setdefault(index[reader.name], []).append(consumer.outputs[0])
                elif consumer.type in _LIST_PASSING_OPS:
                    stack.append(consumer.outputs[0])  # Switch: output 0 leaves the loop
    return readers


def _list_readers(tensor) -> list:
    """The ops reading a TensorList after it is passed along by Identity/Enter/Merge/Switch;
    for a TensorListPopBack, the ops using the popped element (the gradient's: the list's
    elements live until they have used them, not only until the pop)."""
    result, stack, seen = [], [tensor], set()
    while stack:
        for consumer in stack.pop().consumers():
            if consumer.name in seen:
                continue
            seen.add(consumer.name)
            if consumer.type in _LIST_PASSING_OPS or consumer.type == "Enter":
                stack.append(consumer.outputs[1 if consumer.type == "Switch" else 0])
            elif consumer.type == "TensorListPopBack":
                stack.append(consumer.outputs[1])
            elif consumer.type not in _EXIT_OPS:
                result.append(consumer)
    return result


def colocated_kernels(op_graph: OpGraph) -> np.ndarray:
    """(N, len(DEVICE_TYPES)) device types allowed for each op given its whole colocation group."""
    groups = op_graph.colocation
    allowed = np.ones((groups.max() + 1, op_graph.kernels.shape[1]), bool)
    np.logical_and.at(allowed, groups, op_graph.kernels)
    return allowed[groups]


def group_members(labels: np.ndarray) -> dict[int, list[int]]:
    members = collections.defaultdict(list)
    for i, g in enumerate(labels):
        members[int(g)].append(i)
    return members
