"""Turn every kind of graph source into one self-contained, runnable, call-free GraphDef.

`load_source(source, fetches=None)` is the front door of `tp.import_graph`: whatever the user hands
us, it returns a `LoadedGraph` whose GraphDef runs in a plain `tf.compat.v1.Session` with nothing
but its feeds (placeholders) and the variable values shipped alongside, and in which every function
call (PartitionedCall / StatefulPartitionedCall, nested) has been inlined so that the ops of function
bodies are ordinary nodes that can be placed one by one. The OpGraph builder
(`tfplaceto.graph.from_graph_def`) takes it from there.

Map of the file (the dispatch; each idea it dispatches to has its own module):
  LoadedGraph             the result: graph_def, fetches, feeds, variable_values, description.
  load_source             dispatch on the kind of source (the table below).
  build_builtin           a built-in graph's Keras model and default batch size (the one path to
                          `tfplaceto.graph.builtin`, for `import_graph` and "builtin:NAME").
  _from_* helpers         one per kind of source.
  _finish                 the LSTM/GRU alternative (`implementations.select`), then inlining
                          (`tfplaceto.graph.inlining`: grappler's function inliner), then fetches.
  _resolve_fetches, _check_graph_def, _feeds_of_graph_def: validation and defaults.
Elsewhere: the Keras training step (or forward pass) is traced in `keras_step.py`; a
ConcreteFunction's captures become VarHandleOp / Const nodes in `captures.py`; variables are set
up in a Session by `tfplaceto.measure.session`; which proto a .pb/.pbtxt file holds is
`graph_file.py`'s question.

Sources:
  tf.compat.v1.GraphDef     copied (the user's proto is never modified).
  tf.compat.v1.MetaGraphDef its graph_def; fetches default to the "train_op" collection.
  tf.Graph                  as_graph_def(); fetches default to its "train_op" collection. A
                            tf.function's graph (FuncGraph) is imported like its ConcreteFunction:
                            its captured variables give the shapes its GraphDef lacks.
  ConcreteFunction          graph + captures made self-contained; fetches = its outputs.
  tf.function               its concrete function (needs an input_signature or exactly one trace).
  tf.keras.Model            compiled: train_step((x, y)) traced; else model(x, training=False).
  SavedModel directory      tf.saved_model.load, signature `signature_key` ("serving_default").
  "path.pb" / "path.pbtxt"  binary / text GraphDef or MetaGraphDef.
  "builtin:NAME"            tfplaceto.graph.builtin.build(NAME), then loaded like any source.
Anything else, or an unreadable source, raises InvalidGraphError.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from tfplaceto import errors
from tfplaceto.graph import builtin, captures, implementations, keras_step
from tfplaceto.graph.graph_file import op_is_registered, parse_graph_file
from tfplaceto.graph.inlining import inline_functions
from tfplaceto.graph.node_defs import op_name

__all__ = ["LoadedGraph", "build_builtin", "load_source"]

_TEXT_SUFFIXES = (".pbtxt", ".pbtext", ".txt", ".prototxt")
_BUILTIN_PREFIX = "builtin:"

Feed = tuple[str, "list[int | None] | None", str]


@dataclasses.dataclass(frozen=True)
class _Inlining:
    """How calls are inlined: lower functional control flow; the device type whose alternative
    of a swappable function is kept (None: the called one)."""

    lower_control_flow: bool = True
    device_type: str | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class LoadedGraph:
    """A self-contained, call-free GraphDef and what is needed to run it.

    graph_def        runnable GraphDef: captures are VarHandleOp/Const nodes, calls are inlined.
    fetches          op names to run (empty: the graph's sinks).
    feeds            (placeholder op name, shape as a list with None for unknown dims or None for
                     unknown rank, dtype name) for each input that must be fed.
    variable_values  VarHandleOp node name -> the variable's value when it was loaded.
    description      one human-readable line saying what was loaded.
    implementations  which alternative of each swappable function (Keras LSTM/GRU) was kept.
    """

    graph_def: graph_pb2.GraphDef
    fetches: tuple[str, ...]
    feeds: tuple[Feed, ...]
    variable_values: dict[str, np.ndarray]
    description: str
    implementations: tuple = ()  # the ImplementationChoice of each function with alternatives

    def __repr__(self) -> str:
        return (f"LoadedGraph({self.description}: {len(self.graph_def.node)} nodes, "
                f"{len(self.fetches)} fetches, {len(self.feeds)} feeds, "
                f"{len(self.variable_values)} variables)")


# -- the front door -------------------------------------------------------------------------------

def load_source(source: Any, fetches: str | Sequence[str] | None = None, *,
                signature_key: str | None = None,
                lower_control_flow: bool = True, device_type: str | None = None) -> LoadedGraph:
    """Loads any supported graph source into a `LoadedGraph` (see the module docstring).

    fetches: op names or tensor names ("x:0" means op "x"); None keeps the source's default
      (train_op collection, function outputs, or the sinks). Each must be an op of the result.
    signature_key: the SavedModel signature to load (default "serving_default").
    lower_control_flow: also lower functional While/If/Case to TF1 control flow (what the TF
      runtime does before placing ops), so loop and branch bodies are placeable ops; with False
      they stay single ops whose bodies live in the GraphDef's function library.
    device_type: "GPU" or "CPU": of a function with alternatives (a Keras LSTM/GRU's cuDNN and
      standard implementations), keep the one TensorFlow runs on that device type
      (`tfplaceto.graph.implementations`); None keeps the one the graph calls (the standard one).
    Raises InvalidGraphError for an unsupported, unreadable or invalid source or a missing fetch.
    """
    requested = _normalize_fetches(fetches)
    inlining = _Inlining(lower_control_flow, device_type)
    if isinstance(source, LoadedGraph):
        loaded = _finish(source.graph_def, requested or source.fetches, source.feeds,
                         source.variable_values, source.description, inlining)
        return dataclasses.replace(loaded, implementations=loaded.implementations or source.implementations)
    if isinstance(source, str) and source.startswith(_BUILTIN_PREFIX):
        return _from_builtin(source[len(_BUILTIN_PREFIX):], requested, signature_key,
                             inlining)
    if isinstance(source, (str, os.PathLike)):
        return _from_path(os.fspath(source), requested, signature_key, inlining)
    if isinstance(source, graph_pb2.GraphDef):
        graph_def = graph_pb2.GraphDef()
        graph_def.CopyFrom(source)
        return _from_graph_def(graph_def, requested, (), "GraphDef", inlining)
    if isinstance(source, meta_graph_pb2.MetaGraphDef):
        return _from_meta_graph_def(source, requested, "MetaGraphDef", inlining)
    if isinstance(source, tf.Graph) and getattr(source, "internal_captures", None):
        # A tf.function's graph: its captures still know the variables' shapes (its GraphDef
        # alone does not), so import it as its ConcreteFunction would be.
        return _from_concrete_function(captures.FuncGraphFunction(source), requested,
                                       f"tf.function graph {source.name}", inlining)
    if isinstance(source, tf.Graph):
        default_fetches = tuple(_name_of(item) for item in source.get_collection("train_op")
                                if isinstance(item, (str, bytes)) or hasattr(item, "name"))
        return _from_graph_def(source.as_graph_def(), requested, default_fetches, "tf.Graph",
                               inlining)
    if isinstance(source, tf.types.experimental.ConcreteFunction):
        return _from_concrete_function(source, requested, _function_description(source),
                                       inlining)
    if isinstance(source, tf.types.experimental.PolymorphicFunction):
        function = _concrete_function_of(source)
        return _from_concrete_function(function, requested, _function_description(function),
                                       inlining)
    if keras_step.is_keras_model(source):
        return _from_keras_model(source, requested, inlining)
    if hasattr(source, "signatures") and isinstance(source, tf.__internal__.tracking.AutoTrackable):
        # An object returned by tf.saved_model.load.
        return _from_loaded_saved_model(source, requested, signature_key, "loaded SavedModel",
                                        inlining)
    raise errors.InvalidGraphError(
        f"cannot import a graph from a {type(source).__module__}.{type(source).__qualname__}; "
        "pass a GraphDef, MetaGraphDef, tf.Graph, ConcreteFunction, tf.function with an "
        "input_signature, tf.keras.Model, a SavedModel directory, a .pb/.pbtxt or .keras/.h5 path or "
        "'builtin:NAME'")


# -- GraphDef, MetaGraphDef, files ------------------------------------------------------------------

def _from_graph_def(graph_def: graph_pb2.GraphDef, requested: tuple[str, ...],
                    default_fetches: tuple[str, ...], description: str,
                    inlining: _Inlining) -> LoadedGraph:
    """`graph_def` is already a private copy here: it may be rewritten in place."""
    _check_graph_def(graph_def, description)
    return _finish(graph_def, requested or default_fetches, _feeds_of_graph_def(graph_def), {},
                   description, inlining)


def _from_meta_graph_def(meta_graph: meta_graph_pb2.MetaGraphDef, requested: tuple[str, ...],
                         description: str, inlining: _Inlining) -> LoadedGraph:
    graph_def = graph_pb2.GraphDef()
    graph_def.CopyFrom(meta_graph.graph_def)
    default_fetches: tuple[str, ...] = ()
    if "train_op" in meta_graph.collection_def:
        collection = meta_graph.collection_def["train_op"]
        default_fetches = tuple(op_name(name) for name in collection.node_list.value)
    return _from_graph_def(graph_def, requested, default_fetches, description, inlining)


def _from_path(path: str, requested: tuple[str, ...], signature_key: str | None,
               inlining: _Inlining) -> LoadedGraph:
    if not os.path.exists(path):
        raise errors.InvalidGraphError(
            f"{path!r} does not exist; pass a SavedModel directory, a .pb/.pbtxt GraphDef or "
            "MetaGraphDef file, a .keras/.h5 Keras model, or 'builtin:NAME'")
    if os.path.isdir(path):
        if not any(os.path.exists(os.path.join(path, name))
                   for name in ("saved_model.pb", "saved_model.pbtxt")):
            raise errors.InvalidGraphError(
                f"directory {path!r} holds no saved_model.pb, so it is not a SavedModel; pass the "
                "SavedModel directory itself, or a .pb/.pbtxt GraphDef file")
        return _from_saved_model_dir(path, requested, signature_key, inlining)
    if path.lower().endswith(_KERAS_SUFFIXES):
        return _from_keras_model(_load_keras_file(path), requested, inlining)
    if os.path.basename(path) in ("saved_model.pb", "saved_model.pbtxt"):
        return _from_saved_model_dir(os.path.dirname(path) or ".", requested, signature_key,
                                     inlining)
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise errors.InvalidGraphError(
            f"cannot read {path!r}: {error.strerror}; check the path and its permissions") from None
    parsed = parse_graph_file(data, prefer_text=path.lower().endswith(_TEXT_SUFFIXES))
    if parsed is None:
        raise errors.InvalidGraphError(
            f"{path!r} is neither a binary nor a text GraphDef or MetaGraphDef (or it names ops "
            "this TensorFlow does not know); write it with tf.io.write_graph or "
            "graph_def.SerializeToString(), and load any custom op library first")
    kind, proto = parsed
    description = f"{kind} file {path}"
    if isinstance(proto, meta_graph_pb2.MetaGraphDef):
        return _from_meta_graph_def(proto, requested, description, inlining)
    return _from_graph_def(proto, requested, (), description, inlining)


_KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")


def _load_keras_file(path: str):
    """A Keras model saved with model.save (compiled when it was saved compiled)."""
    try:
        return tf.keras.models.load_model(path)
    except Exception as error:  # Keras raises ValueError, OSError, TypeError ... for a bad file
        raise errors.InvalidGraphError(
            f"cannot load the Keras model {path!r}: {errors.first_line(error)}; write it with "
            "model.save(path), and load custom layers' modules first") from None


# -- functions, Keras, SavedModel ---------------------------------------------------------------------

def _from_concrete_function(function, requested: tuple[str, ...], description: str,
                            inlining: _Inlining) -> LoadedGraph:
    graph_def, variable_values = captures.self_contained_graph_def(function)
    captured = {tensor.ref() for tensor in function.graph.internal_captures}
    feeds = tuple((tensor.op.name, _shape_list(tensor.shape), tensor.dtype.name)
                  for tensor in function.inputs if tensor.ref() not in captured)
    default_fetches = tuple(dict.fromkeys(tensor.op.name for tensor in function.outputs
                                          if tensor is not None))
    if not default_fetches:
        # A function that returns nothing still has its side effects as control outputs.
        default_fetches = tuple(dict.fromkeys(op.name for op in function.graph.control_outputs))
    return _finish(graph_def, requested or default_fetches, feeds, variable_values, description,
                   inlining)


def _concrete_function_of(function) -> Any:
    try:
        return function.get_concrete_function()
    except (TypeError, ValueError):
        pass
    traced = list(function._list_all_concrete_functions())  # no public listing exists in 2.15
    if len(traced) == 1:
        return traced[0]
    raise errors.InvalidGraphError(
        f"tf.function {getattr(function, '__name__', function)!r} has no input_signature and "
        f"{len(traced)} traces; give it an input_signature, or pass "
        "fn.get_concrete_function(tf.TensorSpec(...)) instead")


def _function_description(function) -> str:
    name = getattr(function, "name", "?")
    if isinstance(name, bytes):
        name = name.decode()
    return f"ConcreteFunction {name}"


def load_saved_model(path: str):
    """`tf.saved_model.load(path)`, with InvalidGraphError for a SavedModel that cannot load."""
    try:
        return tf.saved_model.load(path)
    except Exception as error:  # SavedModel loading raises many unrelated types
        raise errors.InvalidGraphError(
            f"cannot load the SavedModel in {path!r} ({type(error).__name__}: "
            f"{errors.first_line(error)}); check it was written by tf.saved_model.save and that any "
            "custom op library is loaded") from None


def _from_saved_model_dir(path: str, requested: tuple[str, ...], signature_key: str | None,
                          inlining: _Inlining) -> LoadedGraph:
    return _from_loaded_saved_model(load_saved_model(path), requested, signature_key,
                                    f"SavedModel {path}", inlining)


def _from_loaded_saved_model(loaded, requested: tuple[str, ...], signature_key: str | None,
                             description: str, inlining: _Inlining) -> LoadedGraph:
    key = signature_key or "serving_default"
    signatures = getattr(loaded, "signatures", {}) or {}
    if key not in signatures:
        available = ", ".join(repr(name) for name in sorted(signatures)) or "none"
        raise errors.InvalidGraphError(
            f"{description} has no signature {key!r} (signatures: {available}); pass "
            "signature_key=, or save the model with signatures={...}")
    # `loaded` owns the variables the signature captures: keep it alive until values are read.
    function = signatures[key]
    return _from_concrete_function(function, requested, f"{description} signature {key!r}",
                                   inlining)


def _from_keras_model(model, requested: tuple[str, ...], inlining: _Inlining) -> LoadedGraph:
    with keras_step.traced_step(model) as (function, description):
        # Inside the block: the variables are read while the step's optimizer lives.
        return _from_concrete_function(function, requested, description, inlining)


# -- built-in graphs ------------------------------------------------------------------------------

def build_builtin(name: str) -> tuple[Any, int]:
    """The built-in graph `name` (`tfplaceto.graph.builtin.build`): (its compiled Keras model,
    its default batch size). `import_graph` and `load_source("builtin:NAME")` both build here."""
    try:
        return builtin.build(name)
    except errors.TfplacetoError:
        raise
    except (KeyError, ValueError) as error:
        raise errors.InvalidGraphError(
            f"unknown built-in graph {name!r} ({errors.first_line(error)}); run `tfplaceto models` to "
            "list them") from None


def _from_builtin(name: str, requested: tuple[str, ...], signature_key: str | None,
                  inlining: _Inlining) -> LoadedGraph:
    model, _ = build_builtin(name)  # import_graph takes the default batch size from build_builtin
    loaded = load_source(model, requested or None, signature_key=signature_key,
                         lower_control_flow=inlining.lower_control_flow,
                         device_type=inlining.device_type)
    return dataclasses.replace(loaded, description=f"built-in graph {name!r} ({loaded.description})")


# -- shared finishing steps -------------------------------------------------------------------------

def _finish(graph_def: graph_pb2.GraphDef, fetches: Sequence[str], feeds: Sequence[Feed],
            variable_values: Mapping[str, np.ndarray], description: str,
            inlining: _Inlining) -> LoadedGraph:
    """Inlines calls (choosing among alternatives, `_select_implementations`), then checks
    fetches and feeds against the final graph."""
    before = {node.name for node in graph_def.node}
    keep = [name for name in fetches if name in before]
    choices: tuple = ()
    if implementations.has_swappable(graph_def):
        graph_def, choices = _select_implementations(graph_def, keep, inlining)
    graph_def = inline_functions(graph_def, keep=keep, lower_control_flow=inlining.lower_control_flow)
    names = {node.name for node in graph_def.node}
    resolved = _resolve_fetches(fetches, names)
    feeds = tuple(feed for feed in feeds if feed[0] in names)
    variable_values = {name: value for name, value in variable_values.items() if name in names}
    return LoadedGraph(graph_def, resolved, feeds, variable_values, description, choices)


def _select_implementations(graph_def: graph_pb2.GraphDef, keep: Sequence[str],
                            inlining: _Inlining) -> tuple[graph_pb2.GraphDef, tuple]:
    """graph_def with each swappable call (a Keras LSTM/GRU) pointed at the alternative for
    inlining.device_type, and the choices; the caller inlines. Only calls in graph_def.node are
    swapped by grappler's implementation selector (a Keras model's training step or forward
    pass has its layers' calls there); calls inside other functions' bodies (a SavedModel's
    signature calling the model) are swapped where the alternatives have the same signature
    (`implementations.select`)."""
    return implementations.select(graph_def, inlining.device_type)


def _normalize_fetches(fetches) -> tuple[str, ...]:
    if fetches is None:
        return ()
    if isinstance(fetches, (str, bytes)) or hasattr(fetches, "name"):
        fetches = [fetches]
    try:
        return tuple(dict.fromkeys(_name_of(item) for item in fetches))
    except TypeError:
        raise errors.InvalidGraphError(
            f"fetches must be op or tensor names (or a list of them), not {fetches!r}") from None


def _name_of(item) -> str:
    if isinstance(item, bytes):
        item = item.decode()
    if not isinstance(item, str):
        name = getattr(item, "name", None)
        if not isinstance(name, str):
            raise TypeError(item)
        item = name
    return op_name(item)




def _resolve_fetches(fetches: Sequence[str], names: set[str]) -> tuple[str, ...]:
    missing = [name for name in fetches if name not in names]
    if missing:
        name = missing[0]
        nearby = difflib.get_close_matches(name, sorted(names), n=5, cutoff=0.4)
        hint = (f"nearby names: {', '.join(repr(n) for n in nearby)}" if nearby
                else "list the graph's op names with [n.name for n in graph_def.node]")
        raise errors.InvalidGraphError(
            f"fetch {name!r} is not an op of the graph ({len(missing)} missing fetch(es)); {hint}")
    return tuple(dict.fromkeys(fetches))


def _check_graph_def(graph_def: graph_pb2.GraphDef, description: str) -> None:
    """Structural checks a GraphDef from outside must pass before anything else looks at it."""
    if not graph_def.node:
        raise errors.InvalidGraphError(f"{description} has no nodes; nothing to place")
    names: set[str] = set()
    for node in graph_def.node:
        if not node.name or not node.op:
            raise errors.InvalidGraphError(
                f"{description} has a node without a name or op ({node.name!r}, {node.op!r}); "
                "the graph is corrupt")
        if node.name in names:
            raise errors.InvalidGraphError(
                f"{description} has two nodes named {node.name!r}; node names must be unique")
        names.add(node.name)
    functions = {function.signature.name for function in graph_def.library.function}
    for node in graph_def.node:
        if node.op not in functions and not op_is_registered(node.op):
            raise errors.InvalidGraphError(
                f"{description}: node {node.name!r} has op type {node.op!r}, which TensorFlow "
                f"{tf.__version__} does not know; load its op library (tf.load_op_library) first")
        for tensor in node.input:
            if op_name(tensor) not in names:
                raise errors.InvalidGraphError(
                    f"{description}: node {node.name!r} reads {tensor!r}, which is not in the "
                    "graph; the graph is incomplete (was it pruned or truncated?)")


def _feeds_of_graph_def(graph_def: graph_pb2.GraphDef) -> tuple[Feed, ...]:
    feeds = []
    for node in graph_def.node:
        if node.op != "Placeholder":
            continue
        shape = tf.TensorShape(node.attr["shape"].shape) if "shape" in node.attr else \
            tf.TensorShape(None)
        feeds.append((node.name, _shape_list(shape), tf.as_dtype(node.attr["dtype"].type).name))
    return tuple(feeds)


# -- small helpers ----------------------------------------------------------------------------------





def _shape_list(shape: tf.TensorShape) -> list[int | None] | None:
    return None if shape.rank is None else shape.as_list()


