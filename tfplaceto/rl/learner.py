"""The learner side of distributed training, and `tfplaceto.train`'s entry point.

`train_sources(sources, clusters, episodes, logdir, seed, actors, reverb_address, **config)` is
`tfplaceto.train` and `tfplaceto train`: the problems of every source on every cluster, trained
by the embedded engine (`actors=0`, no address: `tfplaceto.rl.train.train`) or with actors
(`train_distributed`: the same loop with its batches from Reverb; the tables and items are
`tfplaceto.rl.reverb_items`, the actors `tfplaceto.rl.actor_process`).

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

Staleness is bounded by the queue: it holds at most `max(actors, 1)` items, an actor blocks on
its insert while it is full and pulls the newest weights right before each batch, so an item is
at most a few learner updates old (TensorBoard: `actors/<id>/policy_lag`).

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

import tensorflow as tf

from tfplaceto import errors
from tfplaceto.outputs import atomic_write
from tfplaceto.problem import Problem
from tfplaceto.rl import cloning, reverb_items
from tfplaceto.rl.logdir import read_episodes_per_actor
from tfplaceto.rl.train import problems_for, train

_FAILURES_BEFORE_ERROR = 3


def _server(env, lanes: int, variables: dict, port: int | None, queue_size: int, directory: str):
    """The Reverb server (its checkpoint directory, never written to, is `directory`: Reverb's
    default would leave a temporary directory behind per run)."""
    import reverb  # here and in `start`: an embedded run (train_sources, actors=0) never loads Reverb

    def single(name, signature):
        return reverb.Table(name=name, sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                            rate_limiter=reverb.rate_limiters.MinSize(1), max_size=1, max_times_sampled=0,
                            signature=signature)

    variable_signature = tf.nest.map_structure(lambda v: tf.TensorSpec(v.shape, v.dtype), variables)
    tables = [reverb.Table.queue(reverb_items.TRAJECTORIES, max_size=queue_size,
                                 signature=reverb_items.item_spec(env, lanes)),
              single(reverb_items.VARIABLES, variable_signature),
              single(reverb_items.JOB, tf.TensorSpec((), tf.string))]
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
        self._port = None if address is None else reverb_items.parse_address(address)[1]
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
        from tf_agents.experimental.distributed import reverb_variable_container

        del policy  # actors run their own copy of the collect policy
        self._problems = env.problems
        self._agent = agent
        job = reverb_items.make_job(self._sources, self._clusters, env.problems, settings, env.dims)
        self._variables = {reverb_items.POLICY_KEY: agent.network.variables,
                           reverb_items.TRAIN_STEP_KEY: agent.train_step_counter}
        self._reverb_dir = tempfile.mkdtemp(prefix="tfplaceto-reverb-")
        self._server = _server(env, settings["lanes"], self._variables, self._port, max(self._actors, 1),
                               self._reverb_dir)
        self._client = reverb.Client(self.address)
        self._client.insert(tf.constant(json.dumps(job)), priorities={reverb_items.JOB: 1.0})
        self._container = reverb_variable_container.ReverbVariableContainer(
            self.address, table_names=[reverb_items.VARIABLES])
        self._container.push(self._variables, reverb_items.VARIABLES)
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
            for sample in self._client.sample(reverb_items.TRAJECTORIES, num_samples=2**62, emit_timesteps=False,
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
        batch, meta = reverb_items.unpack_item(item, self._problems)
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
        self._container.push(self._variables, reverb_items.VARIABLES)
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
    if actors == 0 and reverb_address is None:
        raise errors.InvalidArgumentError("distributed training needs actors > 0 or a Reverb address "
                                          "for actors started elsewhere")
    launcher = Launcher(sources, clusters, actors, reverb_address, logdir)
    try:
        return train(problems, episodes=episodes, logdir=logdir, seed=seed, collector=launcher.start, **config)
    finally:
        launcher.close()


def train_sources(sources, clusters, episodes: int, logdir: str | None, seed: int = 0, actors: int = 0,
                  reverb_address: str | None = None, select_sources: Sequence | None = None, **config):
    """`tfplaceto.train`: a policy trained on every source on every cluster (see `train`).

    select_sources: graphs (on the same clusters) that model selection evaluates on instead of
    the training problems (`train(select_on=...)`): validation graphs, never trained on.

    A fresh run begins with the teacher phase when gin turns it on (`clone_teachers.updates`,
    `tfplaceto.rl.cloning`): climbed baselines of the sources (and of more members of their
    families) cloned into the fresh weights, kept in `logdir/teachers`.

    actors > 0 (or a `reverb_address`, "HOST:PORT", to serve actors on other machines): collection
    in actor processes through a Reverb server (`train_distributed`); 0: the embedded engine.
    """
    if not isinstance(actors, int) or isinstance(actors, bool) or actors < 0:
        raise errors.InvalidArgumentError(f"actors must be a non-negative integer, got {actors!r}")
    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes < 1:
        raise errors.TfplacetoError(f"episodes must be a positive integer, got {episodes!r}")
    sources = [sources] if isinstance(sources, str) or not isinstance(sources, Sequence) else list(sources)
    clusters = [clusters] if isinstance(clusters, str) or not isinstance(clusters, Sequence) else list(clusters)
    if not sources or not clusters:
        raise errors.TfplacetoError("train needs at least one source and one cluster")
    if reverb_address is not None:
        reverb_items.parse_address(reverb_address)  # before building any problem
    if (actors or reverb_address) and not all(isinstance(x, str) for x in [*sources, *clusters]):
        raise errors.InvalidArgumentError("with actors, sources and clusters must be named by strings (paths, "
                                          "builtin:NAME, presets): actor processes rebuild them from their names")
    if "pretrain" not in config:
        config["pretrain"] = cloning.clone_teachers(sources, clusters, os.path.join(logdir, "teachers") if logdir
                                                    else None, seed, config.get("progress", True))
    problems, labels = problems_for(sources, clusters)
    if select_sources:
        config["select_on"] = problems_for(list(select_sources), clusters)[0]
    if actors or reverb_address:
        result = train_distributed(problems, sources, clusters, episodes, logdir, seed=seed, actors=actors,
                                   reverb_address=reverb_address, **config)
    else:
        result = train(problems, episodes=episodes, logdir=logdir, seed=seed, **config)
    result.labels = labels
    return result
