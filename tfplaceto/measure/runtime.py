"""The runtime's own costs on a target: what a step pays besides its ops and its tensors.

Four figures, each measured with a tiny graph on the target (never assumed; presets have none):

- **step_overhead_s**: a step that runs one NoOp on the first device. Every step pays it (the
  client's RunStep round trip to the master, the master's bookkeeping): about 0.3 ms on a 2-task
  loopback gRPC cluster, a large part of a 5 ms step.
- **task_overhead_s**: a NoOp on the first device and one on a device of another task, minus
  the above (the master's RunGraph call to that task); the median over the other tasks. A step
  pays it for each task it uses other than the first device's.
- **control hop** per ordered device pair (`Link.control_hop_s`): TensorFlow turns a control edge
  between devices into a Send/Recv of a tiny tensor. m NoOps on device A all feeding one NoOp by
  control edges, the sink on B ("cross") or on A ("stay"), for several m: the slope over m of
  cross - stay is what one more edge costs when many are in flight (20-30 us on loopback gRPC,
  against a hop latency of about 100 us for one hop waited for alone: the hops pipeline).
- **sends_wait_idle** per device that has a device of another task to send to: a chain of
  matmuls on A whose input also goes to a second chain on B ("dependent"), against the same two
  chains with B reading its own input ("independent"), and A's chain alone. A task whose
  inter-op pool has one thread (a loopback cluster's tasks pinned to one core each) serves its
  peers' tensor requests on that thread only when its executor has nothing left to run, so B
  waits for A's whole chain: dependent - independent is about one chain. The device is marked
  when that excess is more than half of A's chain alone.

Every variant runs in each of `rounds` rounds (a new shuffled order each round, seeded), `runs`
timed steps per round; a variant's figure is the median of all its steps, as `measure_many`
reports placements. Grappler is off: it would prune the NoOps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from tfplaceto import errors
from tfplaceto.cluster import Cluster, Link
from tfplaceto.measure.measure import check_rounds, time_variants, without_grappler
from tfplaceto.measure.tf_cluster import as_target

DEFAULT_EDGES = (8, 32, 128)
# A device's sends wait for it to be idle when the dependent chains take this much of one
# chain longer than the independent ones (0 when they overlap, about 1 when they do not).
WAIT_THRESHOLD = 0.5
_CHAIN = 16
_SIZE = {"CPU": 256, "GPU": 2048}

Progress = Callable[[str, int, int], None]


@dataclasses.dataclass(frozen=True)
class RuntimeCosts:
    """What `measure_runtime` measured (seconds).

    step_overhead_s    a step running one NoOp on the first device.
    task_overhead_s    what a NoOp on another task adds to it (median over tasks; 0: one task).
    control_hop_s      (src, dst) -> cost of one more control edge crossing src -> dst.
    control_times_s    (src, dst) -> the cross - stay differences per edge count (the fit's data).
    edges              the edge counts timed.
    wait_ratio         device -> (dependent - independent) / its chain alone (see the docstring).
    sends_wait_idle    device -> whether its ratio exceeds WAIT_THRESHOLD.
    """

    step_overhead_s: float
    task_overhead_s: float
    control_hop_s: dict[tuple[str, str], float]
    control_times_s: dict[tuple[str, str], tuple[float, ...]]
    edges: tuple[int, ...]
    wait_ratio: dict[str, float]
    sends_wait_idle: dict[str, bool]

    def apply(self, cluster: Cluster) -> Cluster:
        """The cluster with these figures: control hops on its links, the fixed step costs, and
        `sends_wait_idle` on its devices (figures for devices it lacks are ignored)."""
        links = [Link(link.src, link.dst, link.bandwidth_bytes_per_s, link.latency_s,
                      self.control_hop_s.get((link.src, link.dst), link.control_hop_s))
                 for link in cluster.links()]
        devices = [dataclasses.replace(d, sends_wait_idle=bool(self.sends_wait_idle.get(d.name, d.sends_wait_idle)))
                   for d in cluster.devices]
        return Cluster(devices, links, name=cluster.name, contention=cluster.contention,
                       step_overhead_s=self.step_overhead_s, task_overhead_s=self.task_overhead_s)


def measure_runtime(target, devices: Sequence[str] | None = None, edges: Sequence[int] = DEFAULT_EDGES,
                    rounds: int = 3, runs: int = 5, warmup: int = 2, seed: int = 0,
                    progress: Progress | None = None) -> RuntimeCosts:
    """Times the graphs of the module docstring on `target` and returns the figures.

    Args:
      target: a TFTarget or what `tfplaceto.measure.tf_cluster.as_target` accepts.
      devices: the devices to measure (default: all the target's; the first is the reference
        for the fixed costs, as the session's master runs on its task).
      edges: control edge counts (two or more distinct, >= 1).
      rounds, runs, warmup: interleaved rounds, timed steps per variant and round, untimed steps
        per variant first.
      seed: of the matmul weights and each round's order.
      progress: called as progress("runtime", done, total) after each timed variant.
    """

    target = as_target(target)
    rounds, runs, warmup = check_rounds(rounds, runs, warmup)
    edges = tuple(int(m) for m in edges)
    if len(set(edges)) < 2 or min(edges) < 1:
        raise errors.TfplacetoError(f"need two or more distinct control edge counts >= 1, got {edges}")
    devices = tuple(devices) if devices is not None else tuple(target.devices)
    unknown = [d for d in devices if d not in target.devices]
    if unknown or not devices:
        raise errors.InvalidClusterError(
            f"cannot measure devices {unknown or 'none'} on {target.description} (its devices: "
            f"{', '.join(target.devices)})")
    graph, inits, variants, partners = _runtime_graph(devices, edges, seed)
    times = time_variants(target, graph, without_grappler(target.session_config()), inits,
                          list(variants.items()), rounds, runs, warmup, seed, progress, "runtime")
    samples = {name: [t for steps in per_round for t in steps] for name, per_round in times.items()}  # every step
    median = {name: float(np.median(s)) for name, s in samples.items()}
    step = median[("empty",)]
    task_extra = [median[("empty", d)] - step for d in _other_tasks(devices)]
    hops, hop_times = {}, {}
    for a in devices:
        for b in devices:
            if a != b:
                extra = tuple(median[("control", a, b, m)] - median[("control", a, a, m)] for m in edges)
                hop_times[a, b] = extra
                hops[a, b] = max(float(np.polyfit(edges, extra, 1)[0]), 0.0)
    ratios = {a: (median[("dependent", a, b)] - median[("independent", a, b)]) / median[("alone", a)]
              for a, b in partners.items()}
    return RuntimeCosts(step, max(float(np.median(task_extra)), 0.0) if task_extra else 0.0, hops, hop_times,
                        edges, ratios, {a: bool(r > WAIT_THRESHOLD) for a, r in ratios.items()})


def _task(device: str) -> str:
    return device.split("/device:")[0]


def _other_tasks(devices: Sequence[str]) -> list[str]:
    """The first device of each task other than the first device's."""
    first: dict[str, str] = {}
    for d in devices:
        first.setdefault(_task(d), d)
    return [d for task, d in first.items() if task != _task(devices[0])]


def _runtime_graph(devices: Sequence[str], edges: Sequence[int], seed: int):
    """(graph, init ops, variant -> ops to run, device -> its partner on another task)."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    graph = tf.Graph()
    inits, variants = [], {}
    tasks = list(dict.fromkeys(_task(d) for d in devices))
    first = {task: next(d for d in devices if _task(d) == task) for task in tasks}
    # Each device's partner: the first device of the next task (none on a one-task target).
    partners = {d: first[tasks[(tasks.index(_task(d)) + 1) % len(tasks)]] for d in devices} if len(tasks) > 1 else {}
    with graph.as_default():
        with tf.device(devices[0]):
            empty = tf.no_op(name="tfplaceto_runtime/empty")
        variants[("empty",)] = [empty]
        for i, d in enumerate(_other_tasks(devices)):
            with tf.device(d):
                variants[("empty", d)] = [empty, tf.no_op(name=f"tfplaceto_runtime/empty_{i}")]
        for i, a in enumerate(devices):
            for j, b in enumerate(devices):
                for m in edges:
                    with tf.device(a), tf.name_scope(f"tfplaceto_runtime/control_{i}_{j}_{m}"):
                        senders = [tf.no_op(name=f"s{k}") for k in range(m)]
                    with tf.device(b), tf.control_dependencies(senders):
                        variants[("control", a, b, m)] = [tf.no_op(name=f"tfplaceto_runtime/control_{i}_{j}_{m}/sink")]
        for i, (a, b) in enumerate(partners.items()):
            with tf.name_scope(f"tfplaceto_runtime/wait_{i}"):
                x_a = _variable(rng, a, "x_a", inits)
                x_b = _variable(rng, b, "x_b", inits)
                on_a = _chain(rng, a, x_a, inits)
                variants[("alone", a)] = [on_a]
                variants[("independent", a, b)] = [on_a, _chain(rng, b, x_b, inits)]
                variants[("dependent", a, b)] = [on_a, _chain(rng, b, x_a, inits)]
    return graph, inits, variants, partners


def _size(device: str) -> int:
    return _SIZE.get(device.rsplit("/device:", 1)[-1].split(":")[0], _SIZE["CPU"])


def _variable(rng, device: str, name: str, inits: list, scale: float = 1.0):
    import tensorflow as tf

    n = _size(device)
    with tf.device(device):
        handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[n, n],
                                        shared_name=f"tfplaceto_runtime_{tf.compat.v1.get_default_graph().unique_name(name)}")
        value = (rng.standard_normal((n, n)) * scale).astype(np.float32)
        inits.append(tf.raw_ops.AssignVariableOp(resource=handle, value=tf.constant(value)))
        return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)


def _chain(rng, device: str, x, inits: list):
    """The op ending _CHAIN x (matmul by a weight, tanh) of x on device: bounded, dense work."""
    import tensorflow as tf

    w = _variable(rng, device, "w", inits, scale=1.0 / np.sqrt(_size(device)))
    with tf.device(device):
        for _ in range(_CHAIN):
            x = tf.tanh(tf.matmul(x, w))
        return tf.reduce_sum(x).op


__all__ = ["DEFAULT_EDGES", "WAIT_THRESHOLD", "RuntimeCosts", "measure_runtime"]
