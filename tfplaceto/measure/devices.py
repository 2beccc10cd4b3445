"""Device calibration: how fast each device computes, and how much devices slow each other down.

The simulator charges an op the profiled time of its device's kind ("CPU:host", "GPU:V100").
Two effects of real machines are outside that column, and both are measured here with one
reference workload, the same on every device:

- **Speed**: devices of one kind are not equally fast. Two worker tasks pinned to different
  cores of one host ran 1.2-1.45x apart on the development machine; GPUs of one box differ by
  their clocks and thermal limits. `measure_devices` times the reference chain on each device
  alone; a device's `compute_scale` is its time over the time of the first device of its kind
  (the device `calibrate_op_costs` traces op costs on), so 1.3 = 30% slower.
- **Contention**: devices that share a host's cores, memory bandwidth, host threads or a PCIe
  switch run slower when they compute at the same time. Two loopback worker tasks computing at
  once each ran at 1/1.63 of their solo speed on the development machine (two cores shared with
  other processes). `measure_devices` times the chain on every device of a group at once; with
  k devices the slowdown s = together / slowest alone gives the group's efficiency
  e = 1 / (1 + (s - 1) / (k - 1)) (the per-device speed when two compute at once, the figure
  `tfplaceto.ContentionGroup` holds; the simulator interpolates linearly in k).

Which devices may contend (`host_groups`): every device of this process (logical CPUs share the
host's cores; GPUs share its threads and PCIe), and the devices of the tasks of a TF cluster
that run on one host (the host part of their ClusterSpec addresses; a task whose address is
unknown is its own host). A group whose measured efficiency is within `MIN_CONTENTION` of 1 is
dropped: no contention is modelled where none was measured.

The reference chain: `length` x (matmul of an n x n variable by an n x n weight, then tanh), so
magnitudes stay bounded (no denormals, which would slow CPUs) and the work is the dense linear
algebra plus elementwise mix of a training step. n is 256 on CPUs, 2048 on GPUs, so one chain
takes tens of milliseconds and the fixed cost of a step is a small part of it.

Repeatability: every variant (each device alone, each group together) runs in each of `rounds`
rounds, in a new shuffled order per round (seeded), `runs` timed steps per round; a round's
figure is its median step, the result the median over rounds, and the spread (max - min over
the rounds, relative to that median) is returned with it, so a noisy host is visible.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from tfplaceto import errors
from tfplaceto.cluster import ContentionGroup
from tfplaceto.measure.measure import check_rounds, time_variants
from tfplaceto.measure.tf_cluster import GrpcTarget, as_target

# A group whose measured efficiency is at least 1 - MIN_CONTENTION is not modelled.
MIN_CONTENTION = 0.05
_SIZE = {"CPU": 256, "GPU": 2048}
_LENGTH = 32

Progress = Callable[[str, int, int], None]


@dataclasses.dataclass(frozen=True)
class DeviceTimes:
    """What `measure_devices` measured.

    alone_s        device -> median seconds of its reference chain alone.
    alone_spread   device -> (max - min) / median of its per-round medians.
    together_s     group (tuple of devices) -> median seconds of one chain on each at once.
    together_spread  likewise.
    rounds, runs   how it was measured.
    """

    alone_s: dict[str, float]
    alone_spread: dict[str, float]
    together_s: dict[tuple[str, ...], float]
    together_spread: dict[tuple[str, ...], float]
    rounds: int
    runs: int

    def compute_scales(self, kinds: dict[str, str]) -> dict[str, float]:
        """device -> its time over the first measured device of its kind (`kinds`: device -> kind)."""
        reference: dict[str, float] = {}
        scales = {}
        for device, seconds in self.alone_s.items():
            reference.setdefault(kinds[device], seconds)
            scales[device] = seconds / reference[kinds[device]]
        return scales

    def slowdown(self, group: tuple[str, ...]) -> float:
        """Together over the slowest device of the group alone (1.0 = no contention)."""
        return self.together_s[group] / max(self.alone_s[d] for d in group)

    def efficiency(self, group: tuple[str, ...]) -> float:
        """The per-device speed when two devices of the group compute at once (see the docstring)."""
        extra = max(self.slowdown(group) - 1.0, 0.0) / (len(group) - 1)
        return float(min(max(1.0 / (1.0 + extra), 0.01), 1.0))

    def contention(self, min_contention: float = MIN_CONTENTION) -> list[ContentionGroup]:
        """The groups whose efficiency is measurably below 1, as ContentionGroups."""
        return [ContentionGroup(group, self.efficiency(group)) for group in self.together_s
                if self.efficiency(group) < 1.0 - min_contention]


def host_groups(target) -> list[tuple[str, ...]]:
    """Devices of the target that share a host, as groups of two or more (see the docstring)."""
    hosts: dict[str, list[str]] = {}
    for device in target.devices:
        task = device.split("/device:")[0]
        host = task
        if isinstance(target, GrpcTarget):
            host = _task_host(target.cluster_spec, task) or task
        hosts.setdefault(host, []).append(device)
    return [tuple(devices) for devices in hosts.values() if len(devices) >= 2]


def _task_host(cluster_spec, task: str) -> str | None:
    """The host part of a task's address in the cluster spec ("/job:w/replica:0/task:1" -> "h")."""
    try:
        job = task.split("/job:")[1].split("/")[0]
        index = int(task.split("/task:")[1])
        address = cluster_spec.task_address(job, index)
    except (IndexError, ValueError, KeyError):
        return None
    return address.rsplit(":", 1)[0] if address else None


def measure_devices(target, devices: Sequence[str] | None = None,
                    groups: Sequence[Sequence[str]] | None = None, rounds: int = 5, runs: int = 5,
                    warmup: int = 2, seed: int = 0, progress: Progress | None = None) -> DeviceTimes:
    """Times the reference chain on each device alone and on every device of each group at once.

    Args:
      target: a TFTarget or what `tfplaceto.measure.tf_cluster.as_target` accepts.
      devices: the devices to time alone (default: all of the target's).
      groups: device groups to time together (default: `host_groups(target)`).
      rounds, runs, warmup: interleaved rounds, timed steps per variant and round, untimed
        steps per variant before the first round.
      seed: of the weights and of each round's order.
      progress: called as progress("devices", done, total) after each timed variant.
    """

    target = as_target(target)
    rounds, runs, warmup = check_rounds(rounds, runs, warmup)
    devices = tuple(devices) if devices is not None else tuple(target.devices)
    groups = [tuple(g) for g in (groups if groups is not None else host_groups(target))]
    unknown = [d for d in (*devices, *(d for g in groups for d in g)) if d not in target.devices]
    if unknown or not devices:
        raise errors.InvalidClusterError(
            f"cannot calibrate devices {unknown or 'none'} on {target.description} (its devices: "
            f"{', '.join(target.devices)})")
    graph, inits, chains = _chain_graph(sorted({*devices, *(d for g in groups for d in g)}), seed)
    variants: list[tuple[str, ...]] = [(d,) for d in devices] + groups
    times = time_variants(target, graph, target.session_config(), inits,
                          [(v, [chains[d] for d in v]) for v in variants], rounds, runs, warmup, seed,
                          progress, "devices")
    samples = {v: [float(np.median(steps)) for steps in times[v]] for v in variants}  # round medians
    median = {v: float(np.median(s)) for v, s in samples.items()}
    spread = {v: float(np.ptp(s) / median[v]) if median[v] > 0 else 0.0 for v, s in samples.items()}
    return DeviceTimes({v[0]: median[v] for v in variants[:len(devices)]},
                       {v[0]: spread[v] for v in variants[:len(devices)]},
                       {g: median[g] for g in groups}, {g: spread[g] for g in groups}, rounds, runs)


def _chain_graph(devices: Sequence[str], seed: int):
    """(graph, init ops, device -> the op ending its reference chain)."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    graph = tf.Graph()
    inits, chains = [], {}
    with graph.as_default():
        for i, device in enumerate(devices):
            device_type = device.rsplit("/device:", 1)[-1].split(":")[0]
            n = _SIZE.get(device_type, _SIZE["CPU"])
            with tf.device(device), tf.name_scope(f"tfplaceto_reference_{i}"):
                x = _variable(rng.standard_normal((n, n)).astype(np.float32), f"x{i}", inits)
                w = _variable((rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32), f"w{i}", inits)
                for _ in range(_LENGTH):
                    x = tf.tanh(tf.matmul(x, w))
                chains[device] = tf.reduce_sum(x).op
    return graph, inits, chains


def _variable(value: np.ndarray, name: str, inits: list):
    import tensorflow as tf

    handle = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=value.shape, shared_name=f"tfplaceto_ref_{name}")
    inits.append(tf.raw_ops.AssignVariableOp(resource=handle, value=tf.constant(value)))
    return tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.float32)


__all__ = ["MIN_CONTENTION", "DeviceTimes", "host_groups", "measure_devices"]
