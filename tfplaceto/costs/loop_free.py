"""The ops of a graph with loops as a loop-free graph grappler can cost: `loop_free_graph_def`.

grappler's static shape inference does not follow a lowered while loop: a non-constant Enter,
a Merge and a TensorList's elements have unknown shapes for it, so an LSTM body's [batch, 4u]
MatMul is costed as if every unknown dimension were 1 (nmt_2l_loop's body ops came out ~100x
too cheap). TensorFlow's importer knows these shapes once `tfplaceto.graph.loops` has written
them into the GraphDef. Here the ops are copied out of their loops into one loop-free
graph (the ops after a loop too: they read its stacked outputs), each input from a loop
control or TensorList op replaced by a constant (small integer values known
statically: axes, shapes) or a placeholder of its static shape, so grappler costs one iteration
of each at its real size; `analytical.py` uses those costs (and multiplies a body's by the
trips).
"""

from __future__ import annotations

import numpy as np

from tfplaceto.graph.op_graph import OpGraph
from tfplaceto.graph.static_values import static_value

# Ops that move control through a loop: costed 0 wherever they are, nothing to copy.
_LOOP_CONTROL = frozenset({"Enter", "RefEnter", "Exit", "RefExit", "Merge", "RefMerge", "Switch",
                           "RefSwitch", "NextIteration", "RefNextIteration", "LoopCond"})
_MAX_CONST_ELEMENTS = 1024
_PREFIX = "_tfplaceto_loop_input"


def loop_free_graph_def(op_graph: OpGraph):
    """(GraphDef, names): the ops of a graph with loops as one loop-free graph grappler can cost.

    The ops (all but loop control, TensorList ops and ops on resources or variants) keep their names, types, attributes and the data edges between them, so grappler's
    shape inference runs through the body as through any DAG (a gradient's Reshape gets its
    shape from a Shape op, and the MatMul after it its size). Every input from outside that
    set (an Identity of a Switch, an Enter, an element popped from a TensorList) becomes a
    Const holding its static value (small integers: shapes, axes) or a Placeholder of its
    static shape (partly unknown if TensorFlow does not know it); control inputs are dropped.
    """
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(op_graph.graph_def, name="")
    # Not only the bodies: the ops after a loop read its stacked outputs, whose shapes grappler
    # does not know either (nmt_2l_loop's [128, 40, 40, 1024] attention, costed as [1, 1, 1, 1]).
    body = {name for name, kind in zip(op_graph.names, op_graph.types)
            if kind not in _LOOP_CONTROL and not kind.startswith("TensorList")}
    body = {name for name in body if _costable(graph.get_operation_by_name(name))}
    result = tf.compat.v1.GraphDef()
    result.versions.CopyFrom(op_graph.graph_def.versions)
    boundary: dict[str, object] = {}
    names = []
    for op in graph.get_operations():
        if op.name not in body:
            continue
        inputs = []
        for t in op.inputs:
            key = f"{_PREFIX}/{t.op.name}/{t.value_index}"
            if t.op.name in body and key not in boundary and not _static_integer(t):
                inputs.append(f"{t.op.name}:{t.value_index}")
                continue
            if key not in boundary:
                boundary[key] = _input_node(key, t)
            inputs.append(key)
        copy = result.node.add()
        copy.CopyFrom(op.node_def)
        copy.device = ""
        del copy.input[:]
        copy.input.extend(inputs)
        for attr in ("_class", "_output_shapes"):
            if attr in copy.attr:
                del copy.attr[attr]
        names.append(op.name)
    result.node.extend(boundary.values())
    return result, names


def _static_integer(tensor) -> bool:
    """Whether tensor is a small integer computed in the graph whose value is static: such
    inputs (a Tensordot's permutation and shapes, computed from Shape ops) become constants,
    since grappler's shape inference loses them after a loop and then a [5120, 1024] x
    [1024, 32000] MatMul reads as [?, 1024] x [1024, 32000]."""
    if not tensor.dtype.is_integer or tensor.op.type == "Const" or not tensor.shape.is_fully_defined():
        return False
    if tensor.shape.num_elements() > _MAX_CONST_ELEMENTS:
        return False
    return static_value(tensor) is not None


def _costable(op) -> bool:
    """Whether op computes on plain tensors (no resource or variant inputs or outputs)."""
    import tensorflow as tf

    return not any(t.dtype.base_dtype in (tf.resource, tf.variant) or t.dtype._is_ref_dtype
                   for t in list(op.inputs) + list(op.outputs))


def _input_node(name: str, tensor):
    """A Const holding tensor's static value (small integers), else a Placeholder of its shape."""
    import tensorflow as tf
    from tensorflow.core.framework import node_def_pb2

    dtype = tensor.dtype.base_dtype
    node = node_def_pb2.NodeDef(name=name)
    value = static_value(tensor) if dtype.is_integer else None
    if value is not None and np.size(value) <= _MAX_CONST_ELEMENTS:
        node.op = "Const"
        node.attr["dtype"].type = dtype.as_datatype_enum
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.asarray(value, dtype.as_numpy_dtype)))
        return node
    node.op = "Placeholder"
    node.attr["dtype"].type = dtype.as_datatype_enum
    node.attr["shape"].shape.CopyFrom(tensor.shape.as_proto())
    return node
