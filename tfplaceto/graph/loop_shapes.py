"""`with_loop_shapes`: the shapes TensorFlow's shape inference cannot see through a lowered while
loop, written into the GraphDef so a loop body's sizes and costs are known.

Map of the file:
  with_loop_shapes   (graph_def, graph) annotated, pass after pass: `_output_shapes` of loop
                     variables' Enter and Merge, of elements read from TensorLists, and the
                     length of a TensorListStack (Keras stacks an RNN's outputs that way).
  _more_defined      whether a shape knows more than another and agrees with it.
The TensorList facts come from `static_values.py`; trip counts are `loops.py`'s.
"""

from __future__ import annotations

from tfplaceto.graph.static_values import list_element_shape, list_length

# Ops reading one element of a TensorList: its shape is their last output's.
_LIST_READS = frozenset({"TensorListGetItem", "TensorListPopBack"})


def with_loop_shapes(graph_def, graph, import_graph, max_passes: int = 8):
    """(graph_def, graph) annotated so TensorFlow's shape inference sees through while loops.

    Imported as it is, a lowered loop hides every shape of its body: an Enter that is not
    constant and a Merge (whose back edge is not there yet) have unknown shapes, and so has
    everything computed from them. Sizes (transfers, memory) and grappler's costs of the body's
    ops (a [batch, ?] MatMul costed as one row) would be unknown or far too small. Written into
    the GraphDef, where TensorFlow's importer uses them (and checks them when it runs):
    - `_output_shapes` of a loop variable's Enter and Merge: the shape of the value entering
      the loop (a while_v2 loop variable keeps its shape unless given shape invariants);
    - `_output_shapes` of the element read from a TensorList (TensorListGetItem,
      TensorListPopBack): the element shape the list was made with or pushed;
    - `num_elements` and `_output_shapes` of a TensorListStack of static length and element
      shape (Keras stacks an RNN's outputs that way, so the shapes of every later layer depend
      on it).
    The graph is imported again after each pass; shapes made known by one pass (an inner loop's
    inputs, the next layer) are used by the next one, at most max_passes times.

    graph: graph_def imported; import_graph(graph_def) -> tf.Graph imports an annotated copy.
    """
    import tensorflow as tf

    for _ in range(max_passes):
        shapes, lengths = {}, {}
        for op in graph.get_operations():
            if op.type == "TensorListStack":
                length = list_length(op.inputs[0])
                if length is not None and op.get_attr("num_elements") == -1:
                    lengths[op.name] = length
                element = list_element_shape(op.inputs[0])
                if element is not None and not op.outputs[0].shape.is_fully_defined():
                    stacked = tf.TensorShape([length]).concatenate(element)
                    if _more_defined(stacked, op.outputs[0].shape):
                        shapes[op.name] = [stacked]
            elif op.type == "Merge" and not op.outputs[0].shape.is_fully_defined():
                enter = next((t.op for t in op.inputs if t.op.type == "Enter"), None)
                if enter is not None and _more_defined(enter.inputs[0].shape, op.outputs[0].shape):
                    shape = enter.inputs[0].shape
                    shapes[enter.name] = [shape]
                    shapes[op.name] = [shape, _SCALAR]
            elif op.type in _LIST_READS and not op.outputs[-1].shape.is_fully_defined():
                element = list_element_shape(op.inputs[0])
                if element is not None and _more_defined(element, op.outputs[-1].shape):
                    shapes[op.name] = [_SCALAR] * (len(op.outputs) - 1) + [element]
        if not shapes and not lengths:
            break
        graph_def = _copy_graph_def(graph_def)
        for node in graph_def.node:
            if node.name in lengths:
                node.attr["num_elements"].i = lengths[node.name]
            if node.name in shapes:
                annotation = node.attr["_output_shapes"].list.shape
                del annotation[:]
                for shape in shapes[node.name]:
                    annotation.add().CopyFrom(shape.as_proto())
        graph = import_graph(graph_def)
    return graph_def, graph


class _Scalar:
    """Lazily the TensorShape([]) (TensorFlow is imported where it is used)."""

    def as_proto(self):
        import tensorflow as tf

        return tf.TensorShape([]).as_proto()


_SCALAR = _Scalar()


def _more_defined(new, old) -> bool:
    """Whether shape `new` knows more dimensions than `old` and agrees with it."""
    if new.rank is None:
        return False
    if old.rank is None:
        return True
    if new.rank != old.rank or not new.is_compatible_with(old):
        return False
    return sum(d is not None for d in new.as_list()) > sum(d is not None for d in old.as_list())


def _copy_graph_def(graph_def):
    copy = type(graph_def)()
    copy.CopyFrom(graph_def)
    return copy
