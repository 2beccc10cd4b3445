"""What TensorFlow can know about a tensor before running: small integer values and TensorLists.

A loop's trip count (`loops.py`), the shapes written into a lowered loop (`loop_shapes.py`) and
the constants of the loop-free graph grappler costs (`costs/loop_free.py`) all read these.

Map of the file:
  static_value         the value of a small integer tensor TensorFlow can know before running
                       (Const, or computed from static shapes in a scratch graph), else None.
  list_source          where a TensorList's elements come from, followed back through loops:
                       the element a body writes, or the op that made the list.
  list_element_shape   the static shape of a TensorList's elements, or None.
  list_length          the static number of elements of a TensorList, or None.
  through_identities   a tensor with Identity-like ops skipped.
"""

from __future__ import annotations

import numpy as np

IDENTITY_OPS = frozenset({"Identity", "RefIdentity", "Snapshot"})
# Ops writing one element of a TensorList (the list before holds the same elements).
LIST_WRITES = frozenset({"TensorListPushBack", "TensorListSetItem"})
# Ops a static integer computation may use (all stateless and cheap); their inputs must be static.
_STATIC_OPS = frozenset({
    "Const", "Identity", "Cast", "StridedSlice", "Pack", "Unpack", "ConcatV2", "GatherV2", "Squeeze",
    "ExpandDims", "Reshape", "Add", "AddV2", "Sub", "Mul", "FloorDiv", "RealDiv", "Maximum",
    "Minimum", "Prod", "Sum", "Range", "Fill",
})
_SHAPE_OPS = frozenset({"Shape", "Size", "Rank"})
_MAX_STATIC_OPS = 64


def through_identities(tensor):
    """tensor, or the tensor an Identity-like op (Identity, RefIdentity, Snapshot) passes on."""
    while tensor.op.type in IDENTITY_OPS:
        tensor = tensor.op.inputs[0]
    return tensor


def static_value(tensor):
    """The value of a small integer tensor computable from constants and static shapes, or None.

    TensorFlow's `constant_value` first (an element popped from a TensorList: the value pushed);
    else the ops the tensor depends on are copied into a scratch graph, with Shape/Size/Rank of
    statically shaped tensors turned into constants, and evaluated there (a loop bound is often `strided_slice(shape(x))` of a batch-filled input).
    """
    import tensorflow as tf
    from tensorflow.python.framework import tensor_util

    if not tensor.dtype.is_integer:
        return None
    if tensor.op.type == "TensorListPopBack" and tensor.value_index == 1:
        # A gradient loop pops what its forward loop pushed (e.g. the Shape of an activation).
        source = list_source(tensor.op.inputs[0])
        return static_value(source[1]) if source is not None and source[0] == "written" else None
    try:
        value = tensor_util.constant_value(tensor)
    except (TypeError, ValueError):
        value = None
    if value is not None:
        return value
    needed, stack = {}, [tensor.op]
    while stack:
        op = stack.pop()
        if op.name in needed:
            continue
        if op.type in _SHAPE_OPS:
            shape = op.inputs[0].shape
            if not shape.is_fully_defined():
                return None
            needed[op.name] = op
            continue
        if op.type not in _STATIC_OPS or len(needed) >= _MAX_STATIC_OPS:
            return None
        needed[op.name] = op
        stack.extend(t.op for t in op.inputs)
    graph_def = tf.compat.v1.GraphDef()
    for op in needed.values():
        if op.type in _SHAPE_OPS:
            shape = op.inputs[0].shape.as_list()
            folded = {"Shape": shape, "Size": int(np.prod(shape)), "Rank": len(shape)}[op.type]
            out_type = op.outputs[0].dtype.as_numpy_dtype
            node = tf.make_tensor_proto(np.asarray(folded, out_type))
            const = graph_def.node.add(name=op.name, op="Const")
            const.attr["value"].tensor.CopyFrom(node)
            const.attr["dtype"].type = op.outputs[0].dtype.as_datatype_enum
            continue
        node = graph_def.node.add()
        node.CopyFrom(op.node_def)
        del node.input[:]
        node.input.extend(f"{t.op.name}:{t.value_index}" for t in op.inputs)
        node.device = ""
        if "_class" in node.attr:
            del node.attr["_class"]
    scratch = tf.Graph()
    try:
        with scratch.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=scratch) as session:
            return session.run(f"{tensor.op.name}:{tensor.value_index}")
    except (ValueError, TypeError, tf.errors.OpError):
        return None


def list_source(tensor, made: bool = False):
    """Where a TensorList's elements come from, following it back through loops:
    ("written", the element tensor a loop body pushes or sets), ("made", the op that made the
    list: TensorListFromTensor, TensorListReserve, EmptyTensorList), or None. made=True skips
    the writes and looks for the op that made the list (what its length comes from)."""
    for _ in range(64):
        op = tensor.op
        if op.type in IDENTITY_OPS or op.type in ("Exit", "Switch", "Enter"):
            tensor = op.inputs[0]
        elif op.type == "Merge":
            # What the body writes (pushed in a forward loop), else what enters the loop.
            back = next((t.op for t in op.inputs if t.op.type == "NextIteration"), None)
            written = through_identities(back.inputs[0]).op if back is not None else None
            if written is not None and written.type in LIST_WRITES and not made:
                return "written", written.inputs[-1]
            tensor = next((t for t in op.inputs if t.op.type == "Enter"), None)
            if tensor is None:
                return None
        elif op.type in LIST_WRITES or op.type == "TensorListPopBack":
            tensor = op.inputs[0]  # the list before: same elements
        elif op.type in ("TensorListFromTensor", "TensorListReserve", "EmptyTensorList"):
            return "made", op
        else:
            return None
    return None


def list_element_shape(tensor):
    """The static shape of a TensorList's elements (a tf.TensorShape), or None."""
    import tensorflow as tf

    source = list_source(tensor)
    if source is None:
        return None
    kind, what = source
    if kind == "written":
        return what.shape if what.shape.rank is not None else None
    if what.type == "TensorListFromTensor":
        shape = what.inputs[0].shape
        return shape[1:] if shape.rank else None
    dims = static_value(what.inputs[0])
    if dims is None or np.ndim(dims) != 1:
        return None
    return tf.TensorShape([int(d) if d >= 0 else None for d in dims])


def list_length(tensor) -> int | None:
    """Static number of elements of a TensorList tensor made with a static length."""
    source = list_source(tensor, made=True)
    if source is None:
        return None
    made = source[1]
    if made.type == "TensorListReserve":
        length = static_value(made.inputs[1])
        return int(length) if length is not None and np.ndim(length) == 0 and length >= 0 else None
    if made.type == "TensorListFromTensor":
        dims = made.inputs[0].shape
        return int(dims[0]) if dims.rank and dims[0] is not None else None
    return None
