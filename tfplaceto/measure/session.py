"""Running a (placed) GraphDef for real in a TF1 Session: random feeds, variables, fetches.

- `random_feeds(graph_def, seed)`: a value of the right shape and dtype for every placeholder.
- `run_graph(...)`: imports a GraphDef, initializes its variables, runs its fetches `runs` times
  with soft placement off (so the devices written by `apply_placement` are the ones used) and
  returns the last outputs, the variables after the run, and the wall time of each run.
- `inputs_as_variables(graph_def, feeds)`: each fed placeholder turned into a read of a variable
  holding its value, so a timed step does not ship its inputs from the client.
- `run_placed(...)`: runs a placed GraphDef on any Session target (in-process or grpc://) and
  times `runs` steps; every variable gets a value (the known one, else a small random one).
- `initialize_variables(session, graph, values)`: the known values assigned to an imported
  graph's VarHandleOps; `initialize_all_variables` also gives every other variable a small
  random value (the measured cost profile, `run_placed`).
Tests use `run_graph` to check a placed graph computes what the original computes; `tp.measure`
and `tp.calibrate_links` use `run_placed` to time placements.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from tfplaceto import errors

_INPUT_SUFFIX = "/tfplaceto_input"
_VARIABLE_TYPES = ("VarHandleOp", "VariableV2")


def random_feeds(graph_def, seed: int = 0) -> dict[str, np.ndarray]:
    """placeholder name -> random value (shapes must be known: import fills the batch size)."""
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


def inputs_as_variables(graph_def, feeds: Mapping[str, np.ndarray]):
    """(copy of graph_def, variable values): each fed Placeholder `p` reads a variable instead.

    `p` becomes a ReadVariableOp (same name, device and output) of a new VarHandleOp
    `p/tfplaceto_input` on the same device, whose value is the feed. A training loop's inputs
    come from an input pipeline on the worker; feeding them from the client each step would
    add a client-to-device copy to the step time that the placement is not responsible for.
    """
    result = tf.compat.v1.GraphDef()
    result.CopyFrom(graph_def)
    values = {}
    for node in list(result.node):
        if node.op != "Placeholder" or node.name not in feeds:
            continue
        value = np.asarray(feeds[node.name])
        dtype = node.attr["dtype"].type
        handle = result.node.add(name=node.name + _INPUT_SUFFIX, op="VarHandleOp", device=node.device)
        handle.attr["dtype"].type = dtype
        handle.attr["shape"].shape.CopyFrom(tf.TensorShape(value.shape).as_proto())
        handle.attr["shared_name"].s = handle.name.encode()
        handle.attr["container"].s = b""
        node.op = "ReadVariableOp"
        node.ClearField("input")
        node.input.append(handle.name)
        for key in list(node.attr):
            if key not in ("dtype", "_class"):
                del node.attr[key]
        values[handle.name] = value
    return result, values


def run_placed(graph_def, fetches: Sequence[str], target: str = "", config=None,
               variable_values: Mapping[str, np.ndarray] | None = None,
               feeds: Mapping[str, np.ndarray] | None = None, runs: int = 1, warmup: int = 0,
               trace: bool = False, seed: int = 0) -> RunResult:
    """Times `runs` steps of graph_def's fetch ops in a Session on `target` ("" = in-process).

    The fetch ops run as targets: their outputs stay on their devices, as the simulator assumes.
    Variables in `variable_values` get those values, any other variable a small random one.
    `feeds` default to `random_feeds`. tf.errors.OpError propagates (callers map it to typed
    errors with the target in the message). Returns a RunResult without outputs or variables.
    """
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    feeds = random_feeds(graph_def, seed) if feeds is None else feeds
    feed_dict = {graph.get_tensor_by_name(f"{name}:0"): value for name, value in feeds.items()}
    try:
        fetch_ops = [graph.get_operation_by_name(f) for f in fetches]
    except KeyError as e:
        raise errors.InvalidGraphError(f"fetch {e} is not an op of the graph") from None
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE) if trace else None
    times, stats = [], []
    with tf.compat.v1.Session(target, graph=graph, config=config) as session:
        initialize_all_variables(session, graph, dict(variable_values or {}), np.random.default_rng(seed))
        for _ in range(warmup):
            session.run(fetch_ops, feed_dict)
        for _ in range(runs):
            metadata = tf.compat.v1.RunMetadata() if trace else None
            start = time.perf_counter()
            session.run(fetch_ops, feed_dict, options=options, run_metadata=metadata)
            times.append(time.perf_counter() - start)
            if trace:
                stats.append(metadata.step_stats)
    return RunResult({}, {}, times, stats)


def initialize_variables(session: tf.compat.v1.Session, graph: tf.Graph,
                         variable_values: Mapping[str, np.ndarray],
                         import_scope: str = "") -> None:
    """Assigns each value to the VarHandleOp of that name in `graph`, running in `session`.

    `graph` is the tf.Graph the LoadedGraph's GraphDef was imported into; `import_scope` is the
    `name` given to tf.import_graph_def (its default is "import"; pass "" when it was imported
    with name=""). Values are fed through placeholders so the graph does not grow by their bytes.
    """
    if not variable_values:
        return
    feed_dict = {}
    assigns = []
    with graph.as_default(), tf.name_scope("tfplaceto_initialize_variables"):
        for name, value in variable_values.items():
            full_name = f"{import_scope}/{name}" if import_scope else name
            try:
                handle = graph.get_operation_by_name(full_name)
            except KeyError:
                raise errors.InvalidGraphError(
                    f"variable {full_name!r} is not an op of the graph; import the LoadedGraph's "
                    "graph_def into this graph (and pass import_scope if it was imported with a "
                    "name prefix)") from None
            if handle.type != "VarHandleOp":
                raise errors.InvalidGraphError(
                    f"{full_name!r} is a {handle.type}, not a VarHandleOp; variable_values must "
                    "come from the same LoadedGraph as the graph")
            value = np.asarray(value)
            placeholder = tf.compat.v1.placeholder(handle.get_attr("dtype"), value.shape)
            assigns.append(tf.raw_ops.AssignVariableOp(resource=handle.outputs[0],
                                                       value=placeholder))
            feed_dict[placeholder] = value
    session.run(assigns, feed_dict=feed_dict)


def initialize_all_variables(session: tf.compat.v1.Session, graph: tf.Graph,
                             variable_values: Mapping[str, np.ndarray], rng: np.random.Generator) -> None:
    """Initializes every variable of `graph`: known values where given (`initialize_variables`),
    small random floats (zeros for other dtypes) elsewhere, each assign colocated with its
    variable (an unplaced assign could land on another task)."""
    variables = [op for op in graph.get_operations() if op.type in ("VarHandleOp", "VariableV2", "Variable")]
    known = {op.name: variable_values[op.name] for op in variables
             if op.name in variable_values and op.type == "VarHandleOp"}
    initialize_variables(session, graph, known)
    assigns, feed_dict = [], {}
    with graph.as_default(), tf.name_scope("tfplaceto_random_init"):
        for op in variables:
            if op.name in known:
                continue
            dtype = tf.dtypes.as_dtype(op.get_attr("dtype")).base_dtype
            shape = tf.TensorShape(op.get_attr("shape"))
            dims = [d if d is not None else 1 for d in shape.as_list()] if shape.rank is not None else []
            if dtype.is_floating:
                value = (rng.standard_normal(dims) * 0.1).astype(dtype.as_numpy_dtype)
            else:
                value = np.zeros(dims, dtype.as_numpy_dtype)
            placeholder = tf.compat.v1.placeholder(dtype, value.shape)
            with graph.colocate_with(op):
                if op.type == "VarHandleOp":
                    assigns.append(tf.raw_ops.AssignVariableOp(resource=op.outputs[0], value=placeholder))
                else:
                    assigns.append(tf.compat.v1.assign(op.outputs[0], placeholder, validate_shape=False))
            feed_dict[placeholder] = value
    if assigns:
        session.run(assigns, feed_dict=feed_dict)
