"""Training the Placeto policy: the loop, REINFORCE updates, summaries, resumable runs.

  train(problems, episodes, logdir, seed, ...)   the loop (gin-configurable): one batch of
                       `lanes` episodes of one problem per update (problems sampled per batch;
                       or the mean gradient of `problems_per_update` batches),
                       entropy bonus decayed linearly, TensorBoard summaries, a tqdm bar, a
                       checkpoint every few updates in `logdir` (`tfplaceto.rl.logdir`: what it
                       holds); run it again with the same arguments and it resumes exactly from
                       the last checkpoint. Returns a `TrainResult`.
  Batch, Embedded      what a collector hands the loop; the embedded engine (below).
  _Selection           model selection: the best policy alone evaluated during training.
  _WeightAverage       an exponential moving average of the weights: what selection evaluates and
                       the run exports, with `average_weights`.
  problems_for(sources, clusters)  Problems (and labels, `problem_label`) of every source on every cluster.
Running a policy (`collect`, `Actor`, `greedy_placements`) is `tfplaceto.rl.acting`;
`tfplaceto.train` (sources x clusters, embedded or with Reverb actors) is
`tfplaceto.rl.learner.train_sources`.

Where batches come from is a hook: `train(..., collector=factory)` calls
`factory(env, policy, agent, settings)` once (after a resume has restored the weights) and then
takes every batch from the object it returns (`Embedded` below by default: lockstep collection in
this process; `tfplaceto.rl.learner.Launcher` for Reverb actors). A collector has
`batch() -> Batch`, `after_update(agent, writer, episodes)` (after the updates on a batch, or on a
group of `problems_per_update` batches: publish the weights, write its own summaries) and
`episodes_per_actor() -> dict`.

The budget is an episode count (seeded), so a result does not depend on the machine's speed.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Sequence

import gin
import numpy as np
import tensorflow as tf
from tf_agents.policies import policy_saver

from tfplaceto import errors
from tfplaceto.cluster import Cluster, as_cluster
from tfplaceto.costs import profile
from tfplaceto.graph import OpGraph, import_graph
from tfplaceto.graph.implementations import target_device_type
from tfplaceto.policy import observation
from tfplaceto.policy.checkpoint import save_policy
from tfplaceto.policy.network import PlacetoNetwork
from tfplaceto.problem import Problem, make_problem
from tfplaceto.progress import tqdm
from tfplaceto.rl.acting import Actor, CompiledPyPolicy, collect, replay_placement, specs
from tfplaceto.rl.agent import PlacetoAgent, as_tensors
from tfplaceto.rl.environment import MEMORY_HEADROOM, Best, PlacementEnvironment, placement_cost
from tfplaceto.rl.logdir import (
    best_from_json,
    best_to_json,
    open_logdir,
    problem_fingerprints,
    write_json,
)
from tfplaceto.search import best_baseline, climbed_baseline


# -- model selection ------------------------------------------------------------------------------
class _Selection:
    """Keeps the best policy alone seen in training: model selection on the training problems
    (or on the validation problems `train(select_on=...)` gives).

    Every few updates the policy alone (greedy episodes from `starts` fixed random starts drawn
    with a seed of their own, not the training starts) runs on up to `count` of the problems
    given (evenly spread); its score is the geometric mean over them of the mean end step time
    relative to the first evaluation's (the weights training began from); an end placement that
    runs out of memory counts with the environment's OOM penalty (`placement_cost`), so a policy
    whose placements do not fit is not exported for their step time. REINFORCE's greedy
    policy moves between placements from one update to the next; the exported policy is the
    best one evaluated, not the last.
    """

    def __init__(self, problems: Sequence[Problem], network: PlacetoNetwork, seed: int, starts: int,
                 count: int, oom_penalty: float = 1.0, memory_headroom: float | None = MEMORY_HEADROOM):
        indices = sorted({int(i) for i in np.linspace(0, len(problems) - 1, min(count, len(problems))).round()})
        self._runs = [(problems[i], problems[i].simulator(), Actor(problems[i], network, seed, memory_headroom))
                      for i in indices]
        self._network, self._seed, self._starts = network, 20_000 + seed, starts
        self._oom_penalty = oom_penalty
        self.reference: np.ndarray | None = None
        self.score, self.episode, self.weights = np.inf, None, None

    def offer(self, episode: int) -> bool:
        """Evaluates the network as it is now; True (and its weights kept) when it is the best."""
        def cost(problem: Problem, simulator, placement: np.ndarray) -> float:
            step_time, peak, _ = simulator.run(placement)
            return placement_cost(step_time, peak, problem.memory_bytes, self._oom_penalty)

        times = np.array([np.mean([cost(problem, simulator, p) for p in
                                   actor.episodes("random", self._starts, greedy=True, seed=self._seed)])
                          for problem, simulator, actor in self._runs])
        if self.reference is None:
            self.reference = times
        score = float(np.exp(np.mean(np.log(np.maximum(times, 1e-12) / np.maximum(self.reference, 1e-12)))))
        if score >= self.score:
            return False
        self.score, self.episode = score, episode
        self.weights = [v.numpy() for v in self._network.variables]
        return True

    def to_json(self) -> dict:
        return {"reference": None if self.reference is None else self.reference.tolist(),
                "score": self.score if np.isfinite(self.score) else None, "episode": self.episode}

    def load(self, payload: dict) -> None:
        reference = None if payload["reference"] is None else np.asarray(payload["reference"])
        if reference is not None and len(reference) != len(self._runs):
            raise errors.InvalidArgumentError(
                f"this run's model selection evaluated {len(reference)} problems, not the {len(self._runs)} "
                "given now: resume it with the same selection problems (select_on, --select-members)")
        self.reference = reference
        self.score = np.inf if payload["score"] is None else payload["score"]
        self.episode = payload["episode"]


class _WeightAverage:
    """An exponential moving average of the network's weights, updated after every update
    (Polyak averaging; with `decay` 0, none: the weights as they are).

    Why: REINFORCE's greedy policy moves between placements from one update to the next, and on
    the held-out members the exported policy is as good as the update it was taken at (seeds of
    one command differ by up to 2x on their worst row, docs/RESULTS.md). The average over the
    last ~1 / (1 - decay) updates is a policy training passed near rather than one point of its
    path; `swapped_in` puts it in the network while selection evaluates and exports it, and
    training goes on from the weights as they were.
    """

    def __init__(self, network: PlacetoNetwork, decay: float):
        if not 0.0 <= decay < 1.0:
            raise errors.InvalidArgumentError(f"average_weights must be in [0, 1), got {decay!r}")
        self._network, self._decay = network, decay
        self.variables: list[tf.Variable] = []
        if decay:
            network.warm_up()
            self.variables = [tf.Variable(v, trainable=False) for v in network.variables]

    def update(self) -> None:
        for average, variable in zip(self.variables, self._network.variables):
            average.assign(self._decay * average + (1.0 - self._decay) * variable)

    @contextlib.contextmanager
    def swapped_in(self):
        """The network holds the average inside the block, its own weights again after it."""
        if not self.variables:
            yield
            return
        own = [v.numpy() for v in self._network.variables]
        for variable, average in zip(self._network.variables, self.variables):
            variable.assign(average)
        try:
            yield
        finally:
            for variable, value in zip(self._network.variables, own):
                variable.assign(value)


# -- where batches come from ------------------------------------------------------------------------
Batch = collections.namedtuple("Batch", ("experience", "weights", "summaries", "best"))
Batch.__doc__ = """One batch for an update: Trajectory [B, T] (numpy), weights [B, T], the summaries of
its episodes (PlacementEnvironment.pop_summaries), and (problem index, Best) candidates."""


class Embedded:
    """The embedded engine: lockstep batches collected in this process (the default collector)."""

    def __init__(self, env: PlacementEnvironment, policy, agent=None, settings: dict | None = None):
        self._env, self._policy, self._episodes = env, policy, 0

    def batch(self) -> Batch:
        # Every batch starts from a reset: a resumed run then draws the same starts as one that
        # was not interrupted (the reset at the last boundary is already in the saved state).
        experience, weights, _ = collect(self._env, self._policy, self._env.reset())
        summaries = self._env.pop_summaries()
        self._episodes += len(summaries)
        return Batch(experience, weights, summaries,
                     [(i, self._env.best_for(i)) for i in range(len(self._env.problems))])

    def after_update(self, agent, writer, episodes: int) -> None:
        pass

    def episodes_per_actor(self) -> dict[str, int] | None:
        return None  # the loop's own count: everything was collected here


class _SelfImitation:
    """Self-imitation (after Oh et al., 2018) of the best placement found so far: after every batch,
    that placement of the batch's problem is replayed as one more episode from the batch's own
    start (`acting.replay_placement`) and cloned with advantage `weight` (`PlacetoAgent`'s imitation lanes;
    always, not only while the batch is worse: cloned only then, the finds were not kept). Meant for a split found once by sampling (a branch on
    an idle device: several coordinated choices), which the next batches otherwise average
    away. The replay costs one episode's simulations and is not counted as an episode."""

    def __init__(self, env: PlacementEnvironment, weight: float, targets: dict[int, Best] | None = None):
        self.weight, self._env = weight, env
        self._targets = targets or {}  # problem -> a fixed placement to clone instead of the best found
        self._start: np.ndarray | None = None  # the start of the batch being replayed
        self._replays: dict[int, PlacementEnvironment] = {}  # problem -> its one-lane environment

    def batch(self, experience, weights: np.ndarray, summaries: list[dict]):
        """(experience, weights, imitation [B + 1] or None) for the update after this batch."""
        problems = {s["problem"] for s in summaries}
        if self.weight <= 0 or len(problems) != 1:
            return experience, weights, None
        index = problems.pop()
        best, statics = self._targets.get(index, self._env.best_for(index)), self._env.statics[index]
        if best.placement is None:
            return experience, weights, None
        self._start = experience.observation[observation.PLACEMENT][0, 0, :statics.num_nodes]
        replay = self._replays.get(index)
        if replay is None:  # built once per problem: an environment computes the graph's statics
            replay = self._replays[index] = PlacementEnvironment(
                self._env.problems[index], batch_size=1, initial=lambda problem, rng: self._start,
                dims=self._env.dims, passes=self._env.passes, schedule=self._env.schedule)
        extra, extra_weights = replay_placement(replay, best.placement)
        extra.observation[observation.PROBLEM][:] = index
        if extra_weights.shape != (1, weights.shape[1]):
            return experience, weights, None
        merged = tf.nest.map_structure(lambda x, y: np.concatenate([x, y]), experience, extra)
        imitation = np.zeros(len(weights) + 1, np.float32)
        imitation[-1] = self.weight
        return merged, np.concatenate([weights, extra_weights]), imitation


# -- the loop -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class TrainResult:
    """What a training run leaves.

    history: one dict per episode: episode, update, wall_s (training wall time so far), problem,
      step_time_s (end of the episode), improvement (over its initial placement),
      best_step_time_s (of that problem so far).
    """

    network: PlacetoNetwork
    best: list[Best]
    history: list[dict]
    episodes: int
    decisions: int
    wall_s: float
    policy_dir: str | None = None
    labels: list[str] | None = None  # one per problem ("source@cluster"), when known
    selected_episode: int | None = None  # the exported policy's episode (with `select_every`)
    selected_weights: list[np.ndarray] | None = None  # its weights (network.variables order)

    def exported_network(self) -> PlacetoNetwork:
        """The policy the run exports: the selected weights (with `select_every`), else the
        average (with `average_weights`), else the last."""
        if self.selected_weights is None:
            return self.network
        network = PlacetoNetwork(**self.network.config)
        network.warm_up()
        for variable, value in zip(network.variables, self.selected_weights):
            variable.assign(value)
        return network

    @property
    def best_step_time_s(self) -> dict[str, float]:
        """The best step time simulated during training, per problem (label -> seconds)."""
        labels = self.labels or [str(i) for i in range(len(self.best))]
        return {label: b.step_time_s for label, b in zip(labels, self.best)}



def _fixed_op_order(on: bool = True):
    """A context in which every TensorFlow function runs with the single-threaded executor.

    Why: the same update, on the same batch from the same weights, gave different weights now and
    then under TensorFlow's default executor (27 of 160 updates replayed; docs/RESULTS.md), and
    REINFORCE carried the difference on: runs of the shipped command parted after ~1200 episodes,
    at an episode that changed with the load on the machine or the progress bar. A fresh function
    repeated every time; the training run's own, after hundreds of calls on batches of other
    shapes, did not. That executor decides from timings it measures whether to run an op at once
    or queue it, so the order ops run in can change between calls, and `AddN` (which sums the
    gradients of a tensor used in several places) begins its sum with whichever input buffer it
    can reuse at that moment: with three or more inputs, a different float sum. With the
    single-threaded executor, which runs the ops in one fixed order, two runs of the shipped
    configuration repeat bit for bit. Each op still uses its own threads (TensorFlow's intra-op
    parallelism and oneDNN stay as they are).
    """
    if not on:
        return contextlib.nullcontext()
    return tf.experimental.function_executor_type("SINGLE_THREADED_EXECUTOR")


def _callers_executor():
    """A context in which TensorFlow's functions run with its default executor again: where
    `train` runs the caller's code (`callback`). A function first run with the default executor
    has its conditionals lowered to Switch ops, which the single-threaded executor of
    `_fixed_op_order` refuses ("does not support switch op"): a policy evaluated before training
    and again in the callback (benchmarks/learning.py) failed at its first evaluation. A function
    first run inside `train` runs with either executor."""
    return tf.experimental.function_executor_type("")


IMITATE_BASELINE = (False, True, "climbed", "fixed")  # `train`'s imitate_baseline


@gin.configurable(denylist=["problems", "logdir", "network", "callback", "collector", "pretrain"])
def train(problems: Problem | Sequence[Problem], episodes: int = 512, logdir: str | None = None,
          seed: int = 0, lanes: int = 16, initial: str | tuple = "random",
          order: str = "topological", hidden: int = 32, rounds: int = 8, refresh_every: int = 8,
          view: str = "full", nodes_on_device: bool | None = None, passes: int = 1,
          learning_rate: float = 3e-3, entropy_coefficient: float = 0.005,
          final_entropy_coefficient: float = 0.0005, entropy_decay_episodes: int = 4096,
          gradient_clipping: float = 1.0, discount: float = 1.0, max_train_steps: int | None = 512,
          exploration: float = 0.0, oom_penalty: float = 1.0, memory_headroom: float | None = MEMORY_HEADROOM,
          checkpoint_every: int = 10,
          network: PlacetoNetwork | None = None, progress: bool = True,
          callback: Callable[[dict], None] | None = None,
          stop_after_s: float | None = None, shared_start: bool = True,
          updates_per_batch: int = 4, select_every: int | None = 8, select_starts: int = 4,
          select_problems: int = 6, self_imitation: float = 0.0, imitate_baseline: bool | str = False,
          prioritize: float = 0.0, select_on: Problem | Sequence[Problem] | None = None,
          average_weights: float = 0.0, problems_per_update: int = 1, weight_decay: float = 0.0,
          credit: str = "to_go", transfer_costs: bool = False, device_context: bool = False, unvisited_work: bool = False,
          ensemble: int = 1, greedy: str = "device",
          collector: Callable | None = None, reproducible: bool = True,
          pretrain: Callable[[PlacetoNetwork], dict | None] | None = None) -> TrainResult:
    """Trains a Placeto policy on `problems` (one graph, or a family); resumes from `logdir`.

    Args:
      problems: a Problem or several (each batch of `lanes` episodes samples one).
      episodes: total episodes (counting those of a resumed run); a multiple of `lanes` (times
        `problems_per_update`) is run.
      logdir: checkpoints, state and TensorBoard summaries (None: nothing written, no resume).
      seed: seeds the network (when not given), the environment and the actions.
      lanes: episodes per batch, run in lockstep; one REINFORCE update per batch.
      initial, order, oom_penalty, shared_start, prioritize, memory_headroom: see
        PlacementEnvironment (the paper's MDP: random starts; by default the lanes of a batch
        share theirs; problems drawn uniformly unless `prioritize`; Reverb actors each keep the
        gaps of their own episodes; no device filled past `memory_headroom` of its memory while
        another has room, in collection and model selection alike, as the policy alone acts;
        None: no such mask). Replayed placements (self-imitation, teachers) are never masked.
      hidden, rounds, refresh_every, view, nodes_on_device, passes, transfer_costs,
        device_context, unvisited_work, ensemble, greedy: the network (`PlacetoNetwork`; ignored
        when `network` is given);
        `passes`: the episodes place every class that many times (`PlacementEnvironment`), as
        the saved policy then acts. Not in train.gin: passes 2 validated no better than 1 over
        four seeds (docs/RESULTS.md, session 26), nor transfer_costs over three (better on
        cifar10-cells, worse on nmt-variants; session 31), nor device_context over three
        (session 32), nor unvisited_work over two (session 35; with a teacher phase, better over
        three, docs/RESULTS.md; 42 members' teachers, three more, session 36). `ensemble`: K
        networks, each cloned on its own by the teacher phase (`PlacetoNetwork`); clones placed
        validation members better together than alone on average, by 0.011-0.050 over four
        ensembles (session 37).
      learning_rate, gradient_clipping, discount, max_train_steps, exploration, weight_decay,
        credit: see PlacetoAgent. Not in train.gin: weight_decay 0.1 validated no better than 0
        over four seeds (docs/RESULTS.md, session 30), nor credit "episode" over three (session
        31).
      entropy_coefficient, final_entropy_coefficient, entropy_decay_episodes: the entropy bonus
        decays linearly from the first to the second over that many episodes (a number of its
        own, not `episodes`: a resumed run with a larger budget keeps the same schedule).
      checkpoint_every: updates between checkpoints (also one at the end).
      network: start from these weights (e.g. the shipped policy) instead of fresh ones.
      progress: show a tqdm bar.
      callback: called with each episode's history entry (with TensorFlow's default executor,
        whatever `reproducible` says: `_callers_executor`).
      updates_per_batch: REINFORCE updates on each batch, each on its own sample of
        `max_train_steps` steps (more updates per simulated episode; the later ones are slightly
        off-policy, fine for small steps).
      problems_per_update: batches (each of one problem, drawn as `prioritize` says) whose
        gradients are averaged in each update; `updates_per_batch` updates on every such group.
        With 1 (the default) every update is on one problem's batch, and the next batch, of
        another problem, pulls the weights its own way; the mean over several problems is a
        step for the family rather than for one of its members. Not in train.gin: 4 (with 32
        updates a group) validated worse than 1 with two seeds (docs/RESULTS.md, session 25).
      stop_after_s: also stop (between updates) after this many seconds of this call: for
        fine-tuning within a placement's time budget; training runs are budgeted in episodes.
      select_every: every this many batches (and at the start and the end), evaluate the policy
        alone on up to `select_problems` training problems from `select_starts` fixed random
        starts, and export the best evaluated (`_Selection`) instead of the last (None: the last).
      select_on: the problems model selection evaluates on instead of the training problems:
        validation members of the families, never trained on, so that the exported policy is the
        one that places unseen graphs best rather than the one that fits its training graphs.
      average_weights: the decay of an exponential moving average of the weights after every
        update (`_WeightAverage`; 0: off): selection evaluates, and the run exports, the
        average; training goes on from the weights themselves. Checkpointed with them.
      self_imitation: cloning weight of the best placement found so far, replayed from the start
        of each batch (`_SelfImitation`; 0: off; train.gin binds 20).
      imitate_baseline: with `self_imitation`, the best fast baseline's placement of each problem
        (`search.best_baseline`) is the best found until sampling finds a better one: a teacher.
        Sampling alone may never find a split to imitate (cifar10-cells/0 with
        `nodes_on_device`, whose policy piles everything on one device from the start), while a
        placed-view policy with `nodes_on_device` can clone m-SCT's split of it from every start.
        On in train.gin (the shipped policy's training). "climbed": that placement hill-climbed
        first (`search.polish`, seeded), a stronger teacher (a local optimum of single-class and
        block moves). "fixed": the teacher is cloned for the whole run, never replaced by a
        placement sampling finds.
      collector: where batches come from (module docstring; default `Embedded`).
      pretrain: called with the network before the first batch of a run that is not resumed
        (the teacher phase, `tfplaceto.rl.cloning.clone_teachers`); what it returns is kept in
        the state and summary as "pretrain". Its wall time is the run's.
      reproducible: run TensorFlow's functions one op at a time in a fixed order
        (`_fixed_op_order`), so that a run repeats bit for bit on the same machine and build;
        False: TensorFlow's default executor, which may run independent ops at the same time.
    """
    if imitate_baseline not in IMITATE_BASELINE:
        raise errors.InvalidArgumentError(
            f"imitate_baseline must be one of {IMITATE_BASELINE}, got {imitate_baseline!r}")
    with _fixed_op_order(reproducible):
        start = time.perf_counter()
        problems = [problems] if isinstance(problems, Problem) else list(problems)
        network = network or PlacetoNetwork(hidden=hidden, rounds=rounds, seed=seed, refresh_every=refresh_every,
                                            view=view, nodes_on_device=nodes_on_device, passes=passes,
                                            transfer_costs=transfer_costs, device_context=device_context,
                                            unvisited_work=unvisited_work, ensemble=ensemble, greedy=greedy)
        env = PlacementEnvironment(problems, batch_size=lanes, initial=initial, order=order, seed=seed,
                                   oom_penalty=oom_penalty, shared_start=shared_start, prioritize=prioritize,
                                   memory_headroom=memory_headroom,
                                   **network.acting)
        packed = as_tensors(observation.pack(env.statics, env.dims))
        time_step_spec, action_spec = specs(env)
        agent = PlacetoAgent(time_step_spec, action_spec, network, packed, learning_rate=learning_rate,
                             entropy_coefficient=entropy_coefficient, gradient_clipping=gradient_clipping,
                             discount=discount, max_train_steps=max_train_steps, seed=seed,
                             exploration=exploration, weight_decay=weight_decay, credit=credit)
        policy = CompiledPyPolicy(agent.collect_policy, lanes)
        decay = max(entropy_decay_episodes, 1)
        best = [Best() for _ in problems]
        history: list[dict] = []
        done, decisions, wall_before = 0, 0, 0.0

        manager = writer = state = saver = None
        averaged = _WeightAverage(network, average_weights)
        if logdir:
            checkpoint = tf.train.Checkpoint(**agent.variables_to_checkpoint(),
                                             **({"averaged": averaged.variables} if averaged.variables else {}))
            manager, state = open_logdir(logdir, checkpoint, problems, network)
            if state is not None:
                done, decisions, wall_before = state["episodes"], state["decisions"], state["wall_s"]
                env.set_state(state["env"])
                best = [best_from_json(b) for b in state["best"]]
                for index, found in enumerate(best):  # what self-imitation replays, as before the stop
                    if found.placement is not None:
                        env.best_for(index).offer(found.step_time_s, found.oom, found.placement)
                history = state.get("history", [])
            writer = tf.summary.create_file_writer(logdir)
            saver = policy_saver.PolicySaver(agent.policy, batch_size=None)
        pretrained = state.get("pretrain") if state else None
        if state is None and pretrain is not None:
            pretrained = pretrain(network)
        select_on = [select_on] if isinstance(select_on, Problem) else list(select_on or problems)
        selection = (_Selection(select_on, network, seed, select_starts, select_problems, oom_penalty,
                                memory_headroom) if select_every
                     else None)
        if selection is not None and state and state.get("selection"):
            selection.load(state["selection"])
        settings = {"lanes": lanes, "initial": initial, "order": order, "oom_penalty": oom_penalty,
                    "shared_start": shared_start, "seed": seed, "network": network.config,
                    "exploration": exploration, "prioritize": prioritize, "memory_headroom": memory_headroom}
        source = (collector or Embedded)(env, policy, agent, settings)

        def save() -> None:
            nonlocal updates_since_save
            updates_since_save = 0  # batches since the last checkpoint, whoever wrote it
            if manager is None:
                return
            wall = wall_before + time.perf_counter() - start
            path = manager.save(checkpoint_number=agent.train_step_counter)
            if selection is None:  # else the policy is exported when selected
                with averaged.swapped_in():
                    save_policy(network, os.path.join(logdir, "policy"),
                                notes={"episodes": done, "decisions": decisions, "problems": len(problems)},
                                saver=saver)
            write_json(os.path.join(logdir, "state.json"), {
                "checkpoint": os.path.basename(path), "episodes": done, "decisions": decisions,
                "wall_s": wall, "fingerprints": problem_fingerprints(problems), "network": network.config,
                "env": env.get_state(), "best": [best_to_json(b) for b in best], "history": history,
                "selection": None if selection is None else selection.to_json(), "pretrain": pretrained})
            write_json(os.path.join(logdir, "summary.json"), {
                "episodes": done, "decisions": decisions, "wall_s": wall,
                "learner_steps": int(agent.train_step_counter.numpy()),
                "episodes_per_actor": source.episodes_per_actor() or {"0": done},
                "policy_dir": os.path.abspath(os.path.join(logdir, "policy")),
                "selected_episode": None if selection is None else selection.episode,
                "best_step_time_s": [b.step_time_s for b in best], "pretrain": pretrained})

        def select() -> None:
            """Evaluates the policy alone (the average, with `average_weights`); exports it (and
            checkpoints) when it is the best so far."""
            with averaged.swapped_in():
                if not selection.offer(done):
                    return
                if manager is not None:
                    save_policy(network, os.path.join(logdir, "policy"), notes={
                        "episodes": done, "decisions": decisions, "problems": len(problems),
                        "selected_episode": done, "selection_score": selection.score}, saver=saver)
            if manager is not None:
                save()
            if writer is not None:
                with writer.as_default(step=done):
                    tf.summary.scalar("select/score", selection.score)

        if selection is not None and selection.reference is None:
            select()  # the reference: the weights training begins from

        teachers: dict[int, Best] = {}
        if imitate_baseline:
            for index, problem in enumerate(problems):
                teacher = teachers[index] = (climbed_baseline if imitate_baseline == "climbed" else best_baseline)(
                    problem, seed)
                env.best_for(index).offer(teacher.step_time_s, teacher.oom, teacher.placement)
        imitator = _SelfImitation(env, self_imitation, teachers if imitate_baseline == "fixed" else None)
        bar = None
        if progress:
            bar = tqdm(total=episodes, initial=done, unit="episode", dynamic_ncols=True)
        updates_since_save = batches_since_select = 0
        while done < episodes:
            if stop_after_s is not None and time.perf_counter() - start >= stop_after_s:
                break
            agent.entropy_coefficient.assign(entropy_coefficient + (final_entropy_coefficient - entropy_coefficient)
                                             * min(done / decay, 1.0))
            group, summaries, candidates = [], [], []
            for _ in range(problems_per_update):
                experience, weights, batch_summaries, batch_candidates = source.batch()
                decisions += int(weights.sum())
                experience, weights, imitation = imitator.batch(experience, weights, batch_summaries)
                group.append((tf.nest.map_structure(tf.constant, experience), tf.constant(weights),
                              None if imitation is None else tf.constant(imitation)))
                summaries += batch_summaries
                candidates += batch_candidates
            for _ in range(updates_per_batch):
                if len(group) == 1:
                    batch, weights, imitation = group[0]
                    loss_info = agent.train(batch, weights, **({} if imitation is None else {"imitation": imitation}))
                else:
                    loss_info = agent.train_averaged(group)
                averaged.update()
            update = int(agent.train_step_counter.numpy())
            wall = wall_before + time.perf_counter() - start
            source.after_update(agent, writer, done + len(summaries))
            for index, candidate in candidates:
                if candidate.placement is not None:
                    best[index].offer(candidate.step_time_s, candidate.oom, candidate.placement)
            for summary in summaries:
                done += 1
                entry = {"episode": done, "update": update, "wall_s": wall, "problem": summary["problem"],
                         "step_time_s": summary["step_time_s"], "improvement": summary["improvement"],
                         "best_step_time_s": best[summary["problem"]].step_time_s}
                history.append(entry)
                if callback is not None:
                    with _callers_executor():
                        callback(entry)
            if writer is not None:
                with writer.as_default(step=done):
                    tf.summary.scalar("episode/step_time_s", np.mean([s["step_time_s"] for s in summaries]))
                    tf.summary.scalar("episode/improvement", np.mean([s["improvement"] for s in summaries]))
                    tf.summary.scalar("train/loss", loss_info.loss)
                    tf.summary.scalar("train/policy_loss", loss_info.extra.policy_loss)
                    tf.summary.scalar("train/entropy", loss_info.extra.entropy)
                    tf.summary.scalar("train/decisions_per_s", decisions / max(wall, 1e-9))
            if bar is not None:
                bar.update(len(summaries))
                bar.set_postfix(end_ms=f"{np.mean([s['step_time_s'] for s in summaries]) * 1e3:.4g}",
                                entropy=f"{float(loss_info.extra.entropy):.2f}")
            batches_since_select += len(group)
            if selection is not None and batches_since_select >= select_every:
                select()
                batches_since_select = 0
            updates_since_save += 1
            if updates_since_save >= checkpoint_every:
                save()
        if bar is not None:
            bar.close()
        if selection is not None and batches_since_select:
            select()
        if updates_since_save or (manager is not None and manager.latest_checkpoint is None):
            save()
        if writer is not None:
            writer.flush()
        return TrainResult(network, best, history, done, decisions, wall_before + time.perf_counter() - start,
                           os.path.join(logdir, "policy") if logdir else None,
                           selected_episode=None if selection is None else selection.episode,
                           selected_weights=(selection.weights if selection is not None
                                             else [a.numpy() for a in averaged.variables] or None))


# -- sources ------------------------------------------------------------------------------------------
def problems_for(sources: Sequence, clusters: Sequence) -> tuple[list[Problem], list[str]]:
    """(Problems, labels "source@cluster") of every source on every cluster: sources are anything
    `import_graph` takes, or OpGraphs; clusters are presets or Clusters. A source is imported once
    per device type its calls would run on (a Keras LSTM is cuDNN's on GPUs, a loop on CPUs)."""
    problems, labels = [], []
    for source in sources:
        imported: dict[str, OpGraph] = {}
        for cluster in map(as_cluster, clusters):
            kind = target_device_type(cluster)
            if kind not in imported:
                imported[kind] = source if isinstance(source, OpGraph) else import_graph(source, cluster=cluster)
            op_graph = imported[kind]
            problems.append(make_problem(op_graph, cluster, profile(op_graph, cluster)))
            labels.append(problem_label(source if isinstance(source, str) else op_graph, cluster))
    return problems, labels


def problem_label(source, cluster: Cluster) -> str:
    """"source@cluster": how `problems_for` names a problem (a source that is not a string by the
    repr of its OpGraph)."""
    return f"{source if isinstance(source, str) else repr(source)}@{cluster.name}"
