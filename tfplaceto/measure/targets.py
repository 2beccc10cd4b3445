"""`tfplaceto calibrate TARGET --out cluster.pbtxt`: what TARGET may be, and the calibration run.

- `open_target(spec)`: a context manager yielding the TFTarget a TARGET string names:
  * `local`: this process's devices (its CPU and every GPU it sees): a GPU box;
  * `local:N`: N logical CPU devices of this process (what `--cluster local:N` places on);
  * `loopback:N`: N worker tasks started here on loopback ports (`LocalTFCluster(N)`, stopped
    when done): the multi-task path of a real cluster, on one machine;
  * a ClusterSpec as JSON, inline (`{"worker": ["host1:2222", "host2:2222"]}`) or in a `.json`
    file: servers already running on those machines (`RemoteTFCluster`); its first task of job
    "worker" (else of the first job) is the master;
  * `grpc://host:port[,grpc://host2:port2...]`: the master's address, or the addresses of every
    task of job "worker" in task order (then devices of one host are known to share it).
- `calibrate_to_file(spec, out, ...)`: calibrates links, device speeds and contention
  (`calibrate_cluster`) with a progress bar on stderr and writes the cluster file atomically.
  The file is what `--cluster cluster.pbtxt` and `tp.Cluster.load` read.

Bad specs raise InvalidClusterError naming the accepted forms.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator

import numpy as np

from tfplaceto import checks, errors
from tfplaceto.cluster import Cluster
from tfplaceto.measure.calibrate import calibrate_cluster
from tfplaceto.measure.tf_cluster import LocalTarget, LocalTFCluster, RemoteTFCluster, TFTarget
from tfplaceto.outputs import OutputSet

_FORMS = ("local, local:N, loopback:N, a ClusterSpec as JSON (inline or a .json file), or "
          "grpc://host:port[,grpc://host:port...]")
_LOOPBACK = re.compile(r"^loopback:(\d+)$")
_LOCAL = re.compile(r"^local(?::(\d+))?$")


@contextlib.contextmanager
def open_target(spec: str) -> Iterator[TFTarget]:
    """The TFTarget of a TARGET string (see the module docstring); servers it starts are stopped."""
    if not isinstance(spec, str) or not spec.strip():
        raise errors.InvalidClusterError(f"empty calibration target; expected {_FORMS}")
    spec = spec.strip()
    if match := _LOCAL.match(spec):
        cpus = checks.check_int("local cpus", int(match[1] or 1), 1, 256, error=errors.InvalidClusterError)
        yield LocalTarget(cpus)
        return
    if match := _LOOPBACK.match(spec):
        with LocalTFCluster(int(match[1])) as cluster:
            yield cluster
        return
    if spec.startswith("grpc://"):
        addresses = [a.strip() for a in spec.split(",")]
        if len(addresses) == 1:
            yield RemoteTFCluster.from_target(addresses[0])
            return
        bad = [a for a in addresses if not a.startswith("grpc://")]
        if bad:
            raise errors.InvalidClusterError(f"bad address {bad[0]!r} in {spec!r}: every one must be grpc://host:port")
        yield RemoteTFCluster({"worker": [a[len("grpc://"):] for a in addresses]}, target=addresses[0])
        return
    if spec.startswith("{") or spec.endswith(".json"):
        yield RemoteTFCluster(_cluster_spec(spec))
        return
    raise errors.InvalidClusterError(f"bad calibration target {spec!r}; expected {_FORMS}")


def _cluster_spec(spec: str) -> dict:
    text = spec
    if not spec.startswith("{"):
        try:
            with open(spec, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise errors.InvalidClusterError(f"cannot read cluster spec {spec!r}: {e.strerror}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise errors.InvalidClusterError(f"the cluster spec is not valid JSON: {e}") from None
    if isinstance(value, dict) and isinstance(value.get("cluster"), dict):  # a TF_CONFIG
        value = value["cluster"]
    if not (isinstance(value, dict) and value and all(
            isinstance(job, str) and isinstance(tasks, list) and tasks and all(isinstance(t, str) for t in tasks)
            for job, tasks in value.items())):
        raise errors.InvalidClusterError(
            'a cluster spec is a JSON object job -> list of "host:port", e.g. '
            '{"worker": ["host1:2222", "host2:2222"]} (or a TF_CONFIG with a "cluster" key)')
    return value


class _ProgressBar:
    """One tqdm bar per calibration stage on stderr (nothing when stderr is not a terminal and
    `always` is False: logs stay clean)."""

    def __init__(self, always: bool = False):
        self.enabled = always or sys.stderr.isatty()
        self.bars: dict = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        bar = self.bars.get(stage)
        if bar is None:
            label = {"links": "links (transfers)", "devices": "device speed and contention",
                     "runtime": "runtime costs (step, control hops)"}.get(stage, stage)
            bar = self.bars[stage] = tqdm(total=total, desc=label, file=sys.stderr, leave=True)
        bar.update(done - bar.n)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def calibrate_to_file(spec: str, out: str | os.PathLike, *, rounds: int = 5, runs: int = 5,
                      link_runs: int = 10, contention: bool = True, overwrite: bool = False,
                      progress: bool | None = None) -> Cluster:
    """Calibrates TARGET `spec` and writes the cluster file `out` (text proto; binary for .pb).

    rounds, runs: interleaved rounds and timed steps per round of the reference chain;
    link_runs: timed steps per transfer size; contention: measure it (False: speeds and links
    only); progress: a progress bar on stderr (None: when stderr is a terminal). The output path
    is checked before any measurement and written atomically after all of it.
    """
    for label, value in (("--rounds", rounds), ("--runs", runs), ("link runs", link_runs)):
        checks.check_int(f"calibrate {label}", value, 1, 10**4)
    outputs = OutputSet({"--out": out}, overwrite=overwrite)
    bar = _ProgressBar(always=bool(progress)) if progress is not False else None
    try:
        with outputs, open_target(spec) as target:
            cluster = calibrate_cluster(target, runs=link_runs, rounds=rounds, device_runs=runs,
                                        contention=contention, progress=bar)
            cluster.save(outputs.stage(out))
    finally:
        if bar is not None:
            bar.close()
    return cluster


def describe(cluster: Cluster) -> str:
    """A few lines on what a calibrated cluster holds (the CLI prints them)."""
    lines = [f"{cluster.name}: {cluster.num_devices} devices"]
    for device in cluster.devices:
        lines.append(f"  {device.name}  compute_scale {device.compute_scale:.3f}")
    if cluster.num_devices > 1:
        off = ~np.eye(cluster.num_devices, dtype=bool)
        lines.append(f"  links: bandwidth {cluster.bandwidth[off].min() / 1e9:.3g}-"
                     f"{cluster.bandwidth[off].max() / 1e9:.3g} GB/s, latency "
                     f"{cluster.latency[off].min() * 1e6:.3g}-{cluster.latency[off].max() * 1e6:.3g} us")
    for group in cluster.contention:
        lines.append(f"  contention: {len(group.devices)} devices sharing a host, efficiency "
                     f"{group.efficiency:.2f} (each at {group.efficiency:.0%} of its speed when two compute)")
    if not cluster.contention:
        lines.append("  contention: none measured")
    lines.append(f"  fixed step cost {cluster.step_overhead_s * 1e6:.0f} us, per further task "
                 f"{cluster.task_overhead_s * 1e6:.0f} us")
    if cluster.num_devices > 1:
        hops = cluster.control_hop[~np.eye(cluster.num_devices, dtype=bool)]
        lines.append(f"  control edge between devices: {hops.min() * 1e6:.3g}-{hops.max() * 1e6:.3g} us each")
    waiting = [d.name for d in cluster.devices if d.sends_wait_idle]
    if waiting:
        lines.append(f"  sends wait until their device is idle: {', '.join(waiting)} (one inter-op thread "
                     "serves both the ops and the peers' tensor requests)")
    return "\n".join(lines)


__all__ = ["calibrate_to_file", "describe", "open_target"]
