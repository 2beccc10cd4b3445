"""Loop-body ops as standalone copies grappler can cost: `loop_body_graph_def`.

grappler's static shape inference does not follow a lowered while loop: a non-constant Enter,
a Merge and a TensorList's elements have unknown shapes for it, so an LSTM body's [batch, 4u]
MatMul is costed as if every unknown dimension were 1 (nmt_2l_loop's body ops came out ~100x
too cheap). TensorFlow's importer knows these shapes once `tfplaceto.graph.loops` has written
them into the GraphDef. Here every op of a loop body whose inputs have static shapes is copied
out of the loop with each input replaced by a constant (small integer values known statically:
axes, shapes) or a placeholder of that shape, so grappler costs one iteration of it at its real
size; `analytical.py` uses those costs for the body ops (and multiplies by the trips).
"""

from __future__ import annotations

import numpy as np

from tfplaceto.graph.loops import static_value
from tfplaceto.graph.op_graph import OpGraph

# Ops that move control through a loop: costed 0 wherever they are, nothing to copy.
_LOOP_CONTROL = frozenset({"Enter", "RefEnter", "Exit", "RefExit", "Merge", "RefMerge", "Switch",
                           "RefSwitch", "NextIteration", "RefNextIteration", "LoopCond"})
_MAX_CONST_ELEMENTS = 1024
_PREFIX = "_tfplaceto_loop_input"


def loop_body_graph_def(op_graph: OpGraph):
    """(GraphDef, names): standalone copies of the loop-body ops of op_graph that can be costed.

    Each copy keeps its op's name, type and attributes; its inputs are new Const or Placeholder
    nodes (named under "_tfplaceto_loop_input/"), its control inputs are dropped. An op with an
    input of unknown shape, or a resource or variant input (TensorList and variable ops, which
    do no arithmetic), is left out and keeps the cost grappler gave it in the whole graph.
    """
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(op_graph.graph_def, name="")
    result = tf.compat.v1.GraphDef()
    result.versions.CopyFrom(op_graph.graph_def.versions)
    names = []
    for i in np.flatnonzero(op_graph.iterations > 1):
        if op_graph.types[i] in _LOOP_CONTROL:
            continue
        op = graph.get_operation_by_name(op_graph.names[i])
        inputs = [_input_node(op.name, k, t) for k, t in enumerate(op.inputs)]
        if any(node is None for node in inputs):
            continue
        copy = result.node.add()
        copy.CopyFrom(op.node_def)
        copy.device = ""
        del copy.input[:]
        copy.input.extend(node.name for node in inputs)
        for attr in ("_class", "_output_shapes"):
            if attr in copy.attr:
                del copy.attr[attr]
        result.node.extend(inputs)
        names.append(op.name)
    return result, names


def _input_node(op_name: str, position: int, tensor):
    """A Const holding tensor's static value, or a Placeholder of its static shape, or None."""
    import tensorflow as tf
    from tensorflow.core.framework import node_def_pb2

    dtype = tensor.dtype.base_dtype
    if dtype in (tf.resource, tf.variant) or tensor.dtype._is_ref_dtype:
        return None
    node = node_def_pb2.NodeDef(name=f"{_PREFIX}/{op_name}/{position}")
    value = static_value(tensor) if dtype.is_integer else None
    if value is not None and np.size(value) <= _MAX_CONST_ELEMENTS:
        node.op = "Const"
        node.attr["dtype"].type = dtype.as_datatype_enum
        node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.asarray(value, dtype.as_numpy_dtype)))
        return node
    if not tensor.shape.is_fully_defined():
        return None
    node.op = "Placeholder"
    node.attr["dtype"].type = dtype.as_datatype_enum
    node.attr["shape"].shape.CopyFrom(tensor.shape.as_proto())
    return node
