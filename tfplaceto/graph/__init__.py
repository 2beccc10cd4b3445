"""Graphs: import from every TensorFlow source into an OpGraph, and grouping.

- `op_graph.py`: the OpGraph arrays (the one data structure of the later stages).
- `sources.py`: any source (GraphDef, MetaGraphDef, tf.Graph, ConcreteFunction, Keras model,
  SavedModel, .pb/.pbtxt path) -> a self-contained GraphDef with function calls inlined: the
  dispatch. `keras_step.py` traces a Keras model's training step (or forward pass);
  `captures.py` makes a ConcreteFunction self-contained; `inlining.py` inlines function calls
  with grappler; `graph_file.py` tells which proto a .pb/.pbtxt file holds.
- `from_graph_def.py`: GraphDef -> OpGraph (shapes, bytes, kernels, colocation, memory);
  `node_defs.py`: the NodeDef helpers the others share (inputs, fetch names, sinks, calls).
- `implementations.py`: which alternative of a Keras LSTM/GRU (cuDNN kernel or standard loop)
  the import keeps for the target device type.
- `loops.py`: while-loop frames and their trip counts (how often a loop body runs per step);
  `loop_shapes.py`: a loop body's shapes written into the GraphDef; `static_values.py`: the
  integer values and TensorList facts TensorFlow can know before running.
- `grouping.py`: OpGraph -> acyclic grouped OpGraph of at most a few hundred groups, cut from
  the layer-keeping topological order of `scoped_order.py`.
- `builtin.py`: the built-in benchmark graphs and graph families (`"builtin:NAME"`), built by
  `builtin_models.py` and `builtin_families.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tfplaceto import checks
from tfplaceto.cluster import as_cluster
from tfplaceto.graph import implementations
from tfplaceto.graph.from_graph_def import op_graph_from_graph_def
from tfplaceto.graph.grouping import DEFAULT_MAX_GROUPS, Grouping, group
from tfplaceto.graph.loops import LoopFrame, LoopIterations
from tfplaceto.graph.op_graph import DEVICE_TYPES, OpGraph, make_op_graph

BUILTIN_PREFIX = "builtin:"


def import_graph(source, fetches: Sequence[str] | str | None = None,
                 batch_size: int | None = None, loop_iterations: LoopIterations = None,
                 cluster=None) -> OpGraph:
    """Imports a TensorFlow computation as an OpGraph.

    Args:
      source: a GraphDef, MetaGraphDef, tf.Graph, ConcreteFunction, tf.keras.Model (compiled: its
        whole training step; uncompiled: its forward pass), a SavedModel directory, a .pb/.pbtxt
        path, or "builtin:NAME" (see `tfplaceto models`).
      fetches: op or tensor names the step computes; default: the source's outputs or sinks.
      batch_size: fills unknown batch dimensions (built-in graphs have their own default).
      loop_iterations: iterations of while loops (Keras LSTM/GRU, tf.while_loop) whose count is
        not static: an int for every such loop, or a dict loop frame name -> iterations (the
        names are in `op_graph.loop_report()` and in the warning for an assumed count).
      cluster: the Cluster (or preset name) the graph will run on. A Keras LSTM/GRU has two
        implementations that TensorFlow picks between by the device type it runs on: with a
        GPU in the cluster its cuDNN kernel is kept, else its standard while loop; without a
        cluster, the standard one (what the graph calls). `op_graph.implementation_report()`
        says which.

    Raises:
      InvalidGraphError: the source cannot be read, has unknown sizes, a cycle or a bad fetch.
    """
    # Imported here: sources and builtin load TensorFlow, and `tfplaceto.graph` (OpGraph, grouping)
    # serves the simulator and the baselines without it.
    from tfplaceto.graph import sources

    if isinstance(source, str) and source.startswith(BUILTIN_PREFIX):
        source, default_batch = sources.build_builtin(source[len(BUILTIN_PREFIX):])
        batch_size = batch_size or default_batch
    checks.check_batch_size(batch_size)
    if cluster is not None:
        cluster = as_cluster(cluster)
    device_type = None if cluster is None else implementations.target_device_type(cluster)
    loaded = sources.load_source(source, fetches=fetches, device_type=device_type)
    op_graph = op_graph_from_graph_def(loaded.graph_def, loaded.fetches or None, batch_size,
                                       loaded.variable_values, output_fetches=_output_fetches(fetches),
                                       loop_iterations=loop_iterations)
    if loaded.implementations:
        op_graph = dataclasses.replace(op_graph, implementations=loaded.implementations)
    return op_graph


def _output_fetches(fetches) -> tuple[tuple[str, int], ...]:
    """(op name, output index) of every fetch named as a tensor ("x:1"), to check the index."""
    if fetches is None:
        return ()
    items = [fetches] if isinstance(fetches, str | bytes) else fetches
    result = []
    for item in items if isinstance(items, list | tuple) else ():
        name = item.decode() if isinstance(item, bytes) else item
        if isinstance(name, str):
            head, _, tail = name.lstrip("^").rpartition(":")
            if head and tail.isdigit():
                result.append((head, int(tail)))
    return tuple(result)


__all__ = ["DEFAULT_MAX_GROUPS", "DEVICE_TYPES", "Grouping", "LoopFrame", "OpGraph", "group", "import_graph",
           "make_op_graph", "op_graph_from_graph_def"]
