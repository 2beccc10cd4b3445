"""A ConcreteFunction as a self-contained GraphDef: what it captures becomes nodes of the graph.

  self_contained_graph_def  the function's graph with every captured resource variable turned
                            into a VarHandleOp (its value returned beside the GraphDef) and every
                            other captured tensor into a Const, so it runs in a plain Session.
  FuncGraphFunction         a tf.function's graph (FuncGraph) dressed as its ConcreteFunction.
  _read_resource_variable, _var_handle_node_def, _const_node_def, _shared_name_of,
  _safe_variables, _unique: the pieces.
`tfplaceto.graph.sources` dispatches ConcreteFunctions, tf.functions, Keras steps and SavedModel
signatures here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from tfplaceto import errors
from tfplaceto.graph.node_defs import op_name


@dataclasses.dataclass(frozen=True)
class FuncGraphFunction:
    """A FuncGraph seen through the ConcreteFunction attributes `_from_concrete_function` reads."""

    graph: Any

    @property
    def captured_inputs(self) -> list:
        return list(self.graph.external_captures)

    @property
    def inputs(self) -> list:
        return list(self.graph.inputs)

    @property
    def outputs(self) -> list:
        return list(self.graph.outputs)

    @property
    def variables(self) -> tuple:
        return tuple(self.graph.variables)


def self_contained_graph_def(function) -> tuple[graph_pb2.GraphDef, dict[str, np.ndarray]]:
    """The function's GraphDef with captures turned into VarHandleOp (variables) or Const nodes.

    A captured variable arrives as a resource Placeholder; it becomes a VarHandleOp of the same
    node name (so no edge changes), the variable's dtype and shape, and a shared_name from the
    variable's name (made unique: two VarHandleOps with one shared_name would alias in a Session).
    Its current value goes into the returned dict.
    """
    graph_def = function.graph.as_graph_def()
    variables_by_handle = {}
    for variable in (*function.graph.variables, *_safe_variables(function)):
        handle = getattr(variable, "handle", None)
        if handle is not None:
            variables_by_handle.setdefault(id(handle), variable)
    nodes = {node.name: node for node in graph_def.node}
    used_shared_names = {node.attr["shared_name"].s.decode() for node in graph_def.node
                         if node.op == "VarHandleOp"}
    variable_values: dict[str, np.ndarray] = {}
    captures = list(zip(function.captured_inputs, function.graph.internal_captures, strict=False))
    if len(captures) != len(function.graph.internal_captures):
        raise errors.InvalidGraphError(
            f"the function's captures could not all be resolved ({len(function.captured_inputs)} "
            f"values for {len(function.graph.internal_captures)} captures); trace it again after "
            "the objects it closes over exist")
    for external, internal in captures:
        node = nodes.get(internal.op.name)
        if node is None or node.op != "Placeholder":
            continue  # already a Const (small captured constants are embedded by TF)
        if external.dtype == tf.resource:
            variable = variables_by_handle.get(id(external))
            dtype, shape, value = _read_resource_variable(external, internal.op.name)
            base = _shared_name_of(variable) or internal.op.name
            shared_name = _unique(base, used_shared_names)
            used_shared_names.add(shared_name)
            node.CopyFrom(_var_handle_node_def(node.name, dtype, shape, shared_name))
            variable_values[node.name] = value
        else:
            node.CopyFrom(_const_node_def(node.name, external, internal.op.name))
    return graph_def, variable_values


def _read_resource_variable(handle, name: str) -> tuple[tf.DType, tf.TensorShape, np.ndarray]:
    """dtype, shape and current value of the variable behind an eager resource handle."""
    handle_data = getattr(handle, "_handle_data", None)
    shapes_and_types = list(handle_data.shape_and_type) if handle_data is not None else []
    if not shapes_and_types:
        raise errors.InvalidGraphError(
            f"the function captures a resource {name!r} that is not a variable (a lookup table, "
            "iterator or similar); tfplaceto can only import functions whose captured resources "
            "are variables: pass such resources as function arguments or drop them")
    dtype = tf.as_dtype(shapes_and_types[0].dtype)
    shape = tf.TensorShape(shapes_and_types[0].shape)
    try:
        with tf.init_scope():
            value = tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype).numpy()
    except (tf.errors.OpError, ValueError, TypeError) as error:
        raise errors.InvalidGraphError(
            f"cannot read the captured variable {name!r} ({errors.first_line(error)}); initialize the "
            "variables (or restore the checkpoint) before importing") from None
    return dtype, shape, value


def _var_handle_node_def(name: str, dtype: tf.DType, shape: tf.TensorShape,
                         shared_name: str) -> node_def_pb2.NodeDef:
    # Built by TF itself so that every attr (and its default) is exactly what the op wants.
    with tf.Graph().as_default() as scratch:
        tf.raw_ops.VarHandleOp(dtype=dtype, shape=shape, shared_name=shared_name, name="handle")
    node = node_def_pb2.NodeDef()
    node.CopyFrom(scratch.as_graph_def().node[0])
    node.name = name
    return node


def _const_node_def(name: str, value, label: str) -> node_def_pb2.NodeDef:
    if value.dtype == tf.variant:
        raise errors.InvalidGraphError(
            f"the function captures a variant tensor {label!r} (a dataset, TensorList or "
            "similar) that cannot be written as a constant; pass it as a function argument")
    try:
        with tf.init_scope():
            array = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
    except (TypeError, ValueError, tf.errors.OpError) as error:
        raise errors.InvalidGraphError(
            f"the function captures {label!r}, which is not an eager tensor "
            f"({errors.first_line(error)}); trace the function outside any other tf.function") from None
    with tf.Graph().as_default() as scratch:
        tf.constant(array, dtype=value.dtype, name="const")
    node = node_def_pb2.NodeDef()
    node.CopyFrom(scratch.as_graph_def().node[0])
    node.name = name
    return node


def _shared_name_of(variable) -> str | None:
    if variable is None:
        return None
    name = getattr(variable, "_shared_name", None) or getattr(variable, "name", None)
    if not isinstance(name, str) or not name:
        return None
    return op_name(name)


def _safe_variables(function) -> tuple:
    try:
        return tuple(function.variables)
    except (AttributeError, ValueError):
        return ()


def _unique(base: str, used: set[str]) -> str:
    if base not in used:
        return base
    index = 1
    while f"{base}_{index}" in used:
        index += 1
    return f"{base}_{index}"
