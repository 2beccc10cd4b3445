"""Running a (placed) GraphDef for real in a TF1 Session: random feeds, variables, fetches.

- `random_feeds(graph_def, seed)`: a value of the right shape and dtype for every placeholder.
- `run_graph(...)`: imports a GraphDef, initializes its variables, runs its fetches `runs` times
  with soft placement off (so the devices written by `apply_placement` are the ones used) and
  returns the last outputs, the variables after the run, and the wall time of each run.
Tests use it to check a placed graph computes what the original computes; `tp.measure` uses it
to time placements.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

import numpy as np

from tfplaceto import errors


def random_feeds(graph_def, seed: int = 0) -> dict[str, np.ndarray]:
    """placeholder name -> random value (shapes must be known: import fills the batch size)."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    feeds = {}
    for node in graph_def.node:
        if node.op != "Placeholder":
            continue
        dtype = tf.dtypes.as_dtype(node.attr["dtype"].type)
        if dtype in (tf.resource, tf.variant):
            continue
        shape = [d.size for d in node.attr["shape"].shape.dim]
        if any(d < 0 for d in shape):
            raise errors.InvalidGraphError(
                f"placeholder {node.name!r} has an unknown dimension; import with batch_size=N")
        if dtype == tf.string:
            feeds[node.name] = rng.integers(0, 1000, shape).astype(str).astype(object)
        elif dtype == tf.bool:
            feeds[node.name] = rng.random(shape) < 0.5
        elif dtype.is_integer:
            # Small non-negative integers: valid class labels and token ids for any vocabulary.
            feeds[node.name] = rng.integers(0, 2, shape).astype(dtype.as_numpy_dtype)
        else:
            feeds[node.name] = rng.standard_normal(shape).astype(dtype.as_numpy_dtype)
    return feeds


@dataclasses.dataclass(frozen=True)
class RunResult:
    outputs: dict[str, list[np.ndarray]]  # fetch op name -> its output values
    variables: dict[str, np.ndarray]  # VarHandleOp name -> value after the runs
    run_times_s: list[float]
    step_stats: list  # RunMetadata.step_stats of each traced run (empty without tracing)


def run_graph(graph_def, fetches: Sequence[str], config=None, variable_values: Mapping[str, np.ndarray] | None = None,
              feeds: Mapping[str, np.ndarray] | None = None, runs: int = 1, warmup: int = 0,
              trace: bool = False) -> RunResult:
    """Runs graph_def's fetches; see the module docstring. `config` is a ConfigProto."""
    import tensorflow as tf

    from tfplaceto.graph.sources import initialize_variables

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    feeds = random_feeds(graph_def) if feeds is None else feeds
    feed_dict = {graph.get_tensor_by_name(f"{name}:0"): value for name, value in feeds.items()}
    fetch_ops = [graph.get_operation_by_name(f) for f in fetches]
    fetch_tensors = {op.name: list(op.outputs) for op in fetch_ops}
    variables = [op for op in graph.get_operations() if op.type == "VarHandleOp"]
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE) if trace else None
    times, stats = [], []
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        initialize_variables(session, graph, dict(variable_values or {}))
        with graph.as_default():
            reads = {op.name: tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=op.get_attr("dtype"))
                     for op in variables if op.name in (variable_values or {})}
        for _ in range(warmup):
            session.run([fetch_tensors, fetch_ops], feed_dict)
        for _ in range(runs):
            metadata = tf.compat.v1.RunMetadata() if trace else None
            start = time.perf_counter()
            values, _ = session.run([fetch_tensors, fetch_ops], feed_dict, options=options, run_metadata=metadata)
            times.append(time.perf_counter() - start)
            if trace:
                stats.append(metadata.step_stats)
        after = session.run(reads) if reads else {}
    return RunResult(values, after, times, stats)
