"""The implementation TensorFlow would run of a function with alternatives (Keras' LSTM and GRU).

Keras traces an LSTM or GRU layer (with cuDNN-compatible settings) as two functions that
implement the same API (`api_implements` "lstm_<uuid>"): a portable one (`standard_lstm`: a while
loop over the time steps, `api_preferred_device` CPU) that the graph calls, and a cuDNN one
(`gpu_lstm_with_fallback`: one CudnnRNN op, preferred device GPU) registered beside it, with the
forward and backward functions of both for a training step. At run time grappler's
implementation selector swaps each call for the alternative whose preferred device is the type
of the device the call was placed on. So on a GPU the layer is one CudnnRNN op and one
CudnnRNNBackprop op; on a CPU it is a loop run once per time step. The import has to choose
before placement: it keeps the alternative for the cluster's target device type (GPU when the
cluster has GPUs, else CPU), by running grappler's own implementation selector on the calls, and
records the choice (`ImplementationChoice`, `OpGraph.implementations`, report.json).

Map of the file:
  ImplementationChoice   one swappable API: the layer, the device type chosen for, the function
                         kept and whether it is the cuDNN kernel or the standard ops.
  target_device_type     the device type a cluster's swappable calls would run on.
  has_swappable          whether a GraphDef's library holds functions with alternatives.
  select                 the GraphDef with each swappable call pointed at the chosen alternative
                         (grappler's ImplementationSelector for calls at the top of the graph,
                         where a Keras model's step has them), and the choices.
  _swap_nested           calls inside other functions' bodies (a SavedModel signature calling
                         the model): swapped where the alternative has the same signature (an
                         inference call); a forward/backward pair there keeps what it calls,
                         and its choice says so (device_type None).
A library without the alternative (a SavedModel keeps only the functions its signatures call)
runs the called function on either device type, and the choice records the target type.
"""

from __future__ import annotations

import dataclasses

from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2

from tfplaceto import errors
from tfplaceto.graph.inlining import run_grappler
from tfplaceto.graph.node_defs import CALL_OPS, called_function_name

API_ATTR = "api_implements"
DEVICE_ATTR = "api_preferred_device"
# Kernels that only exist as a fused library call on the accelerator.
_FUSED_PREFIXES = ("Cudnn",)


@dataclasses.dataclass(frozen=True)
class ImplementationChoice:
    """One API with alternatives (a Keras LSTM/GRU layer) and the alternative the import kept.

    api: the `api_implements` name; layer: the name scope of its forward call;
    device_type: the device type chosen for ("GPU", "CPU"; None: none given, the traced call
    kept); kernel: "cuDNN" (a fused Cudnn* op) or "standard" (TensorFlow ops, a while loop);
    function: the forward function kept; calls: call sites swapped (forward, backward).
    """

    api: str
    layer: str
    device_type: str | None
    kernel: str
    function: str
    calls: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def target_device_type(cluster) -> str:
    """"GPU" if the Cluster has a GPU (TensorFlow's placer prefers it for these calls), else "CPU"."""
    return "GPU" if any(d.type == "GPU" for d in cluster.devices) else "CPU"


def _swappable(graph_def) -> dict[str, object]:
    return {f.signature.name: f for f in graph_def.library.function if API_ATTR in f.attr}


def has_swappable(graph_def) -> bool:
    """Whether graph_def's function library has functions with alternatives (api_implements)."""
    return any(API_ATTR in f.attr for f in graph_def.library.function)


def _same_signature(a, b) -> bool:
    def types(args):
        return [(arg.type, arg.type_attr, arg.number_attr, arg.type_list_attr) for arg in args]

    return (types(a.signature.input_arg) == types(b.signature.input_arg)
            and types(a.signature.output_arg) == types(b.signature.output_arg))


def select(graph_def, device_type: str | None) -> tuple[object, tuple[ImplementationChoice, ...]]:
    """(graph_def with every swappable call on device_type's alternative, choices).

    Calls in graph_def.node are swapped (`_swap_nested` for the others). With device_type None
    nothing is swapped: the alternative the graph calls (Keras' standard one) is kept and
    recorded as such. The selection is grappler's ImplementationSelector, alone, on a copy whose
    swappable calls carry a device of that type; the devices are cleared again afterwards.
    Raises InvalidGraphError if grappler fails.
    """
    if device_type not in (None, "CPU", "GPU"):
        raise errors.InvalidGraphError(f"device_type must be 'CPU', 'GPU' or None, got {device_type!r}")
    if device_type is not None:
        graph_def = _swap_nested(graph_def, device_type)
    functions = _swappable(graph_def)
    calls = [node.name for node in graph_def.node if called_function_name(node) in functions]
    nested = _nested_choices(graph_def, functions, device_type)
    if not calls:
        return graph_def, nested
    selected = graph_def
    if device_type is not None:
        selected = _run_selector(graph_def, set(calls), device_type)
    functions = _swappable(selected)
    by_name = {f.signature.name: f for f in selected.library.function}
    groups: dict[str, list] = {}
    for node in selected.node:
        function = functions.get(called_function_name(node))
        if function is not None:
            groups.setdefault(function.attr[API_ATTR].s.decode(), []).append((node, function))
    choices = []
    for api, members in groups.items():
        forward = [(n, f) for n, f in members if "forward_function_name" not in f.attr] or members
        node, function = forward[0]
        kernel = "cuDNN" if _uses_fused_kernel(function, by_name) else "standard"
        layer = node.name.rsplit("/", 1)[0] if "/" in node.name else node.name
        choices.append(ImplementationChoice(api, layer, device_type, kernel, function.signature.name,
                                            len(members)))
    return selected, tuple(sorted(choices, key=lambda c: c.layer)) + nested


def _swap_nested(graph_def, device_type: str):
    """A copy of graph_def whose swappable calls inside function bodies call the alternative
    preferred on device_type, where it has exactly the called function's signature (an
    inference call: Keras' standard and cuDNN functions take and return the same tensors; a
    training step's forward and backward pair is left to grappler's selector at the top)."""
    functions = _swappable(graph_def)
    swapped = type(graph_def)()
    swapped.CopyFrom(graph_def)
    alternatives: dict[tuple[str, str], list] = {}
    for function in functions.values():
        key = (function.attr[API_ATTR].s.decode(), function.attr[DEVICE_ATTR].s.decode())
        alternatives.setdefault(key, []).append(function)
    for outer in swapped.library.function:
        if API_ATTR in outer.attr:
            continue
        for node in outer.node_def:
            called = functions.get(called_function_name(node))
            if called is None or node.op not in CALL_OPS or _is_gradient_pair(called):
                continue
            key = (called.attr[API_ATTR].s.decode(), device_type)
            match = [f for f in alternatives.get(key, []) if not _is_gradient_pair(f) and _same_signature(f, called)]
            if len(match) == 1:
                node.attr["f"].func.name = match[0].signature.name
    return swapped


def _is_gradient_pair(function) -> bool:
    """Whether a function is the forward or backward half of a differentiated call."""
    return "forward_function_name" in function.attr or "backward_function_name" in function.attr


def _nested_choices(graph_def, functions, device_type: str | None) -> tuple[ImplementationChoice, ...]:
    """The choices of swappable calls inside function bodies: device_type where the call is on
    an alternative preferred there (`_swap_nested`) or the library has none for it, else None
    (kept as called)."""
    by_name = {f.signature.name: f for f in graph_def.library.function}
    available = {(f.attr[API_ATTR].s.decode(), f.attr[DEVICE_ATTR].s.decode()) for f in functions.values()}
    seen, choices = set(), []
    for outer in graph_def.library.function:
        if API_ATTR in outer.attr:
            continue
        for node in outer.node_def:
            function = functions.get(called_function_name(node))
            if function is None:
                continue
            api = function.attr[API_ATTR].s.decode()
            if api in seen:
                continue
            seen.add(api)
            kernel = "cuDNN" if _uses_fused_kernel(function, by_name) else "standard"
            # No alternative for device_type in the library (a SavedModel keeps only what its
            # signatures call): TensorFlow runs the called one there too.
            there = (api, device_type) in available
            chosen = device_type if function.attr[DEVICE_ATTR].s.decode() == device_type or not there else None
            choices.append(ImplementationChoice(api, f"{outer.signature.name}/{node.name}", chosen, kernel,
                                                function.signature.name, 1))
    return tuple(choices)


def _uses_fused_kernel(function, by_name, depth: int = 0) -> bool:
    """Whether the function (or a function it calls, or a branch of its conds) runs a Cudnn op."""
    if depth > 8:
        return False
    for node in function.node_def:
        if node.op.startswith(_FUSED_PREFIXES):
            return True
        called = [v.func.name for v in node.attr.values() if v.func.name]
        called += [node.op] if node.op in by_name else []
        if any(_uses_fused_kernel(by_name[name], by_name, depth + 1) for name in called if name in by_name):
            return True
    return False


def _run_selector(graph_def, calls: set[str], device_type: str):
    """grappler's ImplementationSelector on a copy of graph_def whose `calls` are on device_type.

    The meta optimizer runs the selector first when it is on (the default); every other
    optimizer is switched off and pruning disabled, so only the calls' functions change (and
    the backward call's inputs, when the alternatives keep different intermediates)."""
    marked = type(graph_def)()
    marked.CopyFrom(graph_def)
    for node in marked.node:
        if node.name in calls:
            node.device = f"/job:localhost/replica:0/task:0/device:{device_type}:0"
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    off = rewriter_config_pb2.RewriterConfig.OFF
    for name in ("layout_optimizer", "constant_folding", "shape_optimization", "remapping",
                 "arithmetic_optimization", "dependency_optimization", "loop_optimization",
                 "function_optimization", "debug_stripper", "scoped_allocator_optimization",
                 "pin_to_host_optimization", "common_subgraph_elimination", "auto_mixed_precision",
                 "auto_mixed_precision_mkl", "auto_mixed_precision_onednn_bfloat16",
                 "auto_mixed_precision_cpu"):
        if hasattr(rewrite, name):
            setattr(rewrite, name, off)
    rewrite.implementation_selector = rewriter_config_pb2.RewriterConfig.ON
    rewrite.disable_model_pruning = True
    rewrite.memory_optimization = rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    rewrite.min_graph_nodes = -1
    rewrite.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    selected = run_grappler(
        marked, config, (), f"select the {device_type} implementation of the graph's Keras RNN layers",
        "import without a cluster to keep the traced implementation")
    before = {node.name for node in graph_def.node}
    if {node.name for node in selected.node} != before:
        raise errors.InvalidGraphError(
            "grappler's implementation selector changed the graph's ops; import without a cluster "
            "to keep the traced implementation")
    for node in selected.node:
        if node.name in calls:
            node.device = ""
    return selected
