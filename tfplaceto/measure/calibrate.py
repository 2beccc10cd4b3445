"""Calibration: the link and op figures of a real target, measured, for the simulator.

- `measure_transfers(target)`: for every ordered device pair (A, B):
  * per size, the time a tensor of that size takes from A to B: the step time of "read a
    variable on A, reduce it on B" minus the step time of "read it on A, reduce it on A" (same
    work, no transfer);
  * per unordered pair, the latency of one hop: a chain of m small tensors bounced A -> B -> A ...
    (each hop waits for the previous one) minus the same chain on A alone, over several m; the
    slope over m is the cost of one crossing.
  Each time is the fastest of `runs` interleaved steps: load from other processes only adds.
- `fit_link(transfers)`: bandwidth from a least-squares fit of latency + bytes / bandwidth to the
  sized transfers; latency from the hop chains.
- `calibrate_links(target)`: both, for every pair -> a list of Links.
- `calibrated_cluster(target)`: the target's Cluster with those links.
- `calibrate_cluster(target)`: everything `tfplaceto calibrate` measures: links, each device's
  speed and the contention between devices sharing a host (`tfplaceto.measure.devices`), and the
  runtime's own costs: control hops, the fixed costs of a step, whether a task's sends wait for
  it to be idle (`tfplaceto.measure.runtime`), as one Cluster to save and pass as `--cluster`.
- `calibrate_op_costs(op_graph, target)`: a CostProfile of per-op times traced on the target's
  own devices (a worker task's pinned cores and thread pools, not this process's).
- `untraced_steps(op_graph, target)` and `scale_to_untraced(profile, steps, fixed_s)`: the same
  graph's steps timed without tracing, and the profile scaled to them. The traced op times need
  not add up to the real step: on the 2-task loopback cluster the CNN's summed to 3% less to 22%
  more than its untraced step in different runs (more when the host was loaded while tracing),
  the attention block's to 4-11% less (mostly the step's fixed cost, which the trace does not see).

Why two measurements: a step with one transfer between two TF tasks also pays a fixed cost for
running on a second task at all (the master's extra RunGraph call), once per step. The intercept
of the sized fit holds that cost plus one latency; a step with many crossings pays the fixed cost
once and the hop latency per crossing, which is what the simulator charges per transfer.

A variable read is what crosses the link: it is produced anew every step (nothing is cached or
constant-folded), and the reduction returns a scalar, so the only bytes moved are the tensor's.
Grappler is off for these graphs: it would remove the identity chains.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence

import numpy as np

from tfplaceto import errors
from tfplaceto.cluster import DEVICE_TYPES, Cluster, Link
from tfplaceto.costs.cost_profile import CostProfile
from tfplaceto.graph.from_graph_def import colocated_kernels
from tfplaceto.graph.op_graph import OpGraph
from tfplaceto.measure.devices import DeviceTimes, host_groups, measure_devices
from tfplaceto.measure.measure import graph_parts, map_run_error, run_or_raise, without_grappler
from tfplaceto.measure.runtime import RuntimeCosts, measure_runtime
from tfplaceto.measure.session import inputs_as_variables, random_feeds
from tfplaceto.measure.tf_cluster import TFTarget, as_target
from tfplaceto.rewrite import apply_placement

KIB, MIB = 2**10, 2**20
DEFAULT_SIZES = (1 * KIB, 16 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB)
DEFAULT_HOPS = (2, 8, 32)
# Figures a fit cannot resolve (a zero-copy link, a latency below the timing noise) are reported
# as these bounds, so every link stays a valid, positive Link.
MAX_BANDWIDTH = 1e12  # bytes/s
MIN_LATENCY = 1e-7  # s
_HOP_BYTES = 4  # a float32 scalar bounces along the chains


@dataclasses.dataclass(frozen=True)
class TransferTimes:
    """Timed transfers over one directed device pair.

    sizes_bytes    tensor sizes sent.
    seconds        transfer time per size: fastest step with the transfer minus fastest without.
    with_s, without_s  the two fastest steps per size.
    hops           chain lengths timed for the hop latency (empty: not measured).
    hop_seconds    per chain length: fastest chain across the pair minus fastest chain on src.
    hop_latency_s  least-squares slope of hop_seconds over hops: one crossing (None: not measured).
    """

    src: str
    dst: str
    sizes_bytes: tuple[int, ...]
    seconds: tuple[float, ...]
    with_s: tuple[float, ...]
    without_s: tuple[float, ...]
    hops: tuple[int, ...] = ()
    hop_seconds: tuple[float, ...] = ()
    hop_latency_s: float | None = None


def measure_transfers(target, sizes: Sequence[int] = DEFAULT_SIZES, runs: int = 10, warmup: int = 1,
                      devices: Sequence[str] | None = None,
                      hops: Sequence[int] = DEFAULT_HOPS, progress=None) -> list[TransferTimes]:
    """Times transfers of each size, and hop chains, between every ordered pair of devices.

    Args:
      target: a LocalTFCluster, RemoteTFCluster, "local:N", "grpc://..." (see tp.measure).
      sizes: tensor sizes in bytes (multiples of 4: float32 tensors).
      runs: timed steps per (pair, size) and per variant; the fastest counts (see `_fastest`).
      warmup: untimed steps per variant first.
      devices: a subset of the target's devices (default: all).
      hops: chain lengths for the hop latency (at least two distinct ones; () skips it).
      progress: called as progress("links", done, total) after each timed batch.
    """
    import tensorflow as tf

    target = _target(target)
    devices = tuple(devices) if devices is not None else target.devices
    unknown = [d for d in devices if d not in target.devices]
    if unknown or len(devices) < 2:
        raise errors.InvalidClusterError(
            f"calibration needs >= 2 devices of {target.description}; got {list(devices)} "
            f"(unknown: {unknown}; the target has {list(target.devices)})")
    sizes = tuple(int(s) for s in sizes)
    hops = tuple(int(m) for m in hops)
    if (not sizes or any(s < 4 for s in sizes) or runs < 1 or warmup < 0
            or (hops and (len(set(hops)) < 2 or min(hops) < 1))):
        raise errors.TfplacetoError(
            f"need sizes >= 4 bytes, runs >= 1, warmup >= 0 and two or more distinct hop counts "
            f">= 1 (or none); got sizes={sizes}, runs={runs}, warmup={warmup}, hops={hops}")
    graph, inits, sums, chains = _transfer_graph(devices, sizes, hops)
    config = without_grappler(target.session_config())
    fastest = np.zeros((len(devices), len(sizes), len(devices)))
    hop_latency: dict[tuple[int, int], tuple[tuple[float, ...], float]] = {}
    try:
        with tf.compat.v1.Session(target.target, graph=graph, config=config) as session:
            session.run(inits)
            total, done = len(devices) * len(sizes) + len(chains), 0
            for i in range(len(devices)):
                for k in range(len(sizes)):
                    fastest[i, k] = _fastest(session, sums[i][k], runs, warmup)
                    done += 1
                    if progress is not None:
                        progress("links", done, total)
            for (i, j), per_length in chains.items():
                extra = [b - a for a, b in (_fastest(session, ops, runs, warmup)
                                            for ops in per_length)]
                hop_latency[i, j] = (tuple(extra), float(np.polyfit(hops, extra, 1)[0]))
                done += 1
                if progress is not None:
                    progress("links", done, total)
    except tf.errors.OpError as e:
        raise map_run_error(e, target.description) from None
    result = []
    for i, src in enumerate(devices):
        for j, dst in enumerate(devices):
            if i == j:
                continue
            extra, latency = hop_latency.get((min(i, j), max(i, j)), ((), None))
            result.append(TransferTimes(
                src, dst, sizes, tuple(fastest[i, :, j] - fastest[i, :, i]),
                tuple(fastest[i, :, j]), tuple(fastest[i, :, i]), hops if extra else (), extra, latency))
    return result


def fit_transfer_model(transfers: TransferTimes) -> tuple[float, float]:
    """(intercept seconds, bandwidth bytes/s) of seconds = intercept + bytes / bandwidth.

    Weighted least squares on relative error (weights 1 / predicted time, iterated): an
    unweighted fit would let the largest, slowest transfers decide the intercept too. A slope
    that is not positive (no per-byte cost measurable, e.g. logical CPUs sharing memory) gives
    MAX_BANDWIDTH.
    """
    x = np.asarray(transfers.sizes_bytes, dtype=float)
    y = np.asarray(transfers.seconds, dtype=float)
    if len(x) >= 2 and np.ptp(x) > 0:
        weights = np.ones_like(y)
        for _ in range(5):
            slope, intercept = np.polyfit(x, y, 1, w=weights)
            predicted = intercept + slope * x
            weights = 1.0 / np.maximum(predicted, max(float(np.max(np.abs(y))) * 1e-3, 1e-9))
    else:
        slope, intercept = 0.0, float(np.mean(y))
    bandwidth = 1.0 / slope if slope > 1.0 / MAX_BANDWIDTH else MAX_BANDWIDTH
    return float(intercept), float(bandwidth)


def fit_link(transfers: TransferTimes) -> Link:
    """A Link: bandwidth from `fit_transfer_model`, latency from the hop chains.

    Without hop chains the fit's intercept is the latency (it then also holds the fixed cost of a
    step using a second task). A latency below MIN_LATENCY gives MIN_LATENCY.
    """
    intercept, bandwidth = fit_transfer_model(transfers)
    latency = transfers.hop_latency_s if transfers.hop_latency_s is not None else intercept
    return Link(transfers.src, transfers.dst, bandwidth, float(max(latency, MIN_LATENCY)))


def calibrate_links(target, sizes: Sequence[int] = DEFAULT_SIZES, runs: int = 10, warmup: int = 1,
                    hops: Sequence[int] = DEFAULT_HOPS, progress=None) -> list[Link]:
    """A measured Link (bandwidth, latency) for every ordered pair of the target's devices.

    target: a LocalTFCluster, a RemoteTFCluster, "local:N" or "grpc://host:port". See
    `measure_transfers` for the method and `fit_link` for the fit.
    """
    return [fit_link(t) for t in measure_transfers(target, sizes, runs, warmup, hops=hops, progress=progress)]


def calibrated_cluster(target, sizes: Sequence[int] = DEFAULT_SIZES, runs: int = 10,
                       hops: Sequence[int] = DEFAULT_HOPS) -> Cluster:
    """The target's Cluster (`target.cluster()`) with calibrated links between all its devices."""
    target = _target(target)
    return target.cluster(calibrate_links(target, sizes, runs, hops=hops))


def calibrate_cluster(target, *, sizes: Sequence[int] = DEFAULT_SIZES, runs: int = 10,
                      hops: Sequence[int] = DEFAULT_HOPS, rounds: int = 5, device_runs: int = 5,
                      contention: bool = True, seed: int = 0, progress=None,
                      device_times: DeviceTimes | None = None,
                      links: Sequence[Link] | None = None,
                      runtime: RuntimeCosts | bool = True) -> Cluster:
    """The target's Cluster with everything measured: links, device speeds, contention, the
    runtime's costs.

    Args:
      target: a TFTarget, "local", "local:N", "grpc://host:port" or a ClusterSpec (as_target).
      sizes, runs, hops: the link calibration (`calibrate_links`; skipped for one device).
      rounds, device_runs: interleaved rounds and timed steps per round of the reference chain
        (`tfplaceto.measure.devices.measure_devices`).
      contention: measure contention between devices sharing a host (False: speeds only).
      seed: of the reference chain's weights and the rounds' order.
      progress: called as progress(stage, done, total), stage "links" or "devices".
      device_times: already measured DeviceTimes to use instead of measuring again.
      links: already calibrated links to use instead of measuring again.
      runtime: already measured RuntimeCosts; True (default) measures them
        (`tfplaceto.measure.runtime.measure_runtime`, `rounds` x `device_runs` steps); False
        leaves them out (no control hop, no fixed step cost, sends never wait).

    Devices get `compute_scale` = their reference-chain time over the first device of their kind;
    hosts whose devices measurably slow each other down become ContentionGroups.
    """
    target = as_target(target)
    names = target.devices
    if links is None:
        links = calibrate_links(target, sizes, runs, hops=hops, progress=progress) if len(names) >= 2 else []
    base = target.cluster(links)
    if device_times is None:
        groups = host_groups(target) if contention else []
        device_times = measure_devices(target, names, groups, rounds=rounds, runs=device_runs,
                                       seed=seed, progress=progress)
    scales = device_times.compute_scales({d.name: d.kind for d in base.devices})
    devices = [dataclasses.replace(d, compute_scale=float(scales.get(d.name, 1.0))) for d in base.devices]
    groups = device_times.contention() if contention else []
    cluster = Cluster(devices, base.links(), name=f"calibrated {target.description}", contention=groups)
    if runtime is True:
        runtime = measure_runtime(target, names, rounds=rounds, runs=device_runs, seed=seed, progress=progress)
    return runtime.apply(cluster) if runtime else cluster


def calibrate_op_costs(op_graph: OpGraph, target, runs: int = 5, warmup: int = 2,
                       cluster: Cluster | None = None) -> CostProfile:
    """Per-op compute seconds traced on the target's devices, one column per device kind.

    For each device kind of `cluster` (default `target.cluster()`), every op runs on the first
    target device of that kind (ops without a kernel there go to that task's CPU:0) and each op's
    time is the median over `runs` traced steps (RunMetadata step stats, as
    tfplaceto.costs.measured reads them). Unlike `tp.profile(..., source="measured")`, which
    runs in this process, the ops run under the worker's own conditions: its pinned cores and
    thread pools, and whatever else the host runs at the same time.
    """
    # Imported here: costs.measured sets variables up with measure.session, and this package's
    # __init__ imports this module, so a module-level import would be a cycle.
    from tfplaceto.costs.measured import op_seconds

    target = _target(target)
    cluster = cluster if cluster is not None else target.cluster()
    if not isinstance(op_graph, OpGraph):
        raise errors.CostProfileError("calibrate_op_costs needs an OpGraph (tp.import_graph)")
    index = {name: i for i, name in enumerate(op_graph.names)}
    compute = np.zeros((op_graph.num_ops, len(cluster.kinds)))
    for k, (placed, fetches, values, config) in enumerate(_per_kind(op_graph, target, cluster)):
        result = run_or_raise(target, placed, fetches, config, values, {}, runs, warmup, trace=True)
        samples = np.zeros((runs, op_graph.num_ops))
        for r, step_stats in enumerate(result.step_stats):
            for name, seconds in op_seconds(step_stats).items():
                if name.endswith("/tfplaceto_input"):
                    continue
                i = index.get(name)
                if i is not None:
                    samples[r, i] = seconds
        compute[:, k] = np.median(samples, axis=0)
    return CostProfile(tuple(op_graph.names), cluster.kinds, compute,
                       f"traced on {target.description} (median of {runs} runs)", op_graph.fingerprint())


def untraced_steps(op_graph: OpGraph, target, runs: int = 10, warmup: int = 2,
                   cluster: Cluster | None = None) -> dict[str, float]:
    """kind -> median seconds of an untraced step of op_graph on the kind's first device, placed
    as `calibrate_op_costs` traces it (the client's step time, fixed costs included)."""
    target = _target(target)
    cluster = cluster if cluster is not None else target.cluster()
    if not isinstance(op_graph, OpGraph):
        raise errors.CostProfileError("untraced_steps needs an OpGraph (tp.import_graph)")
    steps = {}
    for kind, (placed, fetches, values, config) in zip(cluster.kinds, _per_kind(op_graph, target, cluster)):
        result = run_or_raise(target, placed, fetches, config, values, {}, runs, warmup)
        steps[kind] = float(np.median(result.run_times_s))
    return steps


def scale_to_untraced(profile: CostProfile, steps: dict[str, float], fixed_s: float = 0.0) -> CostProfile:
    """The profile with each kind's column scaled so that it sums to that kind's untraced step
    (`untraced_steps`) minus `fixed_s` (the cluster's step_overhead_s: what an empty step takes).

    One factor per kind: the time tracing adds or the executor spends between ops is spread over
    the ops in proportion to their traced times. On one device with one op at a time the
    simulated single-device step is then the untraced one.
    """
    compute = np.array(profile.compute_s, dtype=np.float64, copy=True)
    factors = []
    for k, kind in enumerate(profile.device_kinds):
        total = float(compute[:, k].sum())
        if kind in steps and total > 0:
            factor = max(steps[kind] - fixed_s, 0.0) / total
            compute[:, k] *= factor
            factors.append(f"{kind} x{factor:.3f}")
    return dataclasses.replace(profile, compute_s=compute,
                               source=f"{profile.source}, scaled to the untraced step ({', '.join(factors)})")


def _per_kind(op_graph: OpGraph, target: TFTarget, cluster: Cluster):
    """Per device kind of the cluster: (placed GraphDef, fetches, variable values, ConfigProto) of
    op_graph on the kind's first device (ops without a kernel there on its task's CPU:0)."""

    graph_def, fetches, variable_values = graph_parts(op_graph)
    kernels = colocated_kernels(op_graph)
    config = target.session_config()
    # One op at a time, as the simulator runs a device; grappler off so names and ops stay as
    # profiled (the same choices as tfplaceto.costs.measured).
    config.inter_op_parallelism_threads = 1
    without_grappler(config)
    for kind in cluster.kinds:
        device = next(d.name for d in cluster.devices if d.kind == kind)
        if device not in target.devices:
            raise errors.CostProfileError(f"{target.description} has no device {device} ({kind})")
        device_type = device.rsplit("/device:", 1)[1].split(":")[0]
        host = device.rsplit("/device:", 1)[0] + "/device:CPU:0"
        column = DEVICE_TYPES.index(device_type) if device_type in DEVICE_TYPES else None
        placement = {name: device if column is None or kernels[i, column] else host
                     for i, name in enumerate(op_graph.names)}
        placed = apply_placement(graph_def, placement)
        placed, input_values = inputs_as_variables(placed, random_feeds(placed))
        yield placed, fetches, {**variable_values, **input_values}, config


def _target(target) -> TFTarget:
    return as_target(target, min_cpus=2) if target is None or target == "local" else as_target(target)


def _transfer_graph(devices: Sequence[str], sizes: Sequence[int], hops: Sequence[int]):
    """(graph, init ops, sums, chains).

    sums[i][k][j]: the reduction on device j of a variable of sizes[k] bytes on device i.
    chains[i, j] (i < j): per hop count m, (chain on i alone, chain bouncing i -> j -> i ...).
    """
    import tensorflow as tf

    graph = tf.Graph()
    inits, sums, chains = [], [], {}
    with graph.as_default():
        for i, src in enumerate(devices):
            per_size = []
            for k, size in enumerate(sizes):
                with tf.device(src), tf.name_scope(f"src{i}/bytes{size}"):
                    value = _variable(size // 4, f"tfplaceto_calibrate_{i}_{k}", inits)
                row = []
                for j, dst in enumerate(devices):
                    with tf.device(dst):
                        row.append(tf.reduce_sum(value, name=f"src{i}/bytes{size}/sum_on_{j}").op)
                per_size.append(row)
            sums.append(per_size)
        for i, j in itertools.combinations(range(len(devices)), 2):
            per_length = []
            for m in hops:
                with tf.device(devices[i]), tf.name_scope(f"hops{i}_{j}/m{m}"):
                    start = _variable(_HOP_BYTES // 4, f"tfplaceto_hops_{i}_{j}_{m}", inits)
                variants = []
                for bounce in (False, True):
                    x = start
                    for step in range(m):
                        on = devices[j] if bounce and step % 2 == 0 else devices[i]
                        with tf.device(on):
                            x = tf.identity(x, name=f"hops{i}_{j}/m{m}/{'bounce' if bounce else 'stay'}{step}")
                    variants.append(x.op)
                per_length.append(variants)
            chains[i, j] = per_length
    return graph, inits, sums, chains


def _variable(n: int, shared_name: str, inits: list):
    """A read of a new float32 variable of n elements (on the current device)."""
    import tensorflow as tf

    handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[n], shared_name=shared_name)
    inits.append(tf.raw_ops.AssignVariableOp(resource=handle, value=tf.ones([n])))
    return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)


def _fastest(session, ops, runs: int, warmup: int) -> list[float]:
    """Fastest seconds of running each op alone, runs interleaved across the ops.

    Other processes on the host only ever add time (preemption, cache and scheduler delays), so
    the fastest run is the best estimate of the link's own cost; a median would fold the host's
    load into the link figures, and differences of medians turn negative under bursty load.
    """
    samples = [[] for _ in ops]
    for r in range(warmup + runs):
        for op, taken in zip(ops, samples):
            seconds = _timed(session, op)
            if r >= warmup:
                taken.append(seconds)
    return [min(t) for t in samples]


def _timed(session, op) -> float:
    start = time.perf_counter()
    session.run(op)
    return time.perf_counter() - start


__all__ = ["DEFAULT_HOPS", "DEFAULT_SIZES", "TransferTimes", "calibrate_cluster", "calibrate_links",
           "calibrate_op_costs", "calibrated_cluster", "fit_link", "fit_transfer_model", "measure_transfers",
           "scale_to_untraced", "untraced_steps"]
