"""Distributed collection on Reverb: actor processes collect, one learner trains (TF-Agents' way).

The embedded engine (`tfplaceto.rl.train.Embedded`) collects and learns in one process. With
`actors > 0`, or a Reverb address, collection moves to actor processes, as TF-Agents' distributed
on-policy examples do (`tf_agents/examples/ppo/schulman17/train_eval_lib.py`,
`tf_agents/experimental/distributed/reverb_variable_container.py`):

  learner (the `train` process)                       actor i (`tfplaceto actor`)
  -----------------------------                       ---------------------------
  Reverb server, three tables:
    "trajectories": a queue (Table.queue: FIFO, each  <- one item per lockstep batch: the
      item sampled once, inserts block while full)       Trajectory [lanes, T] of one problem,
    "variables": the latest weights and train step   ->  pulled before every batch
      (ReverbVariableContainer, max_size 1)
    "job": what to collect (sources, clusters, the    ->  read once at start
      environment settings, the network config, the
      problems' fingerprints), as JSON
  train(..., collector=Launcher.start): takes batches
  from the queue, trains, checkpoints, publishes the
  weights after every batch's updates

An item carries a whole batch (every lane of one problem, padded to the longest episode of the
problem set, with the true length), not single lanes: the agent's baseline is the leave-one-out
mean over the lanes of one batch, which share one problem and one random start. It also carries
the actor's id and incarnation, the train step of the weights it acted with (policy lag = the
learner's step when it trains on the item minus that), the actor's episode count and wall time
(its episodes/s), its episodes' figures and its best placement of that problem.

Staleness is bounded by the queue: it holds at most `max(actors, 1)` items, an actor blocks on
its insert while it is full and pulls the newest weights right before each batch, so an item is
at most a few learner updates old (TensorBoard: `actors/<id>/policy_lag`).

`Launcher` is the learner side. `start(env, policy, agent, settings)` (the `collector` hook of
`tfplaceto.rl.train.train`) serves Reverb (a free loopback port, or the given address's port on
every interface), publishes the job and the initial (possibly resumed) weights, starts the local
actor processes (`sys.executable -m tfplaceto actor ...`, each with its own seed, hence its own
sequence of problems and starts; logs in `logdir/actors/`, pids in `logdir/actors/actors.json`),
and returns itself as the collector: `batch()` waits for the next item, restarting any local
actor that died (an actor that dies before delivering anything three times in a row is an
error, with the last line of its log), `after_update` publishes the weights and writes the
per-actor scalars (`actors/<id>/episodes_per_s`, `actors/<id>/policy_lag`, and
`learner/wait_s`, the time the learner waited for data: near 0 when collection keeps up).
`close()` stops every actor it started (SIGTERM, then SIGKILL) and the server: `train_distributed`
calls it on the way out, on errors and on Ctrl-C too. A killed learner leaves its checkpoint;
running the same command again resumes from it (the actors exit when their learner is gone:
they watch their parent process and the server).

`train_sources(sources, clusters, episodes, logdir, seed, actors, reverb_address, **config)` is
`tfplaceto.train` and `tfplaceto train`: the problems of every source on every cluster, trained
by the embedded engine (`actors=0`, no address) or with actors (`train_distributed`).

`run_actor(address, ...)` is the actor: it reads the job, rebuilds the problems from their
sources (and refuses to collect if their fingerprints differ from the learner's: another
version, other files), then loops: pull the weights, collect one batch with
`tfplaceto.rl.acting.collect` (the embedded engine's own lockstep collection), write it.
`tfplaceto actor --reverb-address HOST:PORT` runs it on another machine.

Determinism: the embedded engine is reproducible to the bit; a distributed run is not (which
actor's batch arrives first depends on timing). Budgets are still episode counts.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

import numpy as np

from tfplaceto import errors
from tfplaceto.problem import Best, Problem
from tfplaceto.rl.logdir import read_episodes_per_actor

TRAJECTORIES = "trajectories"
VARIABLES = "variables"  # tf_agents' reverb_variable_container.DEFAULT_TABLE
JOB = "job"
POLICY_KEY = "policy_variables"  # the keys TF-Agents' distributed examples push
TRAIN_STEP_KEY = "train_step"
_TRAJECTORY_FIELDS = ("step_type", "observation", "action", "next_step_type", "reward", "discount")
_FAILURES_BEFORE_ERROR = 3


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of "HOST:PORT" (InvalidArgumentError otherwise)."""
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise errors.InvalidArgumentError(f"a Reverb address is HOST:PORT (port 1-65535), got {address!r}")
    return host, int(port)


def actor_seed(seed: int, actor_id: int, incarnation: int) -> int:
    """The seed of an actor's environment and sampling: its own for every id and restart."""
    return int(np.random.SeedSequence([seed, actor_id, incarnation]).generate_state(1)[0])


# -- items ----------------------------------------------------------------------------------------
def item_spec(env, lanes: int) -> dict:
    """The TensorSpec nest of one item (a batch of `env`'s problems, padded: module docstring)."""
    import tensorflow as tf
    from tf_agents.specs import tensor_spec

    length, nodes = env.dims.steps + 1, env.dims.nodes  # + 1: the boundary step after the LAST
    head = (lanes, length)

    def batched(spec):
        return tf.TensorSpec(head + tuple(spec.shape), spec.dtype)

    step = tensor_spec.from_spec(env.time_step_spec())
    return {
        "step_type": batched(step.step_type), "next_step_type": batched(step.step_type),
        "observation": tf.nest.map_structure(batched, step.observation),
        "action": batched(tensor_spec.from_spec(env.action_spec())),
        "reward": batched(step.reward), "discount": batched(step.discount),
        "weights": tf.TensorSpec(head, tf.float32), "length": tf.TensorSpec((), tf.int32),
        "episodes": {"problem": tf.TensorSpec((lanes,), tf.int32),
                     "step_time_s": tf.TensorSpec((lanes,), tf.float64),
                     "initial_step_time_s": tf.TensorSpec((lanes,), tf.float64),
                     "improvement": tf.TensorSpec((lanes,), tf.float64),
                     "oom": tf.TensorSpec((lanes,), tf.bool)},
        "best": {"problem": tf.TensorSpec((), tf.int32), "step_time_s": tf.TensorSpec((), tf.float64),
                 "oom": tf.TensorSpec((), tf.bool), "placement": tf.TensorSpec((nodes,), tf.int32),
                 "found": tf.TensorSpec((), tf.bool)},
        "actor": tf.TensorSpec((), tf.int64), "incarnation": tf.TensorSpec((), tf.int32),
        "policy_step": tf.TensorSpec((), tf.int64), "actor_episodes": tf.TensorSpec((), tf.int64),
        "actor_wall_s": tf.TensorSpec((), tf.float64),
    }


def pack_item(spec: dict, experience, weights: np.ndarray, summaries: list[dict], best: Best,
              problem: int, actor: int, incarnation: int, policy_step: int, actor_episodes: int,
              actor_wall_s: float) -> dict:
    """One item (numpy, shaped as `spec`) of a collected batch (see `collect`)."""
    import tensorflow as tf

    lanes, length = spec["weights"].shape
    size = weights.shape[1]
    if weights.shape[0] != lanes or size > length:
        raise ValueError(f"a batch of shape {weights.shape} does not fit items of shape {(lanes, length)}")

    def pad(x, dtype):
        x = np.asarray(x, dtype.as_numpy_dtype)
        return np.pad(x, [(0, 0), (0, length - size)] + [(0, 0)] * (x.ndim - 2))

    trajectory = {field: getattr(experience, field) for field in _TRAJECTORY_FIELDS}
    item = {field: tf.nest.map_structure(lambda s, x: pad(x, s.dtype), spec[field], trajectory[field])
            for field in _TRAJECTORY_FIELDS}
    placement = np.zeros(spec["best"]["placement"].shape, np.int32)
    if best.placement is not None:
        placement[:len(best.placement)] = best.placement
    item.update({
        "weights": pad(weights, tf.float32), "length": np.int32(size),
        "episodes": {"problem": np.array([s["problem"] for s in summaries], np.int32),
                     "step_time_s": np.array([s["step_time_s"] for s in summaries], np.float64),
                     "initial_step_time_s": np.array([s["initial_step_time_s"] for s in summaries], np.float64),
                     "improvement": np.array([s["improvement"] for s in summaries], np.float64),
                     "oom": np.array([s["oom"] for s in summaries], bool)},
        "best": {"problem": np.int32(problem), "step_time_s": np.float64(best.step_time_s),
                 "oom": np.bool_(best.oom), "placement": placement, "found": np.bool_(best.placement is not None)},
        "actor": np.int64(actor), "incarnation": np.int32(incarnation), "policy_step": np.int64(policy_step),
        "actor_episodes": np.int64(actor_episodes), "actor_wall_s": np.float64(actor_wall_s)})
    return item


def unpack_item(item: dict, problems: Sequence[Problem]):
    """(Batch, meta dict) of an item: the trajectory cut back to its true length."""
    import tensorflow as tf
    from tf_agents.trajectories import trajectory as trajectory_lib

    from tfplaceto.rl.train import Batch

    size = int(item["length"])
    cut = {field: tf.nest.map_structure(lambda x: np.asarray(x)[:, :size], item[field])
           for field in _TRAJECTORY_FIELDS}
    experience = trajectory_lib.Trajectory(policy_info=(), **cut)
    weights = np.asarray(item["weights"])[:, :size]
    episodes = item["episodes"]
    summaries = [{"problem": int(p), "step_time_s": float(t), "initial_step_time_s": float(t0),
                  "improvement": float(i), "oom": bool(o)}
                 for p, t, t0, i, o in zip(episodes["problem"], episodes["step_time_s"],
                                           episodes["initial_step_time_s"], episodes["improvement"],
                                           episodes["oom"])]
    best_item, candidates = item["best"], []
    if bool(best_item["found"]):
        index = int(best_item["problem"])
        candidates.append((index, Best(float(best_item["step_time_s"]), bool(best_item["oom"]),
                                       np.asarray(best_item["placement"])[:problems[index].num_nodes].copy())))
    meta = {key: item[key].item() for key in ("actor", "incarnation", "policy_step", "actor_episodes",
                                               "actor_wall_s")}
    return Batch(experience, weights, summaries, candidates), meta


# -- the job: what actors collect ----------------------------------------------------------------
def make_job(sources: Sequence | None, clusters: Sequence | None, problems: Sequence[Problem], settings: dict,
             dims) -> dict:
    """The JSON-able description actors build their environment from (module docstring)."""
    from tfplaceto.rl.logdir import problem_fingerprints

    initial = settings["initial"]
    names = list(initial) if isinstance(initial, tuple) else [initial]
    if not all(isinstance(name, str) for name in names):
        raise errors.InvalidArgumentError("actors start from initial placements named by a string "
                                          "('random', 'single', 'baseline'), not arrays or functions")
    return {"sources": None if sources is None else list(sources),
            "clusters": None if clusters is None else list(clusters),
            "fingerprints": problem_fingerprints(problems), "initial": names, "order": settings["order"],
            "lanes": settings["lanes"], "oom_penalty": settings["oom_penalty"],
            "shared_start": settings["shared_start"], "seed": settings["seed"],
            "network": settings["network"], "dims": [dims.nodes, dims.edges, dims.devices, dims.steps]}


def _server(env, lanes: int, variables: dict, port: int | None, queue_size: int, directory: str):
    """The Reverb server (its checkpoint directory, never written to, is `directory`: Reverb's
    default would leave a temporary directory behind per run)."""
    import reverb
    import tensorflow as tf

    def single(name, signature):
        return reverb.Table(name=name, sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                            rate_limiter=reverb.rate_limiters.MinSize(1), max_size=1, max_times_sampled=0,
                            signature=signature)

    variable_signature = tf.nest.map_structure(lambda v: tf.TensorSpec(v.shape, v.dtype), variables)
    tables = [reverb.Table.queue(TRAJECTORIES, max_size=queue_size, signature=item_spec(env, lanes)),
              single(VARIABLES, variable_signature), single(JOB, tf.TensorSpec((), tf.string))]
    try:
        return reverb.Server(tables, port=port, checkpointer=reverb.checkpointers.DefaultCheckpointer(directory))
    except Exception as e:  # reverb raises RuntimeError / ValueError for a port it cannot bind
        raise errors.DistributedError(f"cannot serve Reverb on port {port}: {errors.first_line(e)}") from None


# -- the learner side ----------------------------------------------------------------------------
class Launcher:
    """The learner's Reverb server, its local actor processes, and the collector `train` uses.

    Args:
      sources, clusters: what the actors build their problems from (strings: graph sources,
        presets); None when every actor is given its problems (in-process actors, tests).
      actors: local actor processes to start (0: only actors started elsewhere).
      address: "HOST:PORT": serve on PORT (on every interface) for actors on other machines;
        None: a free port, local actors only.
      logdir: where actor logs and actors.json go (None: a temporary directory).
      timeout_s: an error when no batch arrives for this long.
    """

    def __init__(self, sources: Sequence | None, clusters: Sequence | None, actors: int = 0,
                 address: str | None = None, logdir: str | None = None, timeout_s: float = 900.0):
        if not isinstance(actors, int) or isinstance(actors, bool) or actors < 0:
            raise errors.InvalidArgumentError(f"actors must be a non-negative integer, got {actors!r}")
        self._sources, self._clusters, self._actors = sources, clusters, actors
        self._port = None if address is None else parse_address(address)[1]
        self._logdir = logdir
        self._timeout_s = timeout_s
        self._server = None
        self._reverb_dir = None
        self._procs: dict[int, subprocess.Popen] = {}
        self._incarnations: dict[int, int] = {}
        self._failures: dict[int, int] = {}
        self._delivered: set[tuple[int, int]] = set()
        self._logs: dict[int, str] = {}
        self._items: queue.Queue = queue.Queue(maxsize=1)
        self._closing = threading.Event()
        self._counts: dict[str, int] = {}
        self._rates: dict[int, tuple[int, int, float]] = {}  # actor -> (incarnation, episodes, wall)
        self._pending: dict[int, dict] = {}
        self._waited = 0.0
        self.actor_rates: dict[int, list[float]] = {}  # actor -> its episodes/s between its items

    @property
    def address(self) -> str:
        """Where actors on this machine reach the server ("localhost:PORT")."""
        if self._server is None:
            raise errors.DistributedError("the Reverb server is not running")
        return f"localhost:{self._server.port}"

    def start(self, env, policy, agent, settings: dict) -> Launcher:
        """Serves Reverb, publishes the job and the weights, starts the actors (the `collector`
        hook of `tfplaceto.rl.train.train`)."""
        import reverb
        import tensorflow as tf
        from tf_agents.experimental.distributed import reverb_variable_container

        del policy  # actors run their own copy of the collect policy
        self._problems = env.problems
        self._agent = agent
        job = make_job(self._sources, self._clusters, env.problems, settings, env.dims)
        self._variables = {POLICY_KEY: agent.network.variables, TRAIN_STEP_KEY: agent.train_step_counter}
        self._reverb_dir = tempfile.mkdtemp(prefix="tfplaceto-reverb-")
        self._server = _server(env, settings["lanes"], self._variables, self._port, max(self._actors, 1),
                               self._reverb_dir)
        self._client = reverb.Client(self.address)
        self._client.insert(tf.constant(json.dumps(job)), priorities={JOB: 1.0})
        self._container = reverb_variable_container.ReverbVariableContainer(self.address, table_names=[VARIABLES])
        self._container.push(self._variables, VARIABLES)
        self._counts = read_episodes_per_actor(self._logdir)  # of the run this one resumes
        self._actors_dir = os.path.join(self._logdir, "actors") if self._logdir else tempfile.mkdtemp(
            prefix="tfplaceto-actors-")
        os.makedirs(self._actors_dir, exist_ok=True)
        for actor in range(self._actors):
            self._spawn(actor)
        threading.Thread(target=self._pump, name="tfplaceto-reverb-sampler", daemon=True).start()
        return self

    def _spawn(self, actor: int) -> None:
        incarnation = self._incarnations.get(actor, -1) + 1
        self._incarnations[actor] = incarnation
        log = os.path.join(self._actors_dir, f"actor-{actor}.log")
        self._logs[actor] = log
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)  # this very code
        command = [sys.executable, "-m", "tfplaceto", "actor", "--reverb-address", self.address,
                   "--actor-id", str(actor), "--incarnation", str(incarnation), "--parent-pid", str(os.getpid())]
        with open(log, "a") as out:
            out.write(f"--- incarnation {incarnation}: {' '.join(command)}\n")
            out.flush()
            self._procs[actor] = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                                  stdin=subprocess.DEVNULL)
        self._write_actors()

    def _write_actors(self) -> None:
        from tfplaceto.placement import atomic_write

        atomic_write(os.path.join(self._actors_dir, "actors.json"), json.dumps(
            {str(a): {"pid": p.pid, "incarnation": self._incarnations[a], "log": self._logs[a]}
             for a, p in self._procs.items()}).encode())

    def _check_actors(self) -> None:
        """Restarts the local actors that exited; an error for one that keeps failing at start."""
        for actor, proc in list(self._procs.items()):
            status = proc.poll()
            if status is None:
                continue
            if (actor, self._incarnations[actor]) not in self._delivered:
                self._failures[actor] = self._failures.get(actor, 0) + 1
            if self._failures.get(actor, 0) >= _FAILURES_BEFORE_ERROR:
                raise errors.DistributedError(
                    f"actor {actor} exited with status {status} {self._failures[actor]} times before "
                    f"delivering a batch: {_last_line(self._logs[actor])} (log: {self._logs[actor]})")
            print(f"tfplaceto: actor {actor} exited with status {status}; restarting it", file=sys.stderr)
            self._spawn(actor)

    def _pump(self) -> None:
        """Moves items from the Reverb queue to `self._items` (a thread: the learner polls)."""
        try:
            for sample in self._client.sample(TRAJECTORIES, num_samples=2**62, emit_timesteps=False,
                                              unpack_as_table_signature=True):
                while not self._closing.is_set():
                    try:
                        self._items.put(sample.data, timeout=0.5)
                        break
                    except queue.Full:
                        continue
        except Exception as e:  # the server stopped (close) or failed
            if not self._closing.is_set():
                self._items.put(e)

    def batch(self):
        """The next batch from the queue (blocks; restarts dead actors meanwhile)."""
        begin = time.monotonic()
        while True:
            self._check_actors()
            try:
                item = self._items.get(timeout=0.5)
                break
            except queue.Empty:
                if time.monotonic() - begin > self._timeout_s:
                    raise errors.DistributedError(
                        f"no batch from any actor in {self._timeout_s:.0f} s (local actors' logs: "
                        f"{self._actors_dir}); start actors with `tfplaceto actor --reverb-address ...`") from None
        if isinstance(item, Exception):
            raise errors.DistributedError(f"the Reverb sampler failed: {errors.first_line(item)}")
        self._waited += time.monotonic() - begin
        batch, meta = unpack_item(item, self._problems)
        actor = meta["actor"]
        self._delivered.add((actor, meta["incarnation"]))
        self._failures[actor] = 0
        self._counts[str(actor)] = self._counts.get(str(actor), 0) + len(batch.summaries)
        pending = {"policy_lag": int(self._agent.train_step_counter.numpy()) - meta["policy_step"]}
        previous = self._rates.get(actor)
        if previous and previous[0] == meta["incarnation"] and meta["actor_wall_s"] > previous[2]:
            pending["episodes_per_s"] = (meta["actor_episodes"] - previous[1]) / (meta["actor_wall_s"] - previous[2])
            self.actor_rates.setdefault(actor, []).append(pending["episodes_per_s"])
        self._rates[actor] = (meta["incarnation"], meta["actor_episodes"], meta["actor_wall_s"])
        self._pending[actor] = pending
        return batch

    def after_update(self, agent, writer, episodes: int) -> None:
        """Publishes the new weights; writes the per-actor scalars of the batches since the last call."""
        import tensorflow as tf

        self._container.push(self._variables, VARIABLES)
        if writer is not None:
            with writer.as_default(step=episodes):
                for actor, scalars in self._pending.items():
                    for name, value in scalars.items():
                        tf.summary.scalar(f"actors/{actor}/{name}", value)
                tf.summary.scalar("learner/wait_s", self._waited)
        self._pending, self._waited = {}, 0.0

    def episodes_per_actor(self) -> dict[str, int]:
        return dict(self._counts)

    def close(self) -> None:
        """Stops the local actors (SIGTERM, then SIGKILL after 5 s) and the server."""
        self._closing.set()
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 5.0
        for proc in self._procs.values():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._reverb_dir is not None:
            shutil.rmtree(self._reverb_dir, ignore_errors=True)


def _last_line(path: str) -> str:
    try:
        with open(path) as f:
            lines = [line.strip() for line in f if line.strip() and not line.startswith("---")]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"


def train_distributed(problems: Sequence[Problem], sources: Sequence | None, clusters: Sequence | None,
                      episodes: int, logdir: str | None, seed: int = 0, actors: int = 0,
                      reverb_address: str | None = None, **config):
    """`tfplaceto.rl.train.train` with its batches from Reverb actors (module docstring).

    `actors` local actor processes are started (and stopped at the end, on errors and on
    Ctrl-C); with `reverb_address` the server also takes actors from other machines.
    """
    from tfplaceto.rl.train import train

    if actors == 0 and reverb_address is None:
        raise errors.InvalidArgumentError("distributed training needs actors > 0 or a Reverb address "
                                          "for actors started elsewhere")
    launcher = Launcher(sources, clusters, actors, reverb_address, logdir)
    try:
        return train(problems, episodes=episodes, logdir=logdir, seed=seed, collector=launcher.start, **config)
    finally:
        launcher.close()


def train_sources(sources, clusters, episodes: int, logdir: str | None, seed: int = 0, actors: int = 0,
                  reverb_address: str | None = None, **config):
    """`tfplaceto.train`: a policy trained on every source on every cluster (see `train`).

    actors > 0 (or a `reverb_address`, "HOST:PORT", to serve actors on other machines): collection
    in actor processes through a Reverb server (`tfplaceto.rl.distributed`); 0: the embedded engine.
    """
    from tfplaceto.rl.train import problems_for, train

    if not isinstance(actors, int) or isinstance(actors, bool) or actors < 0:
        raise errors.InvalidArgumentError(f"actors must be a non-negative integer, got {actors!r}")
    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes < 1:
        raise errors.TfplacetoError(f"episodes must be a positive integer, got {episodes!r}")
    sources = [sources] if isinstance(sources, str) or not isinstance(sources, Sequence) else list(sources)
    clusters = [clusters] if isinstance(clusters, str) or not isinstance(clusters, Sequence) else list(clusters)
    if not sources or not clusters:
        raise errors.TfplacetoError("train needs at least one source and one cluster")
    if reverb_address is not None:
        parse_address(reverb_address)  # before building any problem
    if (actors or reverb_address) and not all(isinstance(x, str) for x in [*sources, *clusters]):
        raise errors.InvalidArgumentError("with actors, sources and clusters must be named by strings (paths, "
                                          "builtin:NAME, presets): actor processes rebuild them from their names")
    problems, labels = problems_for(sources, clusters)
    if actors or reverb_address:
        result = train_distributed(problems, sources, clusters, episodes, logdir, seed=seed, actors=actors,
                                   reverb_address=reverb_address, **config)
    else:
        result = train(problems, episodes=episodes, logdir=logdir, seed=seed, **config)
    result.labels = labels
    return result


# -- the actor -------------------------------------------------------------------------------------
def _read_job(client, address: str, timeout_s: float) -> dict:
    import reverb

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.server_info(timeout=5)
            break
        except (reverb.errors.DeadlineExceededError, RuntimeError, ValueError) as e:
            if time.monotonic() > deadline:
                raise errors.DistributedError(f"no Reverb server at {address} ({errors.first_line(e)}); "
                                              "start `tfplaceto train ... --reverb-address` first") from None
            time.sleep(1.0)
    sample = next(client.sample(JOB, num_samples=1, emit_timesteps=False, unpack_as_table_signature=True))
    value = sample.data
    value = value.item() if hasattr(value, "item") else value
    return json.loads(value.decode() if isinstance(value, bytes) else value)


def run_actor(address: str, actor_id: int = 0, incarnation: int = 0, parent_pid: int | None = None,
              batches: int | None = None, problems: Sequence[Problem] | None = None,
              connect_timeout_s: float = 120.0, exit_when_gone: bool = False) -> int:
    """Collects batches for the learner at `address` until it is gone (or `batches` are written).

    Args:
      address: the learner's Reverb server, "HOST:PORT".
      actor_id, incarnation: who this is (its seed derives from them and the job's seed).
      parent_pid: stop when this process is no longer the parent (the launcher died).
      batches: stop after writing this many (None: until the learner stops).
      problems: the job's problems, when already built (else from its sources and clusters).
      connect_timeout_s: how long to wait for the server at start.
      exit_when_gone: once connected, end the process when the learner is gone
        (`exit_when_learner_gone`; for actor processes, not threads).
    Returns the number of batches written.
    """
    import reverb
    import tensorflow as tf
    from tf_agents.experimental.distributed import reverb_variable_container
    from tf_agents.policies import py_tf_eager_policy

    from tfplaceto.policy import observation
    from tfplaceto.policy.network import PlacetoNetwork
    from tfplaceto.rl.acting import specs
    from tfplaceto.rl.agent import PlacetoPolicy, as_tensors
    from tfplaceto.rl.environment import PlacementEnvironment
    from tfplaceto.rl.logdir import problem_fingerprints
    from tfplaceto.rl.train import problems_for

    parse_address(address)
    client = reverb.Client(address)
    job = _read_job(client, address, connect_timeout_s)
    if exit_when_gone:
        exit_when_learner_gone(address, parent_pid)
    if problems is None:
        if job["sources"] is None:
            raise errors.DistributedError("this learner's problems are not named by sources: its actors "
                                          "must run in its process")
        problems, _ = problems_for(job["sources"], job["clusters"])
    if problem_fingerprints(problems) != job["fingerprints"]:
        raise errors.DistributedError("this actor's graphs or clusters differ from the learner's (another "
                                      "tfplaceto version, or other files at the same paths)")
    seed = actor_seed(job["seed"], actor_id, incarnation)
    env = PlacementEnvironment(problems, batch_size=job["lanes"], initial=tuple(job["initial"]),
                               order=job["order"], seed=seed, oom_penalty=job["oom_penalty"],
                               shared_start=job["shared_start"], dims=observation.Dims(*job["dims"]))
    network = PlacetoNetwork(**job["network"])
    network.warm_up()
    policy = PlacetoPolicy(*specs(env), network, as_tensors(observation.pack(env.statics, env.dims)), seed=seed)
    py_policy = py_tf_eager_policy.PyTFEagerPolicy(policy, use_tf_function=True, batch_time_steps=False)
    container = reverb_variable_container.ReverbVariableContainer(address, table_names=[VARIABLES])
    train_step = tf.Variable(0, dtype=tf.int64, trainable=False)
    variables = {POLICY_KEY: network.variables, TRAIN_STEP_KEY: train_step}
    spec = item_spec(env, job["lanes"])

    def orphaned() -> bool:
        return parent_pid is not None and os.getppid() != parent_pid

    def gone() -> bool:
        try:
            client.server_info(timeout=5)
            return False
        except Exception:  # noqa: BLE001  (any failure to reach it: the learner has stopped)
            return True

    progress = {"written": 0}
    try:
        _collect_loop(client, container, variables, env, py_policy, spec, actor_id, incarnation, batches,
                      orphaned, gone, progress)
    except (tf.errors.OpError, RuntimeError, reverb.errors.ReverbError, _LearnerGone) as e:
        if not isinstance(e, _LearnerGone) and not gone():
            raise
        print(f"tfplaceto: actor {actor_id}: the learner at {address} is gone ({errors.first_line(e)}); "
              f"{progress['written']} batches written", file=sys.stderr)
    return progress["written"]


def exit_when_learner_gone(address: str, parent_pid: int | None = None, every_s: float = 5.0) -> None:
    """Starts a thread that ends this process (status 0) once its learner is gone: the parent
    process `parent_pid` died, or the server at `address` did not answer twice in a row (a call
    into Reverb that was under way when the server went away would otherwise wait forever).
    For actor processes only (`tfplaceto actor`)."""
    import reverb

    def watch() -> None:
        client, misses = reverb.Client(address), 0
        while True:
            time.sleep(every_s)
            try:
                client.server_info(timeout=5)
                misses = 0
            except Exception:  # noqa: BLE001  (any failure to reach it)
                misses += 1
            if misses >= 2 or (parent_pid is not None and os.getppid() != parent_pid):
                print(f"tfplaceto: actor: the learner at {address} is gone; exiting", file=sys.stderr, flush=True)
                os._exit(0)

    threading.Thread(target=watch, name="tfplaceto-learner-watch", daemon=True).start()


class _LearnerGone(Exception):
    """The actor's learner stopped (its server does not answer, or the launcher process died)."""


def _collect_loop(client, container, variables: dict, env, py_policy, spec: dict, actor_id: int,
                  incarnation: int, batches: int | None, orphaned, gone, progress: dict) -> None:
    """The actor's loop: pull the weights, collect a batch, write it (blocking while the queue is
    full); counts the batches written in `progress["written"]`."""
    import reverb
    import tensorflow as tf

    from tfplaceto.rl.acting import collect

    start, episodes = time.perf_counter(), 0
    # Not `with`: leaving the writer's context flushes with no timeout, forever if the learner is gone.
    writer = client.trajectory_writer(num_keep_alive_refs=1)
    try:
        while (batches is None or progress["written"] < batches) and not orphaned():
            # Reverb's clients wait for a server that went away (sampling the weights would block
            # forever): ask first, with a timeout. `exit_when_learner_gone` covers the rest.
            if gone():
                raise _LearnerGone("its Reverb server does not answer")
            container.update(variables, VARIABLES)
            experience, weights, _ = collect(env, py_policy, env.reset())
            summaries = env.pop_summaries()
            episodes += len(summaries)
            problem = summaries[0]["problem"]
            item = pack_item(spec, experience, weights, summaries, env.best_for(problem), problem, actor_id,
                             incarnation, int(variables[TRAIN_STEP_KEY].numpy()), episodes,
                             time.perf_counter() - start)
            writer.append(item)
            writer.create_item(TRAJECTORIES, 1.0, tf.nest.map_structure(lambda column: column[-1],
                                                                        writer.history))
            while True:  # blocks while the queue is full (the rate limiter), watching the learner
                try:
                    writer.flush(timeout_ms=2000)
                    break
                except reverb.errors.DeadlineExceededError:
                    if orphaned() or gone():
                        raise _LearnerGone("no confirmation of the last batch") from None
            progress["written"] += 1
    finally:
        writer.close()
