"""Analytical cost profiles: TensorFlow's own per-op cost model on declared devices.

`analytical_profile(op_graph, cluster)` asks grappler's virtual cluster (the `VirtualCluster` +
`AnalyticalCostEstimator` behind `tensorflow.python.grappler.cluster`) what every op of the graph
costs on each device kind of the cluster. Nothing runs: grappler infers shapes statically, counts
each op's FLOPs and bytes (`OpLevelCostEstimator`) and schedules the graph on the declared
`DeviceProperties` (`VirtualScheduler`).

Map of the file:
  analytical_profile    one grappler item, one virtual-cluster pass per device kind -> CostProfile.
  device_properties     a tfplaceto Device -> grappler's DeviceProperties (throughput calibrated).
  dilated               the same device slowed down by its clock rate (microsecond rounding).
  _grappler_item        the GrapplerItem of a costing copy of the GraphDef, fetching the fetches:
  _costing_graph_def      placeholders become variable reads (grappler would allocate them);
  _with_folded_shape_inputs  shapes computed in the graph become constants (see there).
  _grappler_op_costs    one pass: a one-device virtual cluster, `Cluster.MeasureCosts`, per-node
                        seconds read from the returned OpPerformance list.
  _fallback_costs       ops grappler did not report: 0 for no-op-like types, else bytes / bandwidth.

What is read from grappler: `OpPerformance.compute_cost`, the op's modelled execution time in
nanoseconds. It is `compute_time + memory_time` (FLOPs / peak plus bytes read and written /
memory bandwidth; grappler does not overlap the two by default). grappler's CostGraphDef stores
whole microseconds, so compute_cost is a multiple of 1000 ns: the device is costed "dilated"
(`dilated`: clock and bandwidth divided by the clock in MHz) and the times divided back, which
keeps ~1 ns resolution for the many sub-microsecond ops of small models. The step time
MeasureCosts also returns is not used: a profile is per op, and the simulator schedules ops itself.
grappler costs every op once; an op in a while-loop body is charged its `op_graph.iterations`
(trips of its loops) times that, so a profile holds seconds per step, as a measured one does.
grappler's shape inference does not see through loops, so in a graph with loops the ops are
costed on a loop-free copy with the shapes TensorFlow's importer knows (`loop_free.py`), a
second grappler item; loop control and TensorList ops keep the costs of the first.
cuDNN's fused RNN ops (a Keras LSTM/GRU imported for a GPU cluster), which grappler has no model
for, are costed by their FLOPs and bytes on the same device model (`fused_rnn.py`).

No grappler optimizer rewrites the graph that is costed (the item is built with the default
ItemConfig, which applies none, and the virtual cluster's Run only schedules); constant folding
runs on a separate copy only to learn the values of shape tensors. So every op keeps its name and
type; results are still matched by node name, and every op grappler leaves out is estimated,
counted and shown in the profile's `source`, e.g. "analytical (12 ops estimated)".
"""

from __future__ import annotations

import numpy as np

from tfplaceto import errors
from tfplaceto.cluster import Cluster, Device, as_cluster
from tfplaceto.costs import fused_rnn, loop_free
from tfplaceto.costs.cost_profile import CostProfile, profiled_graph_def
from tfplaceto.graph.op_graph import OpGraph

# Op types that do no work of their own (metadata, aliasing, control flow plumbing): an op of one
# of these types that grappler leaves out costs 0 s.
NO_OP_TYPES = frozenset({
    "NoOp", "Const", "HostConst", "Identity", "IdentityN", "Placeholder", "PlaceholderWithDefault",
    "PlaceholderV2", "VarHandleOp", "VariableV2", "Variable", "VarIsInitializedOp", "ReadVariableOp",
    "StopGradient", "PreventGradient", "Snapshot", "Shape", "ShapeN", "Size", "Rank", "Enter",
    "RefEnter", "Exit", "RefExit", "NextIteration", "RefNextIteration", "Merge", "RefMerge",
    "Switch", "RefSwitch", "LoopCond", "ControlTrigger", "_Arg", "_Retval", "_Send", "_Recv",
    "_HostSend", "_HostRecv", "Assert", "CheckNumerics", "EnsureShape",
})
# The CUDA version grappler's device model is told about (11.8); it only labels the device.
_CUDA_VERSION = "11080"
# The name of the virtual cluster's one device. Its type is neither CPU nor GPU on purpose: for each
# node of its output grappler describes the device named in the cost graph, and for a CPU or GPU
# name it queries this machine's own CPU or CUDA device (slow, and one error line per node on a
# machine without a GPU). The DeviceProperties costed are the ones declared, whatever the name.
VIRTUAL_DEVICE = "/job:tfplaceto/replica:0/task:0/device:VIRTUAL:0"
# Memory bandwidth grappler assumes when a device declares none (op_level_cost_estimator.cc).
_DEFAULT_BANDWIDTH_GBS = {"GPU": 100.0, "CPU": 32.0}
# Integer constants larger than this are not worth folding in: shapes and axes are small.
_MAX_FOLDED_ELEMENTS = 1024
# Ops whose output shape is one of their inputs: op -> (input position, attr of its dtype).
_SHAPE_INPUT = {
    "Fill": (0, "index_type"), "Reshape": (1, "Tshape"), "BroadcastTo": (1, "Tidx"),
    "RandomUniform": (0, "T"), "RandomStandardNormal": (0, "T"), "TruncatedNormal": (0, "T"),
    "RandomUniformInt": (0, "Tout_shape"), "Empty": (0, None),  # Empty's shape is int32
}
# Clock assumed for a device that declares peak_gflops but no frequency.
_DEFAULT_FREQUENCY_MHZ = 1000.0


def analytical_profile(op_graph: OpGraph, cluster: Cluster | str) -> CostProfile:
    """Per-op compute seconds on every device kind of `cluster`, from grappler's cost model.

    Returns a CostProfile of shape (op_graph.num_ops, len(cluster.kinds)) aligned with
    `op_graph.names`, `source` "analytical" (plus how many ops were estimated outside grappler)
    and `graph_fingerprint` = op_graph.fingerprint().

    Raises:
      CostProfileError: the graph is a grouped OpGraph (no GraphDef), a device declares no
        throughput figures, or grappler cannot model the graph.
    """
    cluster = as_cluster(cluster)
    graph_def = profiled_graph_def(op_graph)
    index = {name: i for i, name in enumerate(op_graph.names)}
    kinds = cluster.kinds
    compute = np.zeros((op_graph.num_ops, len(kinds)))
    estimated = np.zeros(op_graph.num_ops, bool)
    # One grappler item serves every kind: on a one-device virtual cluster every node runs on
    # that device whatever its NodeDef.device says.
    item = _grappler_item(graph_def, op_graph.fetches)
    loop_free_item = None
    if op_graph.has_loops:  # grappler cannot see shapes through loops: cost a copy (loop_free.py)
        free_graph_def, free_names = loop_free.loop_free_graph_def(op_graph)
        if free_names:
            loop_free_item = _grappler_item(free_graph_def, free_names)
    fused = fused_rnn.rnn_work(op_graph)  # cuDNN's RNN ops, which grappler does not model
    for k, kind in enumerate(kinds):
        device = next(d for d in cluster.devices if d.kind == kind)
        costs = _grappler_op_costs(item, device)
        if loop_free_item is not None:
            free_costs = _grappler_op_costs(loop_free_item, device)
            costs.update((name, free_costs[name]) for name in free_names if name in free_costs)
        found = np.zeros(op_graph.num_ops, bool)
        for name, seconds in costs.items():
            i = index.get(name)
            if i is not None:  # grappler may add nodes of its own (e.g. _Send/_Recv)
                compute[i, k] = seconds
                found[i] = True
        missing = np.flatnonzero(~found)
        compute[missing, k] = _fallback_costs(op_graph, missing, device)
        estimated[missing] = True
        if fused:
            props = device_properties(device)
            peak, bandwidth = _grappler_gigaops(props) * 1e9, props.bandwidth * 1e3
            for i, work in fused.items():
                compute[i, k] = fused_rnn.seconds(work, peak, bandwidth)
    estimated[list(fused)] = False
    source = "analytical"
    if estimated.any():
        source += f" ({int(estimated.sum())} ops estimated)"
    if op_graph.has_loops:
        # grappler costs each op once; a loop body runs once per iteration (graph/loops.py).
        compute *= op_graph.iterations[:, None]
        source += f" x loop iterations ({len(op_graph.loops)} loops)"
    return CostProfile(tuple(op_graph.names), kinds, compute, source, op_graph.fingerprint())


def device_properties(device: Device):
    """grappler's DeviceProperties for `device`, calibrated to its declared FP32 peak.

    grappler derives a GPU's peak from SMs x clock x cores per SM (a table keyed by the major
    compute capability) x 2, and a CPU's from cores x clock (one FLOP per cycle, no SIMD). Where
    the device declares `peak_gflops`, `num_cores` is rescaled so grappler's peak equals it:
    that keeps the profile consistent with the cluster's figures (grappler's table says 64 FP32
    cores per SM for every architecture >= 6, half of an H100's 128; a CPU's vector units are
    missing entirely). `memory_size` is left unset (unknown) on purpose: the profiling pass puts
    the whole graph on one device, which is not a placement, and grappler would refuse a graph
    that does not fit; memory is the simulator's job.
    """
    from tensorflow.core.protobuf import device_properties_pb2

    props = device_properties_pb2.DeviceProperties(type=device.type, vendor=_vendor(device),
                                                   model=device.model)
    frequency = device.frequency_mhz or (_DEFAULT_FREQUENCY_MHZ if device.peak_gflops > 0 else 0)
    if frequency <= 0 or (device.num_cores <= 0 and device.peak_gflops <= 0):
        raise errors.CostProfileError(
            f"device {device.name!r} declares no throughput (peak_gflops, or num_cores and "
            "frequency_mhz); set them on the tfplaceto.Device so the analytical model can cost ops")
    props.frequency = max(int(round(frequency)), 1)
    props.num_cores = max(device.num_cores, 1)
    if device.type == "GPU":
        props.environment["architecture"] = (device.architecture or "7").split(".")[0]
        props.environment["cuda"] = _CUDA_VERSION
    bandwidth_gbs = device.memory_bandwidth_gbs or _DEFAULT_BANDWIDTH_GBS[device.type]
    props.bandwidth = int(round(bandwidth_gbs * 1e6))  # KB/s
    if device.peak_gflops > 0:
        modelled = _grappler_gigaops(props)
        if modelled > 0:
            props.num_cores = max(int(round(props.num_cores * device.peak_gflops / modelled)), 1)
    return props


def dilated(props) -> tuple[object, float]:
    """(props slowed down `factor` times, factor): the same device with a 1 MHz clock.

    grappler reports op times in whole microseconds (its CostGraphDef's unit), which rounds every
    op under 1 us on a fast GPU (most ops of a small model) down to 0. Its model is linear in
    the clock (FLOPs / (cores x clock x ...)) and in 1 / bandwidth, so a device `factor` =
    clock-in-MHz times slower, with the bandwidth divided alike, reports `factor` times longer
    times: divided by `factor` they are the same model at ~1 ns resolution (grappler itself
    computes in whole nanoseconds). Nothing else in the model depends on the clock.
    """
    factor = max(int(props.frequency), 1)
    slow = type(props)()
    slow.CopyFrom(props)
    slow.frequency = 1
    slow.bandwidth = max(int(round(props.bandwidth / factor)), 1)
    return slow, float(factor)


def _vendor(device: Device) -> str:
    return "NVIDIA" if device.type == "GPU" else "Intel"


def _grappler_gigaops(props) -> float:
    """The peak GFLOPS grappler's OpLevelCostEstimator derives from `props`."""
    from tensorflow.core.protobuf import device_properties_pb2
    from tensorflow.python.grappler import _pywrap_tf_cluster

    named = device_properties_pb2.NamedDevice(name="probe", properties=props)
    return float(_pywrap_tf_cluster.TF_EstimatePerformance(named.SerializeToString()))


def _grappler_item(graph_def, fetches):
    """grappler's GrapplerItem of graph_def made cheap to load and shape-complete (see below)."""
    import tensorflow as tf
    from tensorflow.python.grappler import item as gitem

    costing = _costing_graph_def(graph_def)
    costing = _with_folded_shape_inputs(costing, fetches)
    try:
        return gitem.Item(_metagraph(costing, fetches), ignore_colocation=True)
    except (tf.errors.OpError, ValueError, RuntimeError) as e:
        raise errors.CostProfileError(
            f"grappler cannot read the graph: {errors.first_line(e)}; measure it instead "
            "(source='measured') or load a saved profile") from None


def _metagraph(graph_def, fetches):
    """A MetaGraphDef of graph_def whose "train_op" collection (what grappler fetches) is fetches.

    Built directly rather than by export_meta_graph, which needs a graph context and only adds
    meta information grappler does not read.
    """
    from tensorflow.core.protobuf import meta_graph_pb2

    metagraph = meta_graph_pb2.MetaGraphDef()
    metagraph.graph_def.CopyFrom(graph_def)
    metagraph.collection_def["train_op"].node_list.value.extend(fetches)
    return metagraph


def _with_folded_shape_inputs(graph_def, fetches):
    """graph_def where every small integer input that constant folding can compute is a Const.

    grappler's cost model infers shapes statically without evaluating anything, so a shape that
    is computed in the graph (Keras' Tensordot: Shape -> GatherV2 -> Prod -> Pack -> Reshape;
    gradients: BroadcastGradientArgs -> Sum -> Reshape) stays unknown, and an op with an unknown
    dimension is costed as if it were 1: a [2048, 256] x [256, 10000] MatMul came out 2048x too
    cheap. TensorFlow's runtime constant-folds these before running; here grappler's constant
    folding runs once on a copy only to learn the values: each op whose input it turned into
    an integer constant (or whose shape input it folded away along with the op, as for the
    zeros of a dynamic batch size) gets that constant as a new Const input, and the original
    producer stays, as a control input. No op of the graph is removed, renamed or retyped. If
    constant folding fails, the graph is costed as it is.
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.grappler import tf_optimizer

    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.optimizers[:] = ["constfold"]
    rewrite.min_graph_nodes = -1
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    try:
        folded = tf_optimizer.OptimizeGraph(config, _metagraph(graph_def, fetches), verbose=False)
    except Exception:  # grappler raises assorted internal error types; folding is optional
        return graph_def
    folded_nodes = {node.name: node for node in folded.node}
    integer = {tf.int32.as_datatype_enum, tf.int64.as_datatype_enum}
    original = {node.name: node for node in graph_def.node}

    def small_integer_const(node) -> bool:
        return (node is not None and node.op == "Const"
                and node.attr["dtype"].type in integer
                and _num_elements(node.attr["value"].tensor) <= _MAX_FOLDED_ELEMENTS)

    # (producer, output index) -> the Const node holding that output's value. Two sources:
    # a node that became a Const under its own name (Shape, Pack, Prod ... of known shapes),
    # and an input that a surviving consumer now reads from a Const (multi-output producers
    # such as BroadcastGradientArgs get new "ConstantFolding/..." nodes).
    values: dict[tuple[str, int], object] = {}
    for name, before in original.items():
        if before.op != "Const" and small_integer_const(folded_nodes.get(name)):
            values[(name, 0)] = folded_nodes[name]
    for name, before in original.items():
        after = folded_nodes.get(name)
        if (after is not None and after.op == "Const" and before.op in _SHAPE_INPUT
                and len(_data_inputs(before)) > _SHAPE_INPUT[before.op][0]):
            # A whole Fill/Reshape/... folded away (zeros of a dynamic batch size): its shape
            # input is the folded constant's shape, whose producers were folded with it.
            position, dtype_attr = _SHAPE_INPUT[before.op]
            producer = _tensor(_data_inputs(before)[position])
            if original.get(producer[0]) is not None and original[producer[0]].op != "Const":
                dims = [d.size for d in after.attr["value"].tensor.tensor_shape.dim]
                dtype = tf.int32.as_datatype_enum
                if dtype_attr and dtype_attr in before.attr:
                    dtype = before.attr[dtype_attr].type
                values.setdefault(producer, _int_const(dims, dtype))
        if after is None or after.op != before.op:
            continue  # removed or rewritten: its inputs no longer line up
        inputs = _data_inputs(before)
        inputs_after = _data_inputs(after)
        if len(inputs) != len(inputs_after):
            continue
        for before_input, after_input in zip(inputs, inputs_after):
            producer = _tensor(before_input)
            source = folded_nodes.get(_tensor(after_input)[0])
            if original.get(producer[0]) is not None and original[producer[0]].op != "Const" \
                    and small_integer_const(source):
                values.setdefault(producer, source)

    result = tf.compat.v1.GraphDef()
    result.CopyFrom(graph_def)
    names = set(original)
    added: dict[tuple[str, int], str] = {}
    for node in result.node:
        for j, tensor_name in enumerate(_data_inputs(node)):
            producer = _tensor(tensor_name)
            if producer not in values:
                continue
            if producer not in added:
                const = type(node)(name=_unique(f"{producer[0]}/_tfplaceto_folded_{producer[1]}",
                                                names), op="Const")
                const.attr["dtype"].CopyFrom(values[producer].attr["dtype"])
                const.attr["value"].CopyFrom(values[producer].attr["value"])
                result.node.append(const)
                added[producer] = const.name
            node.input[j] = added[producer]  # data inputs come before control inputs
            if f"^{producer[0]}" not in node.input:
                node.input.append(f"^{producer[0]}")  # the producer still runs before it
    return result


def _int_const(values: list[int], dtype: int):
    """A Const NodeDef (unnamed) holding the integer vector `values`."""
    import tensorflow as tf
    from tensorflow.core.framework import node_def_pb2

    node = node_def_pb2.NodeDef(op="Const")
    node.attr["dtype"].type = dtype
    node.attr["value"].tensor.CopyFrom(
        tf.make_tensor_proto(np.asarray(values, tf.dtypes.as_dtype(dtype).as_numpy_dtype)))
    return node


def _data_inputs(node) -> list[str]:
    return [name for name in node.input if not name.startswith("^")]


def _tensor(input_name: str) -> tuple[str, int]:
    name, _, index = input_name.partition(":")
    return name, int(index) if index else 0


def _num_elements(tensor_proto) -> int:
    dims = [d.size for d in tensor_proto.tensor_shape.dim]
    return int(np.prod(dims)) if dims else 1


def _grappler_op_costs(item, device: Device) -> dict[str, float]:
    """Seconds per node name with every node of the grappler `item` on one virtual `device`."""
    import tensorflow as tf
    from tensorflow.core.protobuf import device_properties_pb2
    from tensorflow.python.grappler import cluster as gcluster

    properties, factor = dilated(device_properties(device))
    named = device_properties_pb2.NamedDevice(name=VIRTUAL_DEVICE, properties=properties)
    try:
        virtual = gcluster.Cluster(devices=[named])
        try:
            op_perfs, _, _ = virtual.MeasureCosts(item)
        finally:
            virtual.Shutdown()
    except (tf.errors.OpError, ValueError, RuntimeError) as e:
        raise errors.CostProfileError(
            f"grappler's cost model cannot model the graph on {device.kind}: {errors.first_line(e)}; "
            "measure it instead (source='measured') or load a saved profile") from None
    costs: dict[str, float] = {}
    for perf in op_perfs:
        # compute_cost: nanoseconds (= compute_time + memory_time) on the dilated device, in
        # whole microseconds; / factor gives the declared device's time at ~1 ns resolution.
        costs[perf.node] = costs.get(perf.node, 0.0) + perf.compute_cost * 1e-9 / factor
    return costs




def _costing_graph_def(graph_def):
    """A copy of graph_def for grappler: no node placed, no Placeholder left.

    grappler's item builder allocates and fills a tensor for every Placeholder (its "feeds"), which
    for a large input (a [1024, 56, 56, 64] activation is 800 MB) costs seconds. Each Placeholder
    becomes a ReadVariableOp of a VarHandleOp of the same dtype and shape instead: same name, same
    static shape for shape inference, nothing allocated, and grappler costs it 0 like a fed
    placeholder. The input graph_def is not modified.
    """
    import tensorflow as tf

    result = tf.compat.v1.GraphDef()
    result.CopyFrom(graph_def)
    names = {node.name for node in result.node}
    handles = []
    for node in result.node:
        node.device = ""  # the virtual cluster's only device
        if node.op not in ("Placeholder", "PlaceholderV2"):
            continue
        handle = _unique(f"{node.name}/_tfplaceto_input", names)
        handles.append(_var_handle(handle, node))
        dtype = node.attr["dtype"].type
        node.op = "ReadVariableOp"
        node.ClearField("attr")
        node.attr["dtype"].type = dtype
        node.ClearField("input")
        node.input.append(handle)
    result.node.extend(handles)
    return result


def _var_handle(name: str, placeholder):
    from tensorflow.core.framework import node_def_pb2

    handle = node_def_pb2.NodeDef(name=name, op="VarHandleOp")
    handle.attr["dtype"].type = placeholder.attr["dtype"].type
    handle.attr["shape"].shape.CopyFrom(placeholder.attr["shape"].shape)
    handle.attr["container"].s = b""
    handle.attr["shared_name"].s = name.encode()
    handle.attr["allowed_devices"].list.SetInParent()
    return handle


def _unique(name: str, used: set[str]) -> str:
    candidate, i = name, 0
    while candidate in used:
        i += 1
        candidate = f"{name}_{i}"
    used.add(candidate)
    return candidate


def _fallback_costs(op_graph: OpGraph, ops: np.ndarray, device: Device) -> np.ndarray:
    """Seconds for ops grappler did not cost: 0 if they do no work, else writing their outputs."""
    if not len(ops):
        return np.zeros(0)
    bandwidth = device.memory_bandwidth_gbs or _DEFAULT_BANDWIDTH_GBS.get(device.type, 32.0)
    seconds = op_graph.output_bytes[ops] / (bandwidth * 1e9)
    no_op = np.array([op_graph.types[i] in NO_OP_TYPES for i in ops], bool)
    return np.where(no_op, 0.0, seconds)
