"""Devices, links and clusters: where ops can run and what moving tensors between them costs.

- `Device`: one placeable device (full TensorFlow name, type, model, memory, throughput figures).
- `Link`: a directed link between two devices (bandwidth, latency, what a crossing control edge
  costs), one transfer at a time.
- `ContentionGroup`: devices that slow each other down when they compute at once (one host's
  cores, a shared PCIe switch), with the measured per-device speed when two of them are busy.
- `Cluster`: the devices plus dense link matrices (`bandwidth`, `latency`, `control_hop`), built
  from presets (`Cluster.preset("4xV100")`), from what this process sees (`Cluster.local()`), from
  N logical CPU devices (`Cluster.local(cpus=N)`), by hand, or from a file (`Cluster.load`, written
  by `Cluster.save` or `tfplaceto calibrate`). `as_cluster` accepts a Cluster, a name or a path.

Some figures are measured, never guessed, so they default to "no effect": a device's
`compute_scale` (its compute time over the profiled time of its kind: two CPUs of one kind may
differ by 1.2-1.45x, two GPUs of one model by their clocks), the cluster's `contention` groups, a
link's `control_hop_s` (a control edge between devices is a Send/Recv of a tiny tensor in the
runtime: on a 2-task loopback cluster each one held the link about 20-30 us) and the fixed costs
of a step, `step_overhead_s` and `task_overhead_s` (a step that runs nothing still makes the
client's and master's round trip, about 0.3 ms on loopback gRPC, and every further task it uses
adds a RunGraph call, about 0.3 ms more), and a device's `sends_wait_idle` (a worker task with
one inter-op thread serves its peers' tensor requests only when it has nothing else to run).
Presets and `Cluster.local()` declare none of them; `tfplaceto.measure.calibrate_cluster`
measures them all.

The presets' vendor figures are in `tfplaceto/presets.py`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Sequence

import numpy as np

from tfplaceto import checks, errors, outputs, presets
from tfplaceto.protos import cluster_pb2

# The device types ops are placed on; an OpGraph's `kernels` has one column per type, in this order.
DEVICE_TYPES = ("CPU", "GPU")
GB = 10**9
GIB = 2**30
HOST = "/job:localhost/replica:0/task:0/device:CPU:0"
_DEVICE_NAME = re.compile(
    r"^/job:(?P<job>[\w-]+)/replica:(?P<replica>\d+)/task:(?P<task>\d+)/device:(?P<type>[A-Z_]+):(?P<index>\d+)$"
)


@dataclasses.dataclass(frozen=True)
class Device:
    """A device ops can be placed on.

    name: a full TensorFlow device name ("/job:localhost/replica:0/task:0/device:GPU:0").
    type: "GPU" or "CPU". memory_bytes: memory in bytes (an int; 16 GiB = 16 * 2**30).
    model: the cost-profile column ("V100"; devices of one model share measured costs).
    peak_gflops: FP32 peak in GFLOP/s (15700 for a V100); memory_bandwidth_gbs: memory bandwidth
    in GB/s (10**9 bytes/s). The analytical cost model (what presets use) needs the device's
    throughput: peak_gflops, or num_cores (SMs / cores) and frequency_mhz (MHz); without them
    `tp.profile` raises CostProfileError (measured costs need neither). streams: ops the device
    runs at once. architecture: the CUDA compute capability ("7.0") for grappler.
    compute_scale: measured compute time over the profiled time of its kind (1: as profiled).
    sends_wait_idle: tensors leaving this device for another task start only when the device
    runs nothing and has nothing ready. Measured, never assumed (False by default): a TF worker
    task whose inter-op pool has one thread serves its peers' tensor requests on that thread,
    after the ops it is given; the two tasks' work then does not overlap.
    """

    name: str
    type: str
    memory_bytes: int
    model: str = ""
    peak_gflops: float = 0.0
    memory_bandwidth_gbs: float = 0.0
    streams: int = 1
    num_cores: int = 0
    frequency_mhz: float = 0.0
    architecture: str = ""
    compute_scale: float = 1.0
    sends_wait_idle: bool = False

    @property
    def kind(self) -> str:
        """The cost-profile column of this device: its type and model, e.g. "GPU:V100"."""
        return f"{self.type}:{self.model or 'generic'}"

    @property
    def task(self) -> str:
        """The "/job:x/replica:r/task:t" prefix: devices sharing it are on one host."""
        return self.name.split("/device:")[0]


@dataclasses.dataclass(frozen=True)
class ContentionGroup:
    """Devices that share what computing needs (a host's cores or memory bandwidth, a PCIe switch).

    With k devices of the group busy at once, each computes at
    `1 / (1 + (k - 1) * (1 / efficiency - 1))` of its solo speed: `efficiency` is the per-device
    speed when two of them compute at once (1.0: no contention; 0.5: two at once take as long as
    one after the other).
    """

    devices: tuple[str, ...]
    efficiency: float

    @property
    def slowdown_per_device(self) -> float:
        """Extra time per extra busy device, as a fraction of the solo time: 1 / efficiency - 1."""
        return 1.0 / self.efficiency - 1.0


@dataclasses.dataclass(frozen=True)
class Link:
    """A directed link from device src to device dst (full names): a transfer of b bytes takes
    latency_s + b / bandwidth_bytes_per_s seconds. Units: bytes per second (PCIe 3.0 x16 is about
    12e9, NVLink 2.0 about 25e9 per link) and seconds (10e-6 for 10 µs); positional order
    Link(src, dst, bandwidth_bytes_per_s, latency_s, control_hop_s).

    control_hop_s: what one control edge from src to dst holds the link for (TensorFlow turns a
    control edge between devices into a Send/Recv of a tiny tensor). 0, the default: control edges
    only order ops, as in every preset. Measured by `tfplaceto calibrate` as the cost per edge of
    many edges in flight, which is less than `latency_s`, the time of one hop waited for alone.
    """

    src: str
    dst: str
    bandwidth_bytes_per_s: float
    latency_s: float
    control_hop_s: float = 0.0


def _validate_device(device: Device) -> None:
    if not isinstance(device.name, str) or not (match := _DEVICE_NAME.match(device.name)):
        raise errors.InvalidClusterError(
            f"bad device name {device.name!r}: expected a full TensorFlow name such as "
            f"'/job:localhost/replica:0/task:0/device:GPU:0'")
    if match["type"] != device.type:
        raise errors.InvalidClusterError(
            f"device {device.name!r} has type {device.type!r} but its name says {match['type']!r}")
    if device.type not in DEVICE_TYPES:
        raise errors.InvalidClusterError(
            f"device {device.name!r}: type {device.type!r} is not one of {DEVICE_TYPES}")
    where = f"device {device.name!r}: "
    # Every figure is checked here, where it enters: a NaN or a float byte count would otherwise
    # surface as a hang in the simulator or a TypeError in to_proto.
    checks.check_int(where + "memory_bytes", device.memory_bytes, 1, _MAX_INT64, error=errors.InvalidClusterError)
    checks.check_int(where + "streams", device.streams, 1, MAX_STREAMS, error=errors.InvalidClusterError)
    checks.check_int(where + "num_cores", device.num_cores, 0, 2**31 - 1, error=errors.InvalidClusterError)
    for field in ("peak_gflops", "memory_bandwidth_gbs", "frequency_mhz"):
        checks.check_real(where + field, getattr(device, field), 0.0, error=errors.InvalidClusterError)
    checks.check_real(where + "compute_scale", device.compute_scale, 0.0, 1e6, low_open=True,
                      error=errors.InvalidClusterError)
    if not isinstance(device.sends_wait_idle, bool | np.bool_):
        raise errors.InvalidClusterError(f"{where}sends_wait_idle must be True or False")
    for field in ("model", "architecture"):
        if not isinstance(getattr(device, field), str):
            raise errors.InvalidClusterError(f"{where}{field} must be a string, got {getattr(device, field)!r}")


def _validate_link(link: Link) -> tuple[float, float, float]:
    """(bandwidth, latency, control hop) of a link, finite: a NaN or infinite figure would stall the
    simulator."""
    if not isinstance(link, Link):
        raise errors.InvalidClusterError(f"expected tfplaceto.Link, got {type(link).__name__}")
    where = f"link {link.src} -> {link.dst}: "
    bandwidth = checks.check_real(where + "bandwidth_bytes_per_s", link.bandwidth_bytes_per_s, 0.0,
                                  low_open=True, error=errors.InvalidClusterError)
    latency = checks.check_real(where + "latency_s", link.latency_s, 0.0, error=errors.InvalidClusterError)
    control_hop = checks.check_real(where + "control_hop_s", link.control_hop_s, 0.0, 1e6,
                                    error=errors.InvalidClusterError)
    return bandwidth, latency, control_hop


# Default figures for a pair of devices with no declared link.
_SAME_HOST = Link("", "", 12 * GB, 10e-6)  # PCIe 3.0 x16, achievable
_CROSS_HOST = Link("", "", 1.25 * GB, 50e-6)  # 10 Gb/s Ethernet
_MAX_INT64 = 2**63 - 1
# Bounds that keep a cluster a cluster: the dense link matrices and to_proto are quadratic in the
# device count (256 devices: 65280 links, 0.6 s to fingerprint; 1024: 11 s), and no device runs
# thousands of ops at once.
MAX_DEVICES = 256
MAX_STREAMS = 1024


class Cluster:
    """Devices and the links between them.

    Args:
      devices: the devices; names must be full TensorFlow device names, unique.
      links: directed links; a pair without one gets PCIe figures on one host and 10 GbE across
        hosts.
      name: a label (the preset name for presets).
      same_host_link: (bandwidth, latency) of a same-host pair with no declared link, instead of
        the PCIe default (a local:N cluster's logical CPUs copy at host memory speed).
      contention: disjoint ContentionGroups of two or more devices (default: none, every device
        computes at its own speed whatever the others do).
      step_overhead_s: seconds every simulated step pays on top of its schedule (default 0).
      task_overhead_s: seconds a step pays for each task it uses other than the task of the first
        device (where a session's master runs when `tfplaceto calibrate` measures; default 0).

    `bandwidth[i, j]`, `latency[i, j]` and `control_hop[i, j]` are dense arrays over `devices`
    order (diagonal unused).
    """

    def __init__(self, devices: Sequence[Device], links: Sequence[Link] = (), name: str = "custom", *,
                 same_host_link: tuple[float, float] | None = None,
                 contention: Sequence[ContentionGroup] = (), step_overhead_s: float = 0.0,
                 task_overhead_s: float = 0.0):
        devices = tuple(devices)
        if not devices:
            raise errors.InvalidClusterError("a cluster needs at least one device")
        for device in devices:
            if not isinstance(device, Device):
                raise errors.InvalidClusterError(f"expected tfplaceto.Device, got {type(device).__name__}")
            _validate_device(device)
        if len(devices) > MAX_DEVICES:
            raise errors.InvalidClusterError(
                f"a cluster has at most {MAX_DEVICES} devices, got {len(devices)}")
        names = [d.name for d in devices]
        if len(set(names)) != len(names):
            raise errors.InvalidClusterError(f"duplicate device names in {names}")
        self.name = name
        self.devices = devices
        self.device_names = tuple(names)
        self._index = {n: i for i, n in enumerate(names)}
        # Defaults by host, vectorized: building a cluster costs O(devices^2) array cells but only
        # O(devices + links) Python steps.
        task_ids = np.unique([d.task for d in devices], return_inverse=True)[1]
        same_host = task_ids[:, None] == task_ids[None, :]
        host_bandwidth, host_latency, _ = _validate_link(Link("", "", *same_host_link)) if same_host_link \
            else (_SAME_HOST.bandwidth_bytes_per_s, _SAME_HOST.latency_s, 0.0)
        self.bandwidth = np.where(same_host, host_bandwidth, _CROSS_HOST.bandwidth_bytes_per_s)
        self.latency = np.where(same_host, host_latency, _CROSS_HOST.latency_s)
        self.control_hop = np.zeros_like(self.latency)
        np.fill_diagonal(self.bandwidth, np.inf)
        for link in links:
            bandwidth, latency, control_hop = _validate_link(link)
            i, j = self.index(link.src), self.index(link.dst)
            if i == j:
                raise errors.InvalidClusterError(f"bad link {link}: a link joins two different devices")
            self.bandwidth[i, j] = bandwidth
            self.latency[i, j] = latency
            self.control_hop[i, j] = control_hop
        for array in (self.bandwidth, self.latency, self.control_hop):
            array.flags.writeable = False
        self.contention = self._checked_contention(contention)
        self.step_overhead_s, self.task_overhead_s = (
            float(checks.check_real(name, value, 0.0, 1e6, error=errors.InvalidClusterError))
            for name, value in (("step_overhead_s", step_overhead_s), ("task_overhead_s", task_overhead_s)))

    def _checked_contention(self, groups: Sequence[ContentionGroup]) -> tuple[ContentionGroup, ...]:
        checked, seen = [], set()
        for group in groups:
            if not isinstance(group, ContentionGroup):
                raise errors.InvalidClusterError(
                    f"expected tfplaceto.ContentionGroup, got {type(group).__name__}")
            members = tuple(self.device_names[self.index(d)] for d in group.devices)
            if len(members) < 2 or len(set(members)) != len(members):
                raise errors.InvalidClusterError(
                    f"a contention group needs two or more distinct devices, got {list(group.devices)}")
            if seen.intersection(members):
                raise errors.InvalidClusterError(
                    f"device {sorted(seen.intersection(members))[0]} is in two contention groups; "
                    "groups must be disjoint")
            seen.update(members)
            efficiency = checks.check_real(f"contention group {list(members)}: efficiency",
                                           group.efficiency, 0.01, 1.0, error=errors.InvalidClusterError)
            checked.append(ContentionGroup(members, float(efficiency)))
        return tuple(checked)

    def contention_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(group of each device (int32, -1: none), slowdown per extra busy device of each group)."""
        group = np.full(self.num_devices, -1, np.int32)
        for g, members in enumerate(self.contention):
            group[[self.index(d) for d in members.devices]] = g
        return group, np.array([g.slowdown_per_device for g in self.contention], np.float64)

    def task_ids(self) -> np.ndarray:
        """Each device's task as an int32 (0: the first device's task, then in order of appearance)."""
        tasks = list(dict.fromkeys(d.task for d in self.devices))
        return np.array([tasks.index(d.task) for d in self.devices], np.int32)

    @property
    def compute_scales(self) -> np.ndarray:
        """compute_scale of every device, in device order."""
        return np.array([d.compute_scale for d in self.devices], np.float64)

    # -- lookups -------------------------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def index(self, device_name: str) -> int:
        """Position of a device; InvalidClusterError for a device outside the cluster."""
        try:
            return self._index[device_name]
        except KeyError:
            canonical = canonical_device_name(device_name)
            if canonical in self._index:
                return self._index[canonical]
            raise errors.InvalidClusterError(
                f"device {device_name!r} is not in cluster {self.name!r} "
                f"(devices: {', '.join(self.device_names)})") from None

    @property
    def kinds(self) -> tuple[str, ...]:
        """Distinct device kinds ("GPU:V100", "CPU:host") in order of first appearance."""
        return tuple(dict.fromkeys(d.kind for d in self.devices))

    @property
    def memory_bytes(self) -> np.ndarray:
        return np.array([d.memory_bytes for d in self.devices], dtype=np.int64)

    @property
    def accelerators(self) -> tuple[Device, ...]:
        """The GPUs, or every device when there are none (a CPU-only cluster)."""
        gpus = tuple(d for d in self.devices if d.type == "GPU")
        return gpus or self.devices

    def links(self) -> list[Link]:
        return [Link(a.name, b.name, float(self.bandwidth[i, j]), float(self.latency[i, j]),
                     float(self.control_hop[i, j]))
                for i, a in enumerate(self.devices) for j, b in enumerate(self.devices) if i != j]

    def fingerprint(self) -> str:
        return hashlib.sha256(self.to_proto().SerializeToString(deterministic=True)).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}, {self.num_devices} devices)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cluster) and self.to_proto() == other.to_proto()

    __hash__ = None  # mutable-looking; compare by value only

    # -- proto ---------------------------------------------------------------------------------
    def to_proto(self) -> cluster_pb2.Cluster:
        # Unset figures stay unset (proto3 does not write zeros): uncalibrated clusters serialize
        # and fingerprint exactly as before these fields existed.
        proto = cluster_pb2.Cluster(name=self.name, step_overhead_s=self.step_overhead_s,
                                    task_overhead_s=self.task_overhead_s)
        for d in self.devices:
            fields = dataclasses.asdict(d)
            if fields["compute_scale"] == 1.0:  # 0 (unset) reads as 1: unscaled files stay as they were
                del fields["compute_scale"]
            proto.devices.add(**fields)
        for link in self.links():
            proto.links.add(**dataclasses.asdict(link))
        for group in self.contention:
            proto.contention.add(devices=group.devices, efficiency=group.efficiency)
        return proto

    @classmethod
    def from_proto(cls, proto: cluster_pb2.Cluster) -> Cluster:
        devices = [Device(**{f.name: getattr(d, f.name) for f in dataclasses.fields(Device)
                             if f.name != "compute_scale"}, compute_scale=d.compute_scale or 1.0)
                   for d in proto.devices]
        links = [Link(p.src, p.dst, p.bandwidth_bytes_per_s, p.latency_s, p.control_hop_s) for p in proto.links]
        contention = [ContentionGroup(tuple(g.devices), g.efficiency) for g in proto.contention]
        return cls(devices, links, name=proto.name or "custom", contention=contention,
                   step_overhead_s=proto.step_overhead_s, task_overhead_s=proto.task_overhead_s)

    # -- files ---------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Writes the cluster as a text proto (binary for a ".pb" path), atomically."""
        from google.protobuf import text_format

        proto = self.to_proto()
        data = (proto.SerializeToString(deterministic=True) if str(path).endswith(".pb")
                else text_format.MessageToString(proto).encode())
        outputs.atomic_write(path, data)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Cluster:
        """A cluster file written by `save` or `tfplaceto calibrate` (text proto, or binary ".pb")."""
        from google.protobuf import message, text_format

        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise errors.InvalidClusterError(f"cannot read cluster file {str(path)!r}: {e.strerror}") from None
        proto = cluster_pb2.Cluster()
        try:
            if str(path).endswith(".pb"):
                proto.ParseFromString(data)
            else:
                text_format.Parse(data.decode("utf-8"), proto)
        except (message.DecodeError, text_format.ParseError, UnicodeDecodeError) as e:
            raise errors.InvalidClusterError(
                f"{str(path)!r} is not a tfplaceto cluster file ({errors.first_line(e)}); write one "
                "with `tfplaceto calibrate TARGET --out cluster.pbtxt` or Cluster.save") from None
        return cls.from_proto(proto)

    # -- constructors --------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> Cluster:
        """A preset cluster: 2xK80 4xK80 8xK80 2xV100 4xV100 8xV100 4xH100 8xH100 (`tfplaceto.presets`)."""
        devices, links = presets.figures(name, HOST)
        return cls([Device(**device) for device in devices], [Link(*link) for link in links], name=name)

    @classmethod
    def local(cls, cpus: int | None = None) -> Cluster:
        """The devices this process sees, or `cpus` logical CPU devices on this host.

        Logical CPU devices are real: a session created with
        `ConfigProto(device_count={"CPU": cpus})` has exactly these devices (see `session_config`).
        """
        host_memory = host_memory_bytes()
        cores = os.cpu_count() or 1
        cpu = dict(type="CPU", model="host", peak_gflops=16.0 * cores * 2.5,
                   memory_bandwidth_gbs=20.0, num_cores=cores, frequency_mhz=2500.0)
        if cpus is not None:
            cpus = checks.check_int("local cluster cpus", cpus, 1, MAX_DEVICES, error=errors.InvalidClusterError)
            devices = [Device(f"/job:localhost/replica:0/task:0/device:CPU:{i}",
                              memory_bytes=host_memory // cpus, **cpu) for i in range(cpus)]
            # Logical CPUs share one memory: a copy is a memcpy at host memory speed.
            return cls(devices, name=f"local:{cpus}", same_host_link=(5 * GB, 2e-6))
        import tensorflow as tf

        devices = [Device(HOST, memory_bytes=host_memory, **cpu)]
        for i, gpu in enumerate(tf.config.list_physical_devices("GPU")):
            details = tf.config.experimental.get_device_details(gpu)
            memory = _gpu_memory_bytes(i)
            devices.append(Device(f"/job:localhost/replica:0/task:0/device:GPU:{i}", "GPU", memory,
                                  model=details.get("device_name", "gpu").replace(" ", "_"),
                                  architecture=".".join(map(str, details.get("compute_capability", ())))))
        return cls(devices, name="local")


def canonical_device_name(name: str) -> str:
    """Expands short names ("/device:GPU:0", "/gpu:0", "GPU:0") to the full localhost form."""
    import tensorflow as tf

    try:
        spec = tf.DeviceSpec.from_string(name)
    except (ValueError, TypeError):
        return name
    if spec.device_type is None:
        return name
    return tf.DeviceSpec(job=spec.job or "localhost", replica=spec.replica or 0, task=spec.task or 0,
                         device_type=spec.device_type.upper(), device_index=spec.device_index or 0).to_string()


def is_cluster_file(name: str) -> bool:
    """Whether a --cluster string names a cluster file rather than a preset."""
    return name.endswith((".pbtxt", ".pb", ".textproto")) or os.sep in name or os.path.isfile(name)


def as_cluster(cluster: Cluster | str | os.PathLike) -> Cluster:
    """A Cluster from a Cluster, a preset name, "local", "local:N" or a cluster file's path."""
    if isinstance(cluster, os.PathLike):
        return Cluster.load(cluster)
    if isinstance(cluster, Cluster):
        return cluster
    if isinstance(cluster, str):
        if cluster == "local":
            return Cluster.local()
        match = re.fullmatch(r"local:(\d+)", cluster)
        if match:
            return Cluster.local(cpus=int(match[1]))
        if is_cluster_file(cluster):
            return Cluster.load(cluster)
        return Cluster.preset(cluster)
    raise errors.InvalidClusterError(
        f"expected a tfplaceto.Cluster or a preset name, got {type(cluster).__name__}")


def session_config(cluster: Cluster):
    """A ConfigProto exposing the cluster's local devices, soft placement off."""
    import tensorflow as tf

    cpus = sum(1 for d in cluster.devices if d.type == "CPU")
    return tf.compat.v1.ConfigProto(device_count={"CPU": max(cpus, 1)}, allow_soft_placement=False,
                                    inter_op_parallelism_threads=0)


def host_memory_bytes() -> int:
    """This machine's physical memory (16 GiB when the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 * GIB


def _gpu_memory_bytes(index: int) -> int:
    import tensorflow as tf

    try:
        info = tf.config.experimental.get_memory_info(f"GPU:{index}")
        return int(info.get("limit", 0)) or 16 * GIB
    except (ValueError, RuntimeError):
        return 16 * GIB
