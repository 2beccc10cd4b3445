"""Where `tp.measure` runs a graph: this process, a local TF cluster it starts, or a remote one.

Every target has the same interface (`TFTarget`): `target` (the Session target string, "" for
in-process), `devices` (full TensorFlow device names), `cluster(links)` (a tfplaceto Cluster of
those devices), `session_config()` (the ConfigProto a measuring Session needs) and `description`.

- `LocalTarget(cpus)`: an in-process Session with `cpus` logical CPU devices (and the GPUs).
- `LocalTFCluster(n_tasks)`: starts n `tf.distribute.Server` worker tasks on loopback ports,
  each in its own process ("spawn" context: a forked TensorFlow runtime is not safe), each pinned
  to its own cores where there are enough, with intra/inter-op threads matching those cores. A
  context manager; the servers are always shut down: on `close()`, on leaving the `with` block
  (also by an exception), when the object is collected, and at interpreter exit.
- `RemoteTFCluster(cluster_spec)`: servers someone else runs (a real multi-machine cluster);
  same interface, no process management.
- `as_target(target)`: a TFTarget from None, "local", "local:N", a local Cluster, a TFTarget,
  a "grpc://host:port" string, a tf.train.ClusterSpec or a dict job -> addresses.
- `list_devices(target, config)`: the devices a Session on a target sees (typed errors when the
  target cannot be reached).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import socket
import time
import weakref
from collections.abc import Mapping, Sequence

from tfplaceto import checks, errors
from tfplaceto.cluster import MAX_DEVICES, Cluster, Device, Link, host_memory_bytes

MAX_LOCAL_TASKS = 64

# Figures for a worker task's CPU device, as Cluster.local() declares its host CPU.
_CPU_GFLOPS_PER_CORE = 16.0 * 2.5
_JOB = "worker"
_GRPC = re.compile(r"^grpc://[^/\s]+:\d+$")
_LOCAL = re.compile(r"^local(?::(\d+))?$")


class TFTarget:
    """What a measurement runs on; see the module docstring. Subclasses set the attributes."""

    target: str = ""
    description: str = ""
    _devices: tuple[str, ...] | None = None

    @property
    def devices(self) -> tuple[str, ...]:
        """The full names of the devices a Session on this target sees (asked once)."""
        if self._devices is None:
            self._devices = list_devices(self.target, self.session_config())
        return self._devices

    def session_config(self):
        """A ConfigProto for a measuring Session on this target: soft placement off."""
        import tensorflow as tf

        return tf.compat.v1.ConfigProto(allow_soft_placement=False)

    def cluster(self, links: Sequence[Link] = ()) -> Cluster:
        """A tfplaceto Cluster of this target's devices; links default to Cluster's figures."""
        return Cluster([_device(name, len(self.devices)) for name in self.devices], links,
                       name=self.description)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.description})"


class LocalTarget(TFTarget):
    """This process: `cpus` logical CPU devices (ConfigProto device_count) plus any GPUs."""

    def __init__(self, cpus: int = 1):
        self.cpus = checks.check_int("local target cpus", cpus, 1, MAX_DEVICES, error=errors.InvalidClusterError)
        self.target = ""
        self.description = f"local:{cpus}"
        self._devices: tuple[str, ...] | None = None

    def session_config(self):
        config = super().session_config()
        config.device_count["CPU"] = self.cpus
        return config

    def cluster(self, links: Sequence[Link] = ()) -> Cluster:
        base = Cluster.local(cpus=self.cpus) if not _has_gpus() else None
        if base is not None:
            # Cluster.local's figures; the given links replace its defaults pair by pair.
            return Cluster(base.devices, [*base.links(), *links], name=self.description)
        # With GPUs: the figures Cluster.local() gives them (model, memory), so a calibrated file
        # has the same device kinds as --cluster local and its cost profiles.
        known = {d.name: d for d in Cluster.local().devices}
        return Cluster([known.get(name) or _device(name, len(self.devices)) for name in self.devices], links,
                       name=self.description)


class GrpcTarget(TFTarget):
    """A TF distributed cluster reached over gRPC: `cluster_spec`, `target`, its devices."""

    def __init__(self, cluster_spec, target: str | None = None, timeout_s: float = 600.0):
        import tensorflow as tf

        try:
            self.cluster_spec = tf.train.ClusterSpec(cluster_spec)
        except (TypeError, ValueError) as e:
            raise errors.InvalidClusterError(f"not a valid cluster spec: {e}") from None
        jobs = self.cluster_spec.jobs
        if not jobs or not any(self.cluster_spec.task_indices(j) for j in jobs):
            raise errors.InvalidClusterError("the cluster spec has no tasks")
        if target is None:
            job = _JOB if _JOB in jobs else jobs[0]
            target = "grpc://" + self.cluster_spec.task_address(job, self.cluster_spec.task_indices(job)[0])
        _check_grpc(target)
        self.target = target
        self.timeout_s = timeout_s
        tasks = sum(len(self.cluster_spec.task_indices(j)) for j in jobs)
        self.description = f"{target} ({tasks} tasks)"
        self._devices: tuple[str, ...] | None = None

    def session_config(self):
        config = super().session_config()
        # Resources (variables) of a grpc session otherwise live on in the servers and collide
        # with the next measurement's variables of the same name.
        config.isolate_session_state = True
        config.operation_timeout_in_ms = int(self.timeout_s * 1000)
        return config


class RemoteTFCluster(GrpcTarget):
    """Servers started elsewhere with `cluster_spec` (tf.distribute.Server on each machine).

    Args:
      cluster_spec: a tf.train.ClusterSpec, a dict job -> list of "host:port", or a ClusterDef.
      target: the "grpc://host:port" a Session connects to (its master); default: the first
        task of job "worker" (or of the first job).
      timeout_s: how long a measurement may wait for one step before failing.

    The servers must have been started with this cluster spec: a Session on `target` then sees
    the devices of every task. Nothing is started or stopped here.
    """

    @classmethod
    def from_target(cls, target: str, timeout_s: float = 600.0) -> RemoteTFCluster:
        """A cluster known only by its master's address (its devices are asked for)."""
        _check_grpc(target)
        return cls({_JOB: [target[len("grpc://"):]]}, target=target, timeout_s=timeout_s)


class LocalTFCluster(GrpcTarget):
    """n worker tasks of a TF distributed cluster, each a `tf.distribute.Server` in its own process.

    Args:
      n_tasks: number of worker tasks ("/job:worker/replica:0/task:0..n-1"), one CPU device each.
      cores_per_task: CPU cores each task is pinned to (os.sched_setaffinity). Default: this
        process's cores split evenly; no pinning when there are fewer cores than tasks.
      intra_op_threads, inter_op_threads: the tasks' TensorFlow thread pools; default: the
        task's core count, so a task uses its cores and no more.
      start_timeout_s: how long to wait for the servers to come up.
      timeout_s: how long a measurement may wait for one step.

    GPUs are hidden from the tasks (CUDA_VISIBLE_DEVICES=-1): n processes would otherwise each
    claim every GPU's memory. Use `with LocalTFCluster(2) as c: ...`, or call `close()`.
    """

    def __init__(self, n_tasks: int = 2, cores_per_task: int | None = None,
                 intra_op_threads: int | None = None, inter_op_threads: int | None = None,
                 start_timeout_s: float = 120.0, timeout_s: float = 600.0, host: str = "localhost"):
        # Each task is a TF server on this host: more than MAX_LOCAL_TASKS would only thrash it.
        n_tasks = checks.check_int("LocalTFCluster n_tasks", n_tasks, 1, MAX_LOCAL_TASKS,
                                   error=errors.InvalidClusterError)
        self.n_tasks = n_tasks
        self.core_sets = _core_sets(n_tasks, cores_per_task)
        cores = len(self.core_sets[0]) if self.core_sets[0] else max(1, _available_cores() // n_tasks)
        self.intra_op_threads = intra_op_threads or cores
        self.inter_op_threads = inter_op_threads or cores
        self.processes: tuple = ()
        self._pipes: list = []
        # Registered before anything starts so a failure half-way still stops what did start.
        self._finalizer = weakref.finalize(self, _shutdown, [], [])
        last_error = None
        for _ in range(3):  # a picked port can be taken before its server binds it: retry
            ports = _free_ports(n_tasks)
            spec = {_JOB: [f"{host}:{p}" for p in ports]}
            try:
                self._start(spec, start_timeout_s)
                break
            except _PortInUse as e:
                last_error = e
                self.close()
        else:
            raise errors.InvalidClusterError(f"could not start the local TF cluster: {last_error}")
        super().__init__(spec, timeout_s=timeout_s)
        self.description = f"LocalTFCluster({n_tasks} tasks, {self.target})"

    def _start(self, spec: dict, timeout_s: float) -> None:
        context = multiprocessing.get_context("spawn")
        processes, pipes = [], []
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _shutdown, processes, pipes)
        self.processes, self._pipes = processes, pipes
        for index in range(self.n_tasks):
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=_serve, name=f"tfplaceto-worker-{index}", daemon=True,
                args=(spec, _JOB, index, tuple(self.core_sets[index]), self.intra_op_threads,
                      self.inter_op_threads, child_end))
            process.start()
            child_end.close()  # the child holds the only other end: EOF here means it died
            processes.append(process)
            pipes.append(parent_end)
        deadline = time.monotonic() + timeout_s
        for index, pipe in enumerate(pipes):
            if not pipe.poll(max(deadline - time.monotonic(), 0.0)):
                self.close()
                raise errors.InvalidClusterError(
                    f"worker task {index} did not start within {timeout_s:.0f} s")
            try:
                status, detail = pipe.recv()
            except EOFError:
                processes[index].join(timeout=5.0)  # so its exit code is known
                self.close()
                raise errors.InvalidClusterError(
                    f"worker task {index} exited while starting (exit code "
                    f"{processes[index].exitcode}); see its stderr. A script that starts a "
                    "LocalTFCluster must do so under `if __name__ == \"__main__\":` (the tasks "
                    "are spawned processes, which import the main module)") from None
            if status != "ready":
                self.close()
                if "address already in use" in detail.lower() or "could not start" in detail.lower():
                    raise _PortInUse(detail)
                raise errors.InvalidClusterError(f"worker task {index} failed to start: {detail}")
        self.processes = tuple(processes)

    @property
    def alive(self) -> bool:
        """True while every task's process runs."""
        return bool(self.processes) and all(p.is_alive() for p in self.processes)

    @property
    def devices(self) -> tuple[str, ...]:
        self._check_alive()
        return super().devices

    def session_config(self):
        self._check_alive()
        return super().session_config()

    def _check_alive(self) -> None:
        # A Session on a stopped server would wait for the whole operation timeout.
        if not self.alive:
            dead = [i for i, p in enumerate(self.processes) if not p.is_alive()]
            raise errors.InvalidClusterError(
                f"{self.description} is closed or lost worker tasks {dead}; start a new one")

    def close(self) -> None:
        """Stops every task (idempotent): asks politely, then terminates, then kills."""
        self._finalizer()

    def __enter__(self) -> LocalTFCluster:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class _PortInUse(Exception):
    pass


def _serve(spec: dict, job: str, index: int, cores: tuple[int, ...], intra: int, inter: int,
           conn) -> None:
    """A worker task's process: pin, start the server, report, and wait for the word to stop."""
    # Before TensorFlow loads: it sizes its default pools from the schedulable cores.
    if cores:
        os.sched_setaffinity(0, cores)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    try:
        import tensorflow as tf

        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra,
                                          inter_op_parallelism_threads=inter,
                                          device_count={"CPU": 1})
        server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=index,
                                      config=config, start=True)
    except Exception as e:  # reported to the parent, which raises a typed error
        conn.send(("error", f"{type(e).__name__}: {str(e).strip()[:2000]}"))
        conn.close()
        os._exit(1)
    conn.send(("ready", server.target))
    # Blocks until the parent says stop or goes away (EOF): a killed parent leaves no orphans.
    with contextlib.suppress(EOFError, OSError):
        conn.recv()
    # The gRPC server has no clean stop in TF1; leave without running its destructors.
    os._exit(0)


def _shutdown(processes: list, pipes: list) -> None:
    for pipe in pipes:
        with contextlib.suppress(OSError, ValueError):
            pipe.send("stop")
    for action in ("join", "terminate", "kill"):
        for process in processes:
            if process.is_alive() and action != "join":
                getattr(process, action)()
        for process in processes:
            process.join(timeout=5.0)
        if not any(p.is_alive() for p in processes):
            break
    for pipe in pipes:
        with contextlib.suppress(OSError):
            pipe.close()


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _core_sets(n_tasks: int, cores_per_task: int | None) -> list[tuple[int, ...]]:
    """The cores of each task; empty tuples when the host cannot give each task its own."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return [()] * n_tasks
    per_task = cores_per_task or len(cores) // n_tasks
    if per_task < 1 or per_task * n_tasks > len(cores):
        return [()] * n_tasks
    return [tuple(cores[i * per_task:(i + 1) * per_task]) for i in range(n_tasks)]


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports (portpicker's, else ones the OS hands out for port 0)."""
    try:
        import portpicker
    except ImportError:
        portpicker = None
    if portpicker is not None:
        return [portpicker.pick_unused_port() for _ in range(n)]
    sockets = []
    try:
        for _ in range(n):  # all held open at once, so the OS cannot hand out one twice
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("localhost", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _check_grpc(target: str) -> None:
    if not isinstance(target, str) or not _GRPC.match(target):
        raise errors.InvalidClusterError(
            f"bad target {target!r}: expected 'grpc://host:port' of a tf.distribute.Server")


def _has_gpus() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def _device(name: str, n_devices: int) -> Device:
    """A tfplaceto Device for a TensorFlow device name (kind "CPU:host" for CPUs)."""
    device_type = name.rsplit("/device:", 1)[-1].split(":")[0]
    if device_type == "CPU":
        cores = max(1, _available_cores() // max(n_devices, 1))
        return Device(name, "CPU", host_memory_bytes() // max(n_devices, 1), model="host",
                      peak_gflops=_CPU_GFLOPS_PER_CORE * cores, memory_bandwidth_gbs=20.0,
                      num_cores=cores, frequency_mhz=2500.0)
    return Device(name, device_type, 16 * 2**30, model="generic")


def list_devices(target: str, config) -> tuple[str, ...]:
    """Full names of the devices a Session on `target` sees (XLA pseudo-devices left out)."""
    import tensorflow as tf

    probe = tf.compat.v1.ConfigProto()
    probe.CopyFrom(config)
    if target:
        # An unreachable server would otherwise be retried for minutes.
        probe.operation_timeout_in_ms = 30_000
    try:
        with tf.compat.v1.Session(target, graph=tf.Graph(), config=probe) as session:
            found = session.list_devices()
    except tf.errors.OpError as e:
        raise errors.InvalidClusterError(
            f"cannot reach {target or 'the local runtime'}: {errors.first_line(e)}; is the server "
            "running and its address right?") from None
    return tuple(d.name for d in found if d.device_type in ("CPU", "GPU"))


def as_target(target=None, min_cpus: int = 1) -> TFTarget:
    """A TFTarget from what users pass as `target` (see the module docstring).

    None is this process with `min_cpus` logical CPUs; "local" likewise; "local:N" N logical CPUs
    (at least `min_cpus`); a Cluster of this process's devices likewise with its CPU count.
    """
    import tensorflow as tf

    if isinstance(target, TFTarget):
        return target
    if target is None:
        return LocalTarget(max(min_cpus, 1))
    if isinstance(target, str):
        local = _LOCAL.match(target)
        if local:
            return LocalTarget(max(int(local[1] or 1), min_cpus))
        if target.startswith("grpc://"):
            return RemoteTFCluster.from_target(target)
        raise errors.InvalidClusterError(
            f"bad target {target!r}: expected None, 'local', 'local:N', 'grpc://host:port', a "
            "ClusterSpec, a LocalTFCluster or a RemoteTFCluster")
    if isinstance(target, Cluster):
        foreign = [d for d in target.device_names if not d.startswith("/job:localhost/")]
        if foreign:
            raise errors.InvalidClusterError(
                f"cluster {target.name!r} has devices of another job ({foreign[0]}); measure on "
                "its servers with target=LocalTFCluster(...) or RemoteTFCluster(cluster_spec)")
        cpus = sum(1 for d in target.devices if d.type == "CPU")
        return LocalTarget(max(cpus, min_cpus, 1))
    if isinstance(target, tf.train.ClusterSpec | Mapping):
        return RemoteTFCluster(target)
    raise errors.InvalidClusterError(
        f"bad target of type {type(target).__name__}: expected None, 'local:N', 'grpc://...', a "
        "ClusterSpec, a LocalTFCluster or a RemoteTFCluster")


__all__ = ["LocalTFCluster", "LocalTarget", "RemoteTFCluster", "TFTarget", "as_target", "list_devices"]
