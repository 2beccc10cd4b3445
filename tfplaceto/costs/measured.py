"""Measured cost profiles: every op's real compute time, traced on this machine's devices.

`measured_profile(op_graph, cluster)` runs the graph in a `tf.compat.v1.Session` once per device
kind of the cluster, with every node on a local device of that kind, and reads each op's time from
the full trace (RunMetadata step stats): the median over `runs` traced steps, after `warmup`
untraced ones.

Map of the file:
  measured_profile     one session per device kind -> a CostProfile.
  traced_steps         the step stats of traced steps, one op at a time.
  local_device_of      the local TensorFlow device standing for a device kind (or None).
  _session_config      the cluster's session config, made suitable for per-op timing.
  _import_on_device    the GraphDef imported with every node placed (CPU fallback where needed).
  _initialize          variables: known values (measure.session.initialize_all_variables), else random ones.
  _random_feeds        a value of the right shape and dtype for every placeholder.
  op_seconds          per node seconds of one traced step.
  op_executions, check_loop_trips  executions per node; each top-level loop's measured trips
                      against the graph's (a warning when they differ).

Measurement choices (each keeps an op's measured time its own):
- grappler and the classic graph optimizer are off, so no op is folded, fused or renamed
  (a remapper fusion would otherwise book a Conv2D's time under its Relu's name);
- ops run one at a time (every traced step in the caller's thread, `traced_steps`) so
  concurrent ops do not share the cores: the simulator models a device as running one op at a
  time at its full speed;
- placement is explicit and soft placement is off; on a GPU kind, ops whose colocation group has
  no GPU kernel run on the host CPU (as TensorFlow would have to), and their time is recorded;
- ops absent from the trace (never executed, e.g. a dead branch) get 0 s and are counted in
  `source`; fed placeholders are traced as `_arg_<name>_0_<i>` and mapped back.
"""

from __future__ import annotations

import re

import numpy as np

from tfplaceto import errors
from tfplaceto.cluster import DEVICE_TYPES, Cluster, as_cluster, session_config
from tfplaceto.costs.cost_profile import CostProfile, profiled_graph_def
from tfplaceto.graph.from_graph_def import colocated_kernels
from tfplaceto.graph.op_graph import OpGraph
from tfplaceto.measure.session import initialize_all_variables

_HOST_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
_ARG_NAME = re.compile(r"^_arg_(?P<name>.+)_\d+_\d+$")
_VARIABLE_TYPES = ("VarHandleOp", "VariableV2", "Variable")
_COMPUTE_DEVICE = re.compile(r"/device:(CPU|GPU):\d+$")
_DEVICE_KEY = re.compile(r"(CPU|GPU|cpu|gpu):\d+")


def measured_profile(op_graph: OpGraph, cluster: Cluster | str, runs: int = 5,
                     warmup: int = 2) -> CostProfile:
    """Per-op compute seconds measured on the local devices of each device kind of `cluster`.

    Args:
      op_graph: an OpGraph with its GraphDef (not a grouped graph).
      cluster: a Cluster or a name ("local:2"); each of its device kinds must exist here.
      runs: traced steps; each op's time is the median over them.
      warmup: untraced steps first (kernel selection, allocator growth, oneDNN priming).

    Raises:
      CostProfileError: a device kind is not present on this machine (e.g. "GPU:V100" presets on
        a CPU-only machine), bad runs/warmup, or the graph fails to run.
    """
    cluster = as_cluster(cluster)
    profiled_graph_def(op_graph)  # a grouped graph fails here
    if not isinstance(runs, int) or runs < 1 or not isinstance(warmup, int) or warmup < 0:
        raise errors.CostProfileError(
            f"need runs >= 1 and warmup >= 0, got runs={runs!r}, warmup={warmup!r}")
    targets = {kind: local_device_of(kind) for kind in cluster.kinds}
    absent = [kind for kind, device in targets.items() if device is None]
    if absent:
        raise errors.CostProfileError(
            f"measured profiles need the devices: this machine has no {', '.join(absent)} device "
            f"(cluster {cluster.name!r}); use source='analytical' for presets and other clusters "
            "you do not have")

    index = {name: i for i, name in enumerate(op_graph.names)}
    compute = np.zeros((op_graph.num_ops, len(cluster.kinds)))
    untraced = np.zeros(op_graph.num_ops, bool)
    config = _session_config(cluster)
    for k, kind in enumerate(cluster.kinds):
        samples = np.zeros((runs, op_graph.num_ops))
        seen = np.zeros(op_graph.num_ops, bool)
        for r, step_stats in enumerate(traced_steps(op_graph, targets[kind], config, runs, warmup)):
            if r == 0 and k == 0 and op_graph.loops:
                check_loop_trips(op_graph, op_executions(step_stats))
            for name, seconds in op_seconds(step_stats).items():
                i = index.get(name)
                if i is not None:
                    samples[r, i] = seconds
                    seen[i] = True
        compute[:, k] = np.median(samples, axis=0)
        untraced |= ~seen
    source = f"measured (median of {runs} runs"
    if untraced.any():
        source += f", {int(untraced.sum())} ops not traced"
    source += ")"
    return CostProfile(tuple(op_graph.names), cluster.kinds, compute, source, op_graph.fingerprint())


def traced_steps(op_graph: OpGraph, device: str, config, runs: int, warmup: int) -> list:
    """The step stats of `runs` fully traced steps of the graph with every node on `device`
    (`_import_on_device`), after `warmup` untraced ones, in a Session with `config`.

    Every step runs in the caller's thread (RunOptions.inter_op_thread_pool = -1): one op at a
    time, strictly. inter_op_parallelism_threads=1 alone does not do that: the step stats show
    TensorFlow's executor still running two ops at once (its pool's thread and, as we read it,
    a thread running ready inexpensive ops inline), and a traced op time then includes sharing
    the cores with the other one.
    A while loop's parallel iterations offer many such pairs: on local:2 the same [32, 128] x
    [128, 512] MatMul was traced at a median 898 us per execution in a loop body against 465 us
    unrolled (200 vs 127 ms of the step with two ops overlapping), 344 vs 356 us in the caller's
    thread. Raises CostProfileError if the graph fails to run.
    """
    import tensorflow as tf

    graph_def = profiled_graph_def(op_graph)
    graph = _import_on_device(op_graph, graph_def, device)
    fetches = [graph.get_operation_by_name(name) for name in op_graph.fetches]
    rng = np.random.default_rng(0)
    serial = tf.compat.v1.RunOptions(inter_op_thread_pool=-1)
    traced = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE, inter_op_thread_pool=-1)
    result = []
    try:
        # Feeds first: initialization adds placeholders of its own.
        feeds = _random_feeds(graph, rng)
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            initialize_all_variables(session, graph, op_graph.variable_values, rng)
            for _ in range(warmup):
                session.run(fetches, feed_dict=feeds, options=serial)
            for _ in range(runs):
                metadata = tf.compat.v1.RunMetadata()
                session.run(fetches, feed_dict=feeds, options=traced, run_metadata=metadata)
                result.append(metadata.step_stats)
    except tf.errors.OpError as e:
        raise errors.CostProfileError(
            f"the graph failed to run on {device}: {errors.first_line(e)}; check that it runs in a "
            "plain tf.compat.v1.Session, or use source='analytical'") from None
    return result


def local_device_of(kind: str) -> str | None:
    """The local TensorFlow device that stands for a device kind, or None if there is none.

    "CPU:<anything>" is the first CPU. "GPU:<model>" is the first local GPU whose model name is
    the same or contains it ("V100" matches "Tesla_V100-SXM2-16GB"; "generic" matches any GPU).
    """
    import tensorflow as tf

    device_type, _, model = kind.partition(":")
    if device_type == "CPU":
        return _HOST_CPU
    if device_type != "GPU":
        return None
    for i, gpu in enumerate(tf.config.list_physical_devices("GPU")):
        try:
            details = tf.config.experimental.get_device_details(gpu)
        except (ValueError, RuntimeError):
            details = {}
        local_model = details.get("device_name", "gpu").replace(" ", "_")
        if model in ("", "generic") or model.lower() in local_model.lower():
            return f"/job:localhost/replica:0/task:0/device:GPU:{i}"
    return None


def _session_config(cluster: Cluster):
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto()
    config.CopyFrom(session_config(cluster))
    config.allow_soft_placement = False
    config.inter_op_parallelism_threads = 1
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    config.graph_options.optimizer_options.do_constant_folding = False
    config.graph_options.optimizer_options.do_common_subexpression_elimination = False
    config.gpu_options.allow_growth = True
    return config


def _import_on_device(op_graph: OpGraph, graph_def, device: str):
    """A tf.Graph of graph_def with every node on `device` (host CPU where it has no kernel)."""
    import tensorflow as tf

    placed = tf.compat.v1.GraphDef()
    placed.CopyFrom(graph_def)
    device_type = device.split("/device:")[1].split(":")[0]
    runnable = np.ones(op_graph.num_ops, bool)
    if device_type in DEVICE_TYPES:
        runnable = colocated_kernels(op_graph)[:, DEVICE_TYPES.index(device_type)]
    index = {name: i for i, name in enumerate(op_graph.names)}
    for node in placed.node:
        i = index.get(node.name)
        node.device = device if i is None or runnable[i] else _HOST_CPU
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(placed, name="")
    return graph


def _shape_list(shape) -> list[int | None]:
    import tensorflow as tf

    shape = tf.TensorShape(shape)
    return [] if shape.rank is None else shape.as_list()


def _random_feeds(graph, rng: np.random.Generator) -> dict:
    """A random value for every Placeholder (shapes are concrete after import_graph)."""
    import tensorflow as tf

    feeds = {}
    for op in graph.get_operations():
        if op.type != "Placeholder":
            continue
        dtype = tf.dtypes.as_dtype(op.get_attr("dtype")).base_dtype
        if dtype in (tf.resource, tf.variant):
            raise errors.CostProfileError(
                f"placeholder {op.name!r} has dtype {dtype.name}, which cannot be fed; import the "
                "graph with its captured resources as variables (tp.import_graph does)")
        dims = _shape_list(op.get_attr("shape"))
        if any(d is None for d in dims):
            raise errors.CostProfileError(
                f"placeholder {op.name!r} has an unknown shape; import the graph with batch_size=N")
        feeds[op.outputs[0]] = _random_value(dtype, dims, rng)
    return feeds


def _random_value(dtype, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    """Small random floats; zeros for integers (always a valid label, index or count)."""
    if dtype.is_floating or dtype.is_complex:
        return (rng.standard_normal(shape) * 0.1).astype(dtype.as_numpy_dtype)
    if dtype.name == "string":
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype=dtype.as_numpy_dtype)


def op_seconds(step_stats) -> dict[str, float]:
    """Seconds per node of one traced step, summed over its executions (loop bodies repeat).

    Entries of compute devices (".../device:CPU:0") are op times. A GPU's kernels are timed on its
    "stream:all" pseudo-device when the GPU tracer recorded them; the GPU's own entries are then
    only launch times and are ignored. Other pseudo-devices (single streams, memcpy, host
    tracer) repeat or add to these and are skipped.
    """
    by_device: dict[str, dict[str, float]] = {}
    for device_stats in step_stats.dev_stats:
        device = device_stats.device
        if not (_COMPUTE_DEVICE.search(device) or device.endswith("/stream:all")):
            continue
        times = by_device.setdefault(device, {})
        for node in device_stats.node_stats:
            if node.op_end_rel_nanos or node.all_start_nanos:
                seconds = (node.op_end_rel_nanos - node.op_start_rel_nanos) * 1e-9
            else:
                seconds = (node.op_end_rel_micros - node.op_start_rel_micros) * 1e-6
            name = node.node_name.split(":")[0]  # stream entries may read "name:Type"
            match = _ARG_NAME.match(name)
            if match:
                name = match["name"]
            times[name] = times.get(name, 0.0) + max(seconds, 0.0)
    streamed = {_device_key(d) for d in by_device if d.endswith("/stream:all")}
    result: dict[str, float] = {}
    for device, times in by_device.items():
        if not device.endswith("/stream:all") and _device_key(device) in streamed:
            continue
        for name, seconds in times.items():
            result[name] = result.get(name, 0.0) + seconds
    return result


def op_executions(step_stats) -> dict[str, int]:
    """How many times each node ran in one traced step (on compute devices, not streams)."""
    counts: dict[str, int] = {}
    for device_stats in step_stats.dev_stats:
        if not _COMPUTE_DEVICE.search(device_stats.device):
            continue
        for node in device_stats.node_stats:
            name = node.node_name.split(":")[0]
            counts[name] = counts.get(name, 0) + 1
    return counts


def check_loop_trips(op_graph: OpGraph, executions: dict[str, int]) -> dict[str, int]:
    """Trips of each top-level loop in a measured step; warns where the graph assumed others.

    A LoopCond runs once per iteration and once more to end the loop, so a top-level frame ran
    (executions - 1) iterations. Measured costs count every execution whatever the trips, but
    transfers and memory use the graph's: a mismatch is worth re-importing for (named with the
    `loop_iterations=` that fixes it). Returns frame name -> measured trips.
    """
    import warnings

    measured = {}
    for i in np.flatnonzero(np.asarray(op_graph.types) == "LoopCond"):
        frame = int(op_graph.frame[i])
        if frame < 0 or op_graph.loops[frame].parent >= 0 or op_graph.names[i] not in executions:
            continue
        loop = op_graph.loops[frame]
        measured[loop.name] = trips = executions[op_graph.names[i]] - 1
        if trips != loop.trips:
            warnings.warn(
                f"loop {loop.name!r} ran {trips} iterations in the measured step; the graph "
                f"assumes {loop.trips} ({loop.source}): re-import it with "
                f"loop_iterations={{{loop.name!r}: {trips}}} for its transfers and memory",
                stacklevel=3)
    return measured


def _device_key(device: str) -> str:
    """"GPU:0" of "/job:localhost/replica:0/task:0/device:GPU:0" and of "/device:GPU:0/stream:all"."""
    match = _DEVICE_KEY.search(device)
    return match[0].upper() if match else device
