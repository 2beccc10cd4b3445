"""The actor side of distributed training: the `tfplaceto actor` process.

`run_actor(address, ...)` is the actor: it reads the job (`tfplaceto.rl.reverb_items`), rebuilds
the problems from their sources (and refuses to collect if their fingerprints differ from the
learner's: another version, other files), then loops (`_collect_loop`): pull the weights, collect
one batch with `tfplaceto.rl.acting.collect` (the embedded engine's own lockstep collection),
write it (blocking while the learner's queue is full). Each actor has its own seed
(`actor_seed`: from the job's seed, its id and its incarnation). `tfplaceto actor
--reverb-address HOST:PORT` runs it on another machine; the learner's `Launcher`
(`tfplaceto.rl.learner`) starts local ones.

An actor ends when its learner is gone: its Reverb server does not answer or, for a local actor,
the launcher process died (`exit_when_learner_gone` watches both from a thread, for calls into
Reverb that would otherwise wait forever).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence

import numpy as np
import reverb
import tensorflow as tf
from tf_agents.experimental.distributed import reverb_variable_container

from tfplaceto import errors
from tfplaceto.policy import observation
from tfplaceto.policy.network import PlacetoNetwork
from tfplaceto.problem import Problem
from tfplaceto.rl import reverb_items
from tfplaceto.rl.acting import CompiledPyPolicy, collect, specs
from tfplaceto.rl.agent import PlacetoPolicy, as_tensors
from tfplaceto.rl.environment import PlacementEnvironment
from tfplaceto.rl.logdir import problem_fingerprints
from tfplaceto.rl.train import problems_for


def actor_seed(seed: int, actor_id: int, incarnation: int) -> int:
    """The seed of an actor's environment and sampling: its own for every id and restart."""
    return int(np.random.SeedSequence([seed, actor_id, incarnation]).generate_state(1)[0])


def _read_job(client, address: str, timeout_s: float) -> dict:
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
    sample = next(client.sample(reverb_items.JOB, num_samples=1, emit_timesteps=False,
                                unpack_as_table_signature=True))
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

    reverb_items.parse_address(address)
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
    network = PlacetoNetwork(**job["network"])
    network.warm_up()
    env = PlacementEnvironment(problems, batch_size=job["lanes"], initial=tuple(job["initial"]),
                               order=job["order"], seed=seed, oom_penalty=job["oom_penalty"],
                               shared_start=job["shared_start"], dims=observation.Dims(*job["dims"]),
                               prioritize=job.get("prioritize", 0.0), memory_headroom=job.get("memory_headroom"),
                               **network.acting)
    policy = PlacetoPolicy(*specs(env), network, as_tensors(observation.pack(env.statics, env.dims)), seed=seed,
                           jit_score=True, exploration=job.get("exploration", 0.0))
    py_policy = CompiledPyPolicy(policy, job["lanes"])
    container = reverb_variable_container.ReverbVariableContainer(address, table_names=[reverb_items.VARIABLES])
    train_step = tf.Variable(0, dtype=tf.int64, trainable=False)
    variables = {reverb_items.POLICY_KEY: network.variables, reverb_items.TRAIN_STEP_KEY: train_step}
    spec = reverb_items.item_spec(env, job["lanes"])

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


def _pull_weights(container, variables: dict, orphaned, gone, every_s: float = 2.0) -> None:
    """`container.update(variables)`, given up (`_LearnerGone`) once the learner is gone.

    Reverb's sampler waits forever for a server that went away, and in the server's own process
    (an actor thread) for a table that was closed, with no timeout to pass: the server can stop
    between any check and the pull. So the pull runs in a thread of its own while this one
    watches the learner; a pull that never returns is left behind in its (daemon) thread.
    """
    failure: list[BaseException] = []

    def pull() -> None:
        try:
            container.update(variables, reverb_items.VARIABLES)
        except BaseException as e:  # noqa: BLE001  (raised again in the caller's thread)
            failure.append(e)

    if orphaned() or gone():
        raise _LearnerGone("its Reverb server does not answer")
    worker = threading.Thread(target=pull, name="tfplaceto-pull-weights", daemon=True)
    worker.start()
    while True:
        worker.join(every_s)
        if not worker.is_alive():
            break
        if orphaned() or gone():
            raise _LearnerGone("the policy's weights did not arrive")
    if failure:
        raise failure[0]


def _collect_loop(client, container, variables: dict, env, py_policy, spec: dict, actor_id: int,
                  incarnation: int, batches: int | None, orphaned, gone, progress: dict) -> None:
    """The actor's loop: pull the weights, collect a batch, write it (blocking while the queue is
    full); counts the batches written in `progress["written"]`."""

    start, episodes = time.perf_counter(), 0
    # Not `with`: leaving the writer's context flushes with no timeout, forever if the learner is gone.
    writer = client.trajectory_writer(num_keep_alive_refs=1)
    try:
        while (batches is None or progress["written"] < batches) and not orphaned():
            _pull_weights(container, variables, orphaned, gone)
            experience, weights, _ = collect(env, py_policy, env.reset())
            summaries = env.pop_summaries()
            episodes += len(summaries)
            problem = summaries[0]["problem"]
            item = reverb_items.pack_item(spec, experience, weights, summaries, env.best_for(problem), problem,
                                          actor_id, incarnation, int(variables[reverb_items.TRAIN_STEP_KEY].numpy()),
                                          episodes, time.perf_counter() - start)
            writer.append(item)
            writer.create_item(reverb_items.TRAJECTORIES, 1.0,
                               tf.nest.map_structure(lambda column: column[-1], writer.history))
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
