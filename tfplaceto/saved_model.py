"""`rewrite`: place the ops of a SavedModel's signatures and write the placed SavedModel.

`rewrite(src_dir, dst_dir, cluster, method)` loads the SavedModel, optimizes the graph of each
chosen signature (`tp.optimize` on the signature's function, inlined), then writes a copy of the
SavedModel in which the NodeDef.device of every op those signatures run is set. Nothing else is
rebuilt: the object graph, the other functions, the variables and assets are copied byte for byte,
so the result loads with `tf.saved_model.load` exactly like the source and computes the same.

Map of the file:
  rewrite                 the public verb; returns the OptimizeResult of the first signature.
  _check_source, _check_destination   validation before any work (typed errors).
  _signature_keys         which signatures, in which order ("serving_default" first).
  _place_meta_graph       writes the placements into the MetaGraphDef (the heart of it).
  _SignaturePlacer        one signature: walks its function and the functions it calls.
  _write_atomically       copy + new saved_model.pb into a temporary directory, then one rename.

How placement names map back to the SavedModel. `tf.saved_model.load` turns a signature into the
body of its `signature_wrapper` function; the importer inlines every call, naming the inlined copy
of node `n` of a function called by node `c` as `c/n` (nested: `c1/c2/n`). So the device of node
`n` of a function reached through calls `c1, c2` is the placement of `c1/c2/n`. A call node gets
the device most of its body got; a node with no placed name (functional control flow, which the
importer lowers to differently named ops) gets the device most placed ops under its name got,
else its caller's. A function reached from several call sites or signatures keeps the devices of
the first one (a FunctionDef holds one device per node). A TF1 SavedModel (signatures over the
top-level graph, no functions) gets the devices of its placed ops by name.

Variables: the device the placement gave each variable a signature captures is recorded in the
SavedVariable protos. `tf.saved_model.load` uses it only when asked, with
`tf.saved_model.LoadOptions(experimental_variable_policy=
tf.saved_model.experimental.VariablePolicy.SAVE_VARIABLE_DEVICES)`; by default variables load on
the default device and the ops reading them run with them (TF requires that; soft placement, on by
default in TF2, resolves the difference). The checkpoint in `variables/` is copied unchanged.
"""

from __future__ import annotations

import collections
import os
import shutil
from collections.abc import Mapping, Sequence

from tfplaceto import checks, errors, outputs
from tfplaceto.cluster import Cluster, as_cluster
from tfplaceto.graph import sources
from tfplaceto.graph.node_defs import called_function
from tfplaceto.place import OptimizeResult, check_method, optimize
from tfplaceto.rewrite import DeviceResolver

_PROTO_FILES = ("saved_model.pb", "saved_model.pbtxt")
_FINGERPRINT_FILE = "fingerprint.pb"


def rewrite(src_dir: str | os.PathLike, dst_dir: str | os.PathLike, cluster: Cluster | str,
            method: str = "placeto", signature_keys: str | Sequence[str] | None = None, *,
            budget_s: float | None = None, seed: int = 0,
            batch_size: int | None = None, overwrite: bool = False) -> OptimizeResult:
    """Writes to dst_dir a copy of the SavedModel in src_dir with its signatures' ops placed.

    Args:
      src_dir: a SavedModel directory (written by tf.saved_model.save); never modified.
      dst_dir: where the placed SavedModel goes; must not exist or be an empty directory (or,
        with overwrite=True, any directory: it is replaced). It is built in a temporary directory
        beside it and renamed into place, so it appears complete or not at all.
      cluster: a Cluster or a name ("4xV100", "local:2").
      method: a placement method (tp.METHODS) or "auto"; "placeto" (the default: the policy's
        search) and "auto" take the best placement found, another method named is honoured
        (see tp.optimize).
      signature_keys: the signatures to place (default: all, "serving_default" first). Each is
        optimized on its own; a function shared by several keeps the first one's devices.
      budget_s, seed: passed to tp.optimize.
      batch_size: fills unknown batch dimensions of the signature inputs; required when an
        input of a placed signature has one (InvalidGraphError otherwise, as everywhere).
      overwrite: replace a non-empty dst_dir instead of refusing.

    Returns the OptimizeResult of the first signature placed.

    Raises:
      InvalidGraphError: src_dir is missing or not a loadable SavedModel, has no signatures, or a
        requested signature is missing.
      InvalidClusterError, InvalidMethodError: a bad cluster or method.
      OutputExistsError: dst_dir exists and is not empty (without overwrite), or lies inside
        src_dir (or src in dst).
      OutputPathError: dst_dir cannot be written (a read-only or missing parent, a file in the way).
      InvalidArgumentError: a bad budget_s or seed.
    """

    cluster = as_cluster(cluster)
    check_method(method)
    checks.check_batch_size(batch_size)
    budget_s, seed = checks.check_budget(budget_s), checks.check_seed(seed)
    src_dir, proto_file = _check_source(src_dir)
    dst_dir = _check_destination(dst_dir, src_dir, overwrite)
    saved_model = _read_saved_model(os.path.join(src_dir, proto_file))
    meta_graph = _only_meta_graph(saved_model, src_dir)
    loaded = sources.load_saved_model(src_dir)
    keys = _signature_keys(loaded, signature_keys, src_dir)

    results: dict[str, OptimizeResult] = {}
    for key in keys:
        graph = sources.load_source(loaded, signature_key=key)
        unknown = [name for name, shape, _ in graph.feeds if shape is not None and shape and shape[0] is None]
        if unknown and batch_size is None:
            raise errors.InvalidGraphError(
                f"input {unknown[0]!r} of signature {key!r} has an unknown batch dimension; pass "
                "batch_size=N (--batch-size N on the command line) for the batch the model will serve")
        results[key] = optimize(graph, cluster=cluster, method=method, budget_s=budget_s, seed=seed,
                                batch_size=batch_size)
    _place_meta_graph(meta_graph, results)
    _write_atomically(src_dir, dst_dir, proto_file, saved_model)
    return results[keys[0]]


# -- validation -------------------------------------------------------------------------------------

def _check_source(src_dir) -> tuple[str, str]:
    """(absolute src_dir, name of its saved_model proto file)."""
    try:
        path = os.path.abspath(os.fspath(src_dir))
    except TypeError:
        raise errors.InvalidGraphError(f"src_dir must be a path, got {type(src_dir).__name__}") from None
    if not os.path.exists(path):
        raise errors.InvalidGraphError(f"SavedModel directory {src_dir!r} does not exist")
    if not os.path.isdir(path):
        raise errors.InvalidGraphError(f"{src_dir!r} is not a directory; pass the SavedModel directory")
    for name in _PROTO_FILES:
        if os.path.isfile(os.path.join(path, name)):
            return path, name
    raise errors.InvalidGraphError(
        f"directory {src_dir!r} holds no saved_model.pb, so it is not a SavedModel; pass the "
        "directory tf.saved_model.save wrote")


def _check_destination(dst_dir, src_dir: str, overwrite: bool = False) -> str:
    try:
        path = os.path.abspath(os.fspath(dst_dir))
    except TypeError:
        raise errors.OutputPathError(f"dst_dir must be a path, got {type(dst_dir).__name__}") from None
    if not os.fspath(dst_dir):
        raise errors.OutputPathError("dst_dir is empty; give the directory for the placed SavedModel")
    real_dst, real_src = os.path.realpath(path), os.path.realpath(src_dir)
    if outputs.is_inside(real_dst, real_src) or outputs.is_inside(real_src, real_dst):
        raise errors.OutputExistsError(
            f"dst_dir {dst_dir!r} overlaps the source SavedModel {src_dir!r}; write the placed "
            "SavedModel to a separate directory")
    if os.path.lexists(path):
        if not os.path.isdir(path) or os.path.islink(path):
            raise errors.OutputExistsError(f"dst_dir {dst_dir!r} exists and is not a plain directory "
                                           "(a file or a symlink); choose a new path")
        if os.listdir(path) and not overwrite:
            raise errors.OutputExistsError(f"dst_dir {dst_dir!r} exists and is not empty; refusing to "
                                           "overwrite it: remove it, choose a new path or pass overwrite=True "
                                           "(--overwrite)")
    outputs.check_writable_directory(os.path.dirname(path), f"dst_dir {os.fspath(dst_dir)!r}")
    return path


def _read_saved_model(path: str):
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    try:
        with open(path, "rb") as file:
            data = file.read()
        if path.endswith(".pbtxt"):
            text_format.Parse(data.decode("utf-8"), proto)
        else:
            proto.ParseFromString(data)
    except OSError as error:
        raise errors.InvalidGraphError(f"cannot read {path!r}: {error.strerror}") from None
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError):
        raise errors.InvalidGraphError(f"{path!r} is not a SavedModel proto") from None
    return proto


def _only_meta_graph(saved_model, src_dir: str):
    if len(saved_model.meta_graphs) != 1:
        # tf.saved_model.save writes one; several come from TF1 builders with tags per graph.
        raise errors.InvalidGraphError(
            f"the SavedModel in {src_dir!r} has {len(saved_model.meta_graphs)} MetaGraphs; "
            "tfplaceto rewrites SavedModels with one (as tf.saved_model.save writes)")
    return saved_model.meta_graphs[0]


def _signature_keys(loaded, signature_keys, src_dir: str) -> list[str]:
    available = list(getattr(loaded, "signatures", {}) or {})
    if not available:
        raise errors.InvalidGraphError(
            f"the SavedModel in {src_dir!r} has no signatures; save it with "
            "tf.saved_model.save(obj, path, signatures=...) so there is something to place")
    if signature_keys is None:
        return sorted(available, key=lambda key: (key != "serving_default", key))
    keys = [signature_keys] if isinstance(signature_keys, str) else list(signature_keys)
    if not keys or not all(isinstance(key, str) for key in keys):
        raise errors.InvalidGraphError(
            f"signature_keys must be a signature name or a non-empty list of them, got {signature_keys!r}")
    missing = [key for key in keys if key not in available]
    if missing:
        raise errors.InvalidGraphError(
            f"the SavedModel in {src_dir!r} has no signature {missing[0]!r} (signatures: "
            f"{', '.join(repr(key) for key in sorted(available))})")
    return list(dict.fromkeys(keys))


# -- writing the placements into the MetaGraphDef ----------------------------------------------------

def _place_meta_graph(meta_graph, results: Mapping[str, OptimizeResult]) -> None:
    """Sets the devices of every node the given signatures run, in place (see module docstring)."""
    functions = {function.signature.name: function for function in meta_graph.graph_def.library.function}
    graph_nodes = {node.name: node for node in meta_graph.graph_def.node}
    placed_functions: dict[str, str] = {}  # function name -> the device most of its body got
    placed_variables: set[int] = set()
    for key, result in results.items():
        placer = _SignaturePlacer(result, functions, placed_functions)
        signature = meta_graph.signature_def[key]
        outputs = [graph_nodes.get(tensor.name.split(":")[0]) for tensor in signature.outputs.values()]
        wrappers = [(node, called_function(node, functions)) for node in outputs if node is not None]
        if any(wrapper is None for _, wrapper in wrappers):
            # A TF1-style signature: its ops are nodes of the top-level graph, under their own
            # names; nodes it does not run (initializers, the saver) are left alone.
            for node in meta_graph.graph_def.node:
                if node.name in placer.device_of:
                    node.device = placer.device_of[node.name]
            continue
        for node, wrapper in wrappers:
            node.device = placer.place_function(wrapper, "", placer.default)
            _record_variable_devices(meta_graph, wrapper, placer.device_of, placed_variables)


class _SignaturePlacer:
    """Writes one signature's placement into the functions its wrapper reaches."""

    def __init__(self, result: OptimizeResult, functions: Mapping, placed_functions: dict[str, str]):
        # Lowered control flow and other renamed ops are found by the name scope of the node
        # they came from (`DeviceResolver.scope_device`).
        self.resolver = DeviceResolver(result.placement)
        self.device_of, self.default = self.resolver.device_of, self.resolver.default
        self.functions = functions
        self.placed_functions = placed_functions

    def place_function(self, function, prefix: str | None, fallback: str) -> str:
        """Places the body of function, whose inlined copy is named prefix + node name.

        prefix None: the body has no inlined copy in the placement (a control flow body); every
        node goes to fallback, the device of the op that runs it.
        """
        name = function.signature.name
        if name in self.placed_functions:
            return self.placed_functions[name]
        self.placed_functions[name] = fallback  # a recursive call sees a device, not a loop
        devices = self.place_nodes(function.node_def, prefix, fallback)
        majority = collections.Counter(devices).most_common(1)[0][0] if devices else fallback
        self.placed_functions[name] = majority
        return majority

    def place_nodes(self, nodes, prefix: str | None, fallback: str) -> list[str]:
        devices = []
        for node in nodes:
            full = None if prefix is None else prefix + node.name
            callee = called_function(node, self.functions)
            if full in self.device_of:
                device = self.device_of[full]
            elif callee is not None:
                inner = None if full is None else full + "/"
                device = self.place_function(callee, inner, self._scope_device(full, fallback))
            else:
                device = self._scope_device(full, fallback)
            node.device = device
            devices.append(device)
            # Bodies of functional control flow (While/If/Case) and any other function-valued
            # attribute run where the op runs; the importer lowered them under other names.
            for body in _attr_functions(node, self.functions):
                if body is not callee:
                    self.place_function(body, None, device)
        return devices

    def _scope_device(self, name: str | None, fallback: str) -> str:
        return self.resolver.scope_device(name) or fallback


def _attr_functions(node, functions) -> list:
    result = []
    for value in node.attr.values():
        names = [value.func.name] if value.HasField("func") else [f.name for f in value.list.func]
        result.extend(functions[name] for name in names if name in functions)
    return result


def _record_variable_devices(meta_graph, wrapper, device_of: Mapping[str, str], done: set[int]) -> None:
    """SavedVariable.device of each variable the wrapper captures (first signature wins)."""
    saved = meta_graph.object_graph_def.concrete_functions.get(wrapper.signature.name)
    if saved is None or not saved.bound_inputs:
        return
    # Captured inputs are the wrapper's last arguments, in bound_inputs order.
    args = [arg.name for arg in wrapper.signature.input_arg][-len(saved.bound_inputs):]
    nodes = meta_graph.object_graph_def.nodes
    for arg, node_id in zip(args, saved.bound_inputs, strict=True):
        if node_id in done or node_id >= len(nodes) or nodes[node_id].WhichOneof("kind") != "variable":
            continue
        if arg in device_of:
            nodes[node_id].variable.device = device_of[arg]
            done.add(node_id)


# -- writing the directory --------------------------------------------------------------------------

def _write_atomically(src_dir: str, dst_dir: str, proto_file: str, saved_model) -> None:
    """Copies src_dir with the new proto into a temporary sibling of dst_dir, then renames it
    (`outputs.atomic_directory`: an existing dst_dir is replaced only once the copy is whole)."""
    from google.protobuf import text_format

    with outputs.atomic_directory(dst_dir) as tmp:
        _copy_tree(src_dir, tmp, skip={proto_file, _FINGERPRINT_FILE})
        if proto_file.endswith(".pbtxt"):
            data = text_format.MessageToString(saved_model).encode()
        else:
            data = saved_model.SerializeToString(deterministic=True)
        with open(os.path.join(tmp, proto_file), "wb") as file:
            file.write(data)
        if os.path.exists(os.path.join(src_dir, _FINGERPRINT_FILE)):
            _write_fingerprint(tmp)
        _set_default_mode(tmp)


def _copy_tree(src: str, dst: str, skip: set[str]) -> None:
    # Contents only, not permission bits: a read-only source must still give a writable copy.
    for root, dirs, files in os.walk(src):
        relative = os.path.relpath(root, src)
        target = dst if relative == "." else os.path.join(dst, relative)
        os.makedirs(target, exist_ok=True)
        for name in files:
            if relative == "." and name in skip:
                continue
            shutil.copyfile(os.path.join(root, name), os.path.join(target, name))
        dirs.sort()


def _write_fingerprint(export_dir: str) -> None:
    """A fingerprint.pb matching the new saved_model.pb (the copied one would not)."""
    try:
        from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

        data = fingerprinting.CreateFingerprintDef(export_dir)
    except Exception:  # a private API; without it the model simply has no fingerprint
        return
    with open(os.path.join(export_dir, _FINGERPRINT_FILE), "wb") as file:
        file.write(data)


def _set_default_mode(path: str) -> None:
    # mkdtemp makes the directory private (0700); give it the mode a plain mkdir would.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)




__all__ = ["rewrite"]
