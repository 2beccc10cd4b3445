"""Grappler's function inlining: every function call of a GraphDef becomes ordinary nodes.

  inline_functions       grappler's "function" optimizer, alone: inlines calls, nested ones too
                         (and, by default, lowers functional While/If/Case to Switch/Merge/Enter/
                         Exit like the TF runtime does before placement); checks no call is left.
  strip_no_inline_attrs  drops what stops grappler from inlining a call: XLA and "_noinline"
                         attributes, and the "api_implements" marker of swappable functions once
                         `tfplaceto.graph.implementations` has chosen one.
  FUNCTIONAL_CONTROL_FLOW_OPS  the ops lowering rewrites.
  run_grappler           grappler's meta optimizer on a GraphDef, pruning nothing, with a clear
                         error (also runs `implementations`' selector).
"""

from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2

from tfplaceto import errors
from tfplaceto.graph.node_defs import CALL_OPS, sinks

FUNCTIONAL_CONTROL_FLOW_OPS = frozenset(
    {"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase"})


# Attributes that stop grappler from inlining a call (XLA clusters are compiled as one unit, and
# "_noinline" asks for exactly that); we place op by op, so they are dropped before inlining.
_NO_INLINE_ATTRS = ("_XlaMustCompile", "_XlaCompile", "_XlaScope", "_XlaSeparateCompiledGradients",
                    "_noinline")


# Functions with "api_implements" are alternatives the implementation selector may swap at run time
# (Keras LSTM/GRU: a portable While-loop version and a CuDNN one); grappler never inlines them.
# `implementations.select` first points each call at the alternative for the target device type
# (or leaves the called one); then the marker is dropped so the chosen version is inlined.
_SWAPPABLE_FUNCTION_ATTRS = ("api_implements", "api_preferred_device")


def run_grappler(graph_def: graph_pb2.GraphDef, config: config_pb2.ConfigProto, keep: Iterable[str],
                 action: str, advice: str) -> graph_pb2.GraphDef:
    """grappler's meta optimizer, set up by `config`, on a copy of graph_def.

    Every sink of the graph and every node named in `keep` goes to the fetch list, so grappler
    prunes nothing the caller may want. A failure raises InvalidGraphError "could not <action>
    (<what grappler said>); <advice>".
    """
    from tensorflow.python.grappler import tf_optimizer  # private module: import where used

    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.graph_def.CopyFrom(graph_def)
    # Grappler keeps the nodes of the "train_op" collection (its fetch list).
    keep_names = list(dict.fromkeys([*keep, *sinks(graph_def)]))
    meta_graph.collection_def["train_op"].node_list.value.extend(keep_names)
    try:
        return tf_optimizer.OptimizeGraph(config, meta_graph, verbose=False)
    except Exception as error:  # grappler raises assorted internal error types
        raise errors.InvalidGraphError(
            f"could not {action} ({type(error).__name__}: {errors.first_line(error)}); {advice}") from None


def inline_functions(graph_def: graph_pb2.GraphDef, keep: Iterable[str] = (),
                     lower_control_flow: bool = True) -> graph_pb2.GraphDef:
    """Returns a copy of `graph_def` with every function call inlined (nested calls too).

    Uses grappler's "function" optimizer alone, once. `keep` names nodes that must survive (the
    graph's sinks are always kept, so nothing is pruned). With lower_control_flow, functional
    While/If/Case become Switch/Merge/Enter/Exit/NextIteration, as in the TF runtime.
    Raises InvalidGraphError if grappler fails or a call is left.
    """
    copy = graph_pb2.GraphDef()
    copy.CopyFrom(graph_def)
    graph_def = copy
    library_functions = {function.signature.name for function in graph_def.library.function}
    ops = {node.op for node in graph_def.node}
    needs_rewrite = bool(ops & CALL_OPS or ops & library_functions
                         or (lower_control_flow and ops & FUNCTIONAL_CONTROL_FLOW_OPS))
    if not needs_rewrite:
        return graph_def
    strip_no_inline_attrs(graph_def)

    config = config_pb2.ConfigProto()
    if not lower_control_flow:
        # The meta optimizer lowers control flow unless the executor is the single-threaded one
        # (which cannot run lowered loops); that is the only switch grappler exposes for it.
        config.experimental.executor_type = "SINGLE_THREADED_EXECUTOR"
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers[:] = ["function"]
    rewrite.min_graph_nodes = -1  # optimize small graphs too
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    optimized = run_grappler(
        graph_def, config, keep, "inline the graph's function calls",
        f"check that the graph runs in TensorFlow {tf.__version__} and that every custom op library is loaded")

    remaining_functions = {function.signature.name for function in optimized.library.function}
    left = [node for node in optimized.node
            if node.op in CALL_OPS or node.op in remaining_functions]
    if left:
        sample = ", ".join(f"{node.name} ({node.op})" for node in left[:5])
        raise errors.InvalidGraphError(
            f"{len(left)} function call(s) could not be inlined: {sample}; tfplaceto places op "
            "by op and needs call-free graphs (calls that grappler refuses to inline are usually "
            "recursive functions or functions with a custom gradient registered by name)")
    return optimized


def strip_no_inline_attrs(graph_def: graph_pb2.GraphDef) -> None:
    for node in graph_def.node:
        for attr in _NO_INLINE_ATTRS:
            node.attr.pop(attr, None)
    for function in graph_def.library.function:
        for attr in (*_NO_INLINE_ATTRS, *_SWAPPABLE_FUNCTION_ATTRS):
            function.attr.pop(attr, None)
        for node in function.node_def:
            for attr in _NO_INLINE_ATTRS:
                node.attr.pop(attr, None)
