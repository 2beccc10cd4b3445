"""`tp.measure`: the real step time of a placed graph, on this process's devices or a TF cluster.

- `measure(graph, placement, target=None, runs=10)`: writes the placement into the GraphDef
  (`apply_placement`), checks every device it names exists on the target, runs `warmup` steps
  and then `runs` timed steps in a Session with soft placement off, and returns the median.
- `measure_many(graph, placements, target, rounds=3, runs=5)`: several placements measured in
  interleaved rounds (each round in a new shuffled order), so a burst of load from elsewhere
  spreads over all placements instead of inflating one; per placement the median of every
  step and the spread of its round medians.
- `MeasureResult`: the median, every step time, the target's description, the devices used, and
  the spread: how far repeated measurements of the placement disagree.
- `MeasurementWarning`: warned when a spread exceeds the stated margin (`max_spread`, default
  `DEFAULT_MAX_SPREAD` = 10%): the figure is then not to be trusted to that margin.
- `graph_parts(graph)`: (GraphDef, fetches, variable values) of an OpGraph or a GraphDef.
- `map_run_error(error, target)`: a TensorFlow runtime error as tfplaceto's typed error.

What a timed step includes: every op of the fetches' fan-in on its device and the transfers
between devices (Send/Recv, over gRPC between tasks). Inputs are held in variables on their
placeholders' devices by default (`inputs_on_device`), as an input pipeline on the workers would
hold them, and fetch ops run as targets, so no step ships inputs from or outputs to the client.
The client's RunStep round trip to the master is included (it is part of every real step).
"""

from __future__ import annotations

import dataclasses
import statistics
import warnings

import numpy as np

from tfplaceto import checks, errors
from tfplaceto.graph.node_defs import parse_input
from tfplaceto.graph.op_graph import OpGraph
from tfplaceto.measure.session import inputs_as_variables, random_feeds, run_placed
from tfplaceto.measure.tf_cluster import TFTarget, as_target
from tfplaceto.rewrite import apply_placement

_MAX_RUNS = 10**6  # a million timed steps is already days of a real model

_LOCAL_CPU = "/job:localhost/replica:0/task:0/device:CPU:"
# Repeated measurements of one placement further apart than this (relative to their median)
# are warned about.
DEFAULT_MAX_SPREAD = 0.10
_MIN_STEPS_FOR_SPREAD = 5


class MeasurementWarning(UserWarning):
    """Repeated measurements of one placement differ by more than the stated margin."""


@dataclasses.dataclass(frozen=True)
class MeasureResult:
    """Real step times of one placement.

    step_time_s   median of `step_times_s`.
    step_times_s  wall time of each timed step (client Session.run), in run order.
    target        where it ran ("local:2", "LocalTFCluster(2 tasks, grpc://localhost:1234)").
    devices       the devices the placed graph uses.
    spread        how far repeated measurements disagree, relative to the median: (max - min) /
                  median of the round medians (`measure_many`, `rounds` > 1), else (90th - 10th
                  percentile) / median of the steps.
    round_times_s  the median step of each round (`measure_many`), in round order.
    """

    step_time_s: float
    step_times_s: list[float]
    target: str
    devices: tuple[str, ...] = ()
    spread: float = 0.0
    round_times_s: tuple[float, ...] = ()

    def __repr__(self) -> str:
        return (f"MeasureResult({self.step_time_s * 1e3:.3f} ms median of {len(self.step_times_s)} "
                f"steps on {self.target})")


def measure(graph_def_or_op_graph, placement, target=None, runs: int = 10, *, warmup: int = 2,
            seed: int = 0, config=None, inputs_on_device: bool = True,
            max_spread: float | None = DEFAULT_MAX_SPREAD) -> MeasureResult:
    """Measures the step time of a placed graph for real.

    Args:
      graph_def_or_op_graph: an OpGraph from `tp.import_graph` (its GraphDef, fetches and
        variable values are used) or a GraphDef (fetches: its sinks; variables start random).
      placement: a Placement or a dict op name -> device name; ops it does not name follow
        their neighbours (`apply_placement`).
      target: None or "local" (this process, with as many logical CPUs as the placement uses),
        "local:N", a LocalTFCluster, a RemoteTFCluster, a "grpc://host:port" master of a running
        cluster, or a tf.train.ClusterSpec of one.
      runs: timed steps (after `warmup` untimed ones: kernel selection, allocator growth).
      seed: of the random inputs and of the random values of variables without known values.
      config: a tf ConfigProto merged over the target's (e.g. to turn grappler off); soft
        placement stays off whatever it says.
      inputs_on_device: hold inputs in variables on their devices (True) or feed them from the
        client every step (False).
      max_spread: warn (MeasurementWarning) when the steps' 10th-90th percentile width exceeds
        this fraction of the median (None: never; not checked for fewer than 5 steps).

    Raises:
      InvalidGraphError: not a graph, a grouped OpGraph, an empty placement, unknown input
        shapes, or the graph fails while running.
      InvalidClusterError: a bad or unreachable target, or the placement names a device the
        target does not have.
      UnplaceableError: an op has no kernel for the device it was placed on.
      InvalidArgumentError: runs not in 1..10**6 or warmup not in 0..10**6 (ints, not bools).
    """
    runs = checks.check_int("measure runs", runs, 1, _MAX_RUNS)
    warmup = checks.check_int("measure warmup", warmup, 0, _MAX_RUNS)
    graph_def, fetches, variable_values = graph_parts(graph_def_or_op_graph)
    placed = apply_placement(graph_def, placement)
    used = placed_devices(placed)
    local_cpus = [int(d[len(_LOCAL_CPU):]) for d in used if d.startswith(_LOCAL_CPU)]
    resolved = as_target(target, min_cpus=max(local_cpus, default=0) + 1)
    check_devices(used, resolved)
    session_config = resolved.session_config()
    if config is not None:
        session_config.MergeFrom(config)
    session_config.allow_soft_placement = False  # the placement is what is measured

    feeds = random_feeds(placed, seed)
    values = dict(variable_values)
    if inputs_on_device:
        placed, input_values = inputs_as_variables(placed, feeds)
        values.update(input_values)
        feeds = {}
    result = run_or_raise(resolved, placed, fetches, session_config, values, feeds, runs, warmup,
                          seed=seed)
    times = list(result.run_times_s)
    median = statistics.median(times)
    spread = float(np.subtract(*np.percentile(times, [90, 10])) / median) if median > 0 else 0.0
    if len(times) >= _MIN_STEPS_FOR_SPREAD:  # the percentiles of two or three steps say little
        _warn_spread(spread, max_spread, f"the {len(times)} steps", resolved.description)
    return MeasureResult(median, times, resolved.description, used, spread)


def measure_many(graph_def_or_op_graph, placements, target=None, rounds: int = 3, runs: int = 5, *,
                 warmup: int = 2, seed: int = 0, config=None, inputs_on_device: bool = True,
                 max_spread: float | None = DEFAULT_MAX_SPREAD, progress=None) -> dict:
    """Measures several placements of one graph in interleaved rounds.

    Args:
      placements: a mapping label -> placement (as `measure` takes).
      rounds: rounds over all placements, each in a new order (shuffled with `seed`).
      runs, warmup, seed, config, inputs_on_device: per placement and round, as in `measure`.
      max_spread: warn (MeasurementWarning) for each placement whose round medians differ by more
        than this fraction of their median (None: never).
      progress: called as progress("measure", done, total) after each placement and round.

    Returns label -> MeasureResult: `step_time_s` the median of all its steps, `round_times_s`
    each round's median, `spread` (max - min) / median of those.
    """
    rounds = checks.check_int("measure rounds", rounds, 1, _MAX_RUNS)
    if not placements:
        raise errors.InvalidGraphError("measure_many needs at least one placement")
    labels = list(placements)
    steps: dict = {label: [] for label in labels}
    medians: dict = {label: [] for label in labels}
    found: dict = {}
    rng = np.random.default_rng(seed)
    done = 0
    for _ in range(rounds):
        for k in rng.permutation(len(labels)):
            label = labels[k]
            result = measure(graph_def_or_op_graph, placements[label], target, runs, warmup=warmup,
                             seed=seed, config=config, inputs_on_device=inputs_on_device,
                             max_spread=None)
            steps[label] += result.step_times_s
            medians[label].append(result.step_time_s)
            found[label] = result
            done += 1
            if progress is not None:
                progress("measure", done, rounds * len(labels))
    results = {}
    for label in labels:
        median = statistics.median(steps[label])
        spread = float(np.ptp(medians[label]) / median) if median > 0 else 0.0
        _warn_spread(spread, max_spread, f"{rounds} rounds of placement {label!r}", found[label].target)
        results[label] = MeasureResult(median, steps[label], found[label].target, found[label].devices,
                                       spread, tuple(medians[label]))
    return results


def _warn_spread(spread: float, max_spread: float | None, what: str, where: str) -> None:
    if max_spread is not None and spread > max_spread:
        warnings.warn(
            f"{what} on {where} differ by {spread:.0%} of their median (more than {max_spread:.0%}): "
            "the host is noisy (other processes, frequency scaling); measure more rounds or on a "
            "quieter machine before trusting differences this small", MeasurementWarning, stacklevel=3)


def graph_parts(graph) -> tuple:
    """(GraphDef, fetch op names, variable values) of an OpGraph or a GraphDef."""
    import tensorflow as tf

    if isinstance(graph, OpGraph):
        if graph.graph_def is None:
            raise errors.InvalidGraphError(
                "this OpGraph has no GraphDef (a grouped graph?); measure the op-level graph from "
                "tp.import_graph with an op-level placement (Grouping.expand maps group devices to ops)")
        return graph.graph_def, tuple(graph.fetches), dict(graph.variable_values)
    if isinstance(graph, tf.compat.v1.GraphDef):
        if not graph.node:
            raise errors.InvalidGraphError("the GraphDef has no nodes")
        consumed = {parse_input(i)[0] for node in graph.node for i in node.input}
        return graph, tuple(n.name for n in graph.node if n.name not in consumed), {}
    raise errors.InvalidGraphError(
        f"measure expects a GraphDef or a tfplaceto OpGraph, got {type(graph).__name__}")


def placed_devices(graph_def) -> tuple[str, ...]:
    """Sorted distinct devices of a placed GraphDef's nodes and function bodies."""
    devices = {n.device for n in graph_def.node}
    devices.update(n.device for f in graph_def.library.function for n in f.node_def)
    devices.discard("")
    return tuple(sorted(devices))


def check_devices(used, target: TFTarget) -> None:
    """InvalidClusterError naming the devices of `used` that `target` does not have."""
    available = set(target.devices)
    missing = [d for d in used if d not in available]
    if missing:
        raise errors.InvalidClusterError(
            f"the placement uses {', '.join(missing)}, which {target.description} does not have "
            f"(its devices: {', '.join(sorted(available))}); place on the target's devices "
            "(target.cluster())")


def run_or_raise(target: TFTarget, graph_def, fetches, config, variable_values, feeds, runs: int,
                 warmup: int, trace: bool = False, seed: int = 0):
    """`run_placed` on `target`, with TensorFlow's runtime errors mapped to typed errors."""
    import tensorflow as tf

    try:
        return run_placed(graph_def, fetches, target.target, config, variable_values, feeds,
                          runs=runs, warmup=warmup, trace=trace, seed=seed)
    except tf.errors.OpError as e:
        raise map_run_error(e, target.description) from None


def check_rounds(rounds: int, runs: int, warmup: int) -> tuple[int, int, int]:
    """A calibration's rounds, timed runs and warmup steps, checked (TfplacetoError if not ints in range)."""
    return (checks.check_int("calibration rounds", rounds, 1, 10**4),
            checks.check_int("calibration runs", runs, 1, 10**4),
            checks.check_int("calibration warmup", warmup, 0, 10**4))


def without_grappler(config):
    """`config` with grappler and the graph optimizer off (returned): the graph runs as built (a
    calibration's NoOps and chains are not pruned or folded)."""
    import tensorflow as tf

    config.graph_options.rewrite_options.disable_meta_optimizer = True
    config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    return config


def time_variants(target: TFTarget, graph, config, inits, variants, rounds: int, runs: int,
                  warmup: int, seed: int, progress=None, stage: str = "") -> dict:
    """Times the variants of a calibration graph on `target` in interleaved rounds.

    `variants`: (key, the ops one step runs) pairs. In one Session: `inits` once, `warmup`
    untimed steps of each variant, then `rounds` rounds, each over every variant in a new order
    (shuffled with `seed`), `runs` timed steps per variant. Returns key -> its step times (s),
    one list per round and occurrence of the key; `progress(stage, done, total)` after each
    variant of a round.
    TensorFlow's runtime errors are raised as typed errors (`map_run_error`).
    """
    import time

    import tensorflow as tf

    variants = list(variants)
    times: dict = {key: [] for key, _ in variants}
    rng = np.random.default_rng(seed)
    total, done = rounds * len(variants), 0
    try:
        with tf.compat.v1.Session(target.target, graph=graph, config=config) as session:
            session.run(inits)
            for _, ops in variants:
                for _ in range(warmup):
                    session.run(ops)
            for _ in range(rounds):
                for k in rng.permutation(len(variants)):
                    (key, ops), steps = variants[k], []
                    for _ in range(runs):
                        start = time.perf_counter()
                        session.run(ops)
                        steps.append(time.perf_counter() - start)
                    times[key].append(steps)
                    done += 1
                    if progress is not None:
                        progress(stage, done, total)
    except tf.errors.OpError as e:
        raise map_run_error(e, target.description) from None
    return times


def map_run_error(error, where: str) -> errors.TfplacetoError:
    """The typed error for a TensorFlow runtime error raised while running on `where`."""
    import tensorflow as tf

    text = str(getattr(error, "message", "") or error)
    first = errors.first_line(error)
    if isinstance(error, tf.errors.InvalidArgumentError) and "Cannot assign a device" in text:
        return errors.UnplaceableError(
            f"an op cannot run where it was placed on {where}: {first}; place it on a device "
            "type that has a kernel for it")
    if isinstance(error, tf.errors.UnavailableError | tf.errors.DeadlineExceededError
                  | tf.errors.CancelledError | tf.errors.AbortedError):
        return errors.InvalidClusterError(
            f"{where} failed or timed out while measuring: {first}; check that its servers are "
            "running and reachable")
    return errors.InvalidGraphError(f"the placed graph failed on {where}: {first}")


__all__ = ["DEFAULT_MAX_SPREAD", "MeasureResult", "MeasurementWarning", "check_devices", "check_rounds",
           "graph_parts", "map_run_error", "measure", "measure_many", "placed_devices", "run_or_raise",
           "time_variants", "without_grappler"]
