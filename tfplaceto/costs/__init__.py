"""Cost profiles: per-op compute time on each device kind (analytical, measured, or loaded).

- `cost_profile.py`: the `CostProfile` arrays and their proto file format.
- `analytical.py`: `analytical_profile`, grappler's analytical cost model on declared devices.
- `measured.py`: `measured_profile`, traced runs on this machine's devices.
- `loop_free.py`: a graph with while loops as a loop-free copy grappler can cost (analytical).
- `fused_rnn.py`: cuDNN's fused RNN ops (CudnnRNN, CudnnRNNBackprop), costed by FLOPs and bytes.
- this file: `profile(op_graph, cluster, source)`, the front door (`tp.profile`), with an on-disk
  cache of analytical and measured profiles.

Cache: one CostProfile proto per (graph fingerprint, cluster fingerprint, source) under
`cache_dir` (default: $TFPLACETO_CACHE_DIR, else ~/.cache/tfplaceto). A cache file that cannot be
read or does not match the graph is ignored and rewritten; a cache directory that cannot be
written only costs the next call a recomputation.
"""

from __future__ import annotations

import os
import warnings

from tfplaceto import errors
from tfplaceto.cluster import Cluster, as_cluster
from tfplaceto.costs import analytical, fused_rnn, measured
from tfplaceto.costs.analytical import analytical_profile
from tfplaceto.costs.cost_profile import CostProfile, profiled_graph_def
from tfplaceto.costs.measured import measured_profile
from tfplaceto.graph.implementations import target_device_type
from tfplaceto.graph.op_graph import OpGraph

SOURCES = ("analytical", "measured")
CACHE_ENV = "TFPLACETO_CACHE_DIR"
# Bumped whenever a change to the cost models would make cached profiles wrong.
_CACHE_VERSION = 1
# The same for graphs with while loops only (their costing has its own steps, loop_free.py), so
# a change there does not throw away every cached profile of loop-free graphs.
_LOOP_CACHE_VERSION = 2
# The same for graphs with cuDNN RNN ops (fused_rnn.py costs them since version 1).
_RNN_CACHE_VERSION = 1


def profile(op_graph: OpGraph, cluster: Cluster | str, source: str | os.PathLike = "analytical",
            cache_dir: str | os.PathLike | None = None, use_cache: bool = True) -> CostProfile:
    """Per-op compute seconds of `op_graph` on every device kind of `cluster`.

    Args:
      op_graph: an OpGraph from tp.import_graph (not a grouped graph: profile the op graph and
        use `CostProfile.grouped`).
      cluster: a Cluster or a name ("4xV100", "local:2").
      source: "analytical" (grappler's cost model for the cluster's declared devices; works for
        any cluster), "measured" (traced runs; needs the cluster's device kinds on this machine),
        or the path of a saved CostProfile for this graph.
      cache_dir: where analytical and measured profiles are cached (default $TFPLACETO_CACHE_DIR,
        else ~/.cache/tfplaceto).
      use_cache: False neither reads nor writes the cache.

    Returns a CostProfile with one column per device kind of the cluster, in `cluster.kinds` order.

    Raises:
      CostProfileError: unknown source, unreadable or mismatched saved profile, a grouped graph,
        or a measured profile for devices this machine does not have.
    """
    cluster = as_cluster(cluster)
    if not isinstance(op_graph, OpGraph):
        raise errors.CostProfileError(
            f"expected a tfplaceto OpGraph, got {type(op_graph).__name__}; import the graph first "
            "(tp.import_graph)")
    warn_if_other_implementation(op_graph, cluster)
    if isinstance(source, str) and source in SOURCES:
        profiled_graph_def(op_graph)  # a grouped graph fails here, before any cache lookup
        path = _cache_path(op_graph, cluster, source, cache_dir) if use_cache else None
        cached = _read_cache(path, op_graph, cluster) if path else None
        if cached is not None:
            return cached
        if source == "analytical":
            result = analytical.analytical_profile(op_graph, cluster)
        else:
            result = measured.measured_profile(op_graph, cluster)
        if path:
            _write_cache(path, result)
        return result
    return load_profile(source, op_graph, cluster)


def load_profile(path: str | os.PathLike, op_graph: OpGraph, cluster: Cluster | str) -> CostProfile:
    """A saved CostProfile checked against the graph and cluster, columns in `cluster.kinds` order.

    Raises CostProfileError if the file is missing or not a CostProfile, covers other ops, or
    lacks a device kind of the cluster. A profile made for the same op names but a different
    graph fingerprint (e.g. another batch size) is accepted with a warning.
    """
    cluster = as_cluster(cluster)
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise errors.CostProfileError(
            f"cost profile source {path!r} is neither {' nor '.join(repr(s) for s in SOURCES)} nor "
            "an existing CostProfile file; pass source='analytical', source='measured', or the path "
            "of a profile saved with CostProfile.save")
    loaded = _load(path)
    _check(loaded, op_graph, cluster, path)
    if loaded.graph_fingerprint and loaded.graph_fingerprint != op_graph.fingerprint():
        warnings.warn(
            f"cost profile {path} was made for a graph with the same ops but different sizes "
            f"(fingerprint {loaded.graph_fingerprint}, this graph {op_graph.fingerprint()}); "
            "re-profile if tensor shapes changed", stacklevel=2)
    return _select_kinds(loaded, cluster)


def warn_if_other_implementation(op_graph: OpGraph, cluster: Cluster) -> None:
    """ImplementationWarning when op_graph keeps another implementation of a Keras LSTM/GRU than
    TensorFlow runs on the cluster's device type (`tfplaceto.graph.implementations`)."""
    target = target_device_type(cluster)
    other = [c for c in op_graph.implementations if (c.device_type or "CPU") != target]
    if not other:
        return
    kernels = sorted({c.kernel for c in other})
    layers = ", ".join(c.layer for c in other[:3]) + (", ..." if len(other) > 3 else "")
    warnings.warn(
        f"the graph keeps the {'/'.join(kernels)} implementation of {len(other)} Keras RNN "
        f"layer(s) ({layers}), but on {cluster.name!r} ({target}) TensorFlow runs the other one; "
        f"import it with tp.import_graph(..., cluster={cluster.name!r}) to cost what runs",
        errors.ImplementationWarning, stacklevel=3)


def default_cache_dir() -> str:
    """$TFPLACETO_CACHE_DIR, else ~/.cache/tfplaceto."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "tfplaceto")


def _cache_path(op_graph: OpGraph, cluster: Cluster, source: str,
                cache_dir: str | os.PathLike | None) -> str:
    directory = os.fspath(cache_dir) if cache_dir is not None else default_cache_dir()
    loops = f"-loops{_LOOP_CACHE_VERSION}" if op_graph.has_loops else ""
    if any(kind in fused_rnn.RNN_OPS for kind in op_graph.types):
        loops += f"-rnn{_RNN_CACHE_VERSION}"
    name = f"{op_graph.fingerprint()}-{cluster.fingerprint()}-{source}-v{_CACHE_VERSION}{loops}.pb"
    return os.path.join(directory, name)


def _read_cache(path: str, op_graph: OpGraph, cluster: Cluster) -> CostProfile | None:
    if not os.path.isfile(path):
        return None
    try:
        cached = _load(path)
        _check(cached, op_graph, cluster, path)
    except errors.CostProfileError:
        return None  # corrupted or stale: recomputed and rewritten by the caller
    if cached.graph_fingerprint != op_graph.fingerprint() or cached.device_kinds != cluster.kinds:
        return None
    return cached


def _write_cache(path: str, result: CostProfile) -> None:
    try:
        result.save(path)
    except OSError as e:
        # The cache is an optimization: a read-only home or full disk must not fail profiling.
        warnings.warn(f"cannot write the cost profile cache {path}: {e.strerror or e}; set "
                      f"{CACHE_ENV} to a writable directory", stacklevel=3)


def _load(path: str) -> CostProfile:
    try:
        return CostProfile.load(path)
    except errors.CostProfileError:
        raise
    except (ValueError, TypeError) as e:  # a proto that parses but holds ragged rows
        raise errors.CostProfileError(f"{path} is not a valid tfplaceto CostProfile: {e}") from None


def _check(loaded: CostProfile, op_graph: OpGraph, cluster: Cluster, path: str) -> None:
    if tuple(op_graph.names) != loaded.op_names:
        raise errors.CostProfileError(
            f"cost profile {path} covers {len(loaded.op_names)} ops that are not this graph's "
            f"{op_graph.num_ops} ops; profile this graph (tp.profile(op_graph, cluster))")
    missing = [kind for kind in cluster.kinds if kind not in loaded.device_kinds]
    if missing:
        raise errors.CostProfileError(
            f"cost profile {path} has no costs for device kinds {missing} of cluster "
            f"{cluster.name!r} (it has {list(loaded.device_kinds)}); profile the graph for this "
            "cluster")


def _select_kinds(loaded: CostProfile, cluster: Cluster) -> CostProfile:
    if loaded.device_kinds == cluster.kinds:
        return loaded
    columns = [loaded.device_kinds.index(kind) for kind in cluster.kinds]
    return CostProfile(loaded.op_names, cluster.kinds, loaded.compute_s[:, columns], loaded.source,
                       loaded.graph_fingerprint)


__all__ = ["CACHE_ENV", "SOURCES", "CostProfile", "analytical_profile", "default_cache_dir",
           "load_profile", "measured_profile", "profile"]
