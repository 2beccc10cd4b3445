"""Training the Placeto policy: rollouts, REINFORCE updates, summaries, checkpoints that resume.

  rollout(envs, logits_fn, rng, greedy)  one episode in each environment, in lockstep (one batched
                       network call per step); returns the padded Trajectory, its weights and the
                       episodes' summaries. Actions are drawn with a numpy Generator (Gumbel-max
                       over the masked logits), so a seed fixes them.
  train(problems, episodes, logdir, seed, ...)   the loop (gin-configurable): several rollouts per
                       update, TensorBoard summaries, a tqdm bar showing the best step time, and a
                       checkpoint every few updates in `logdir`; run it again with the same
                       arguments and it resumes from the last checkpoint.
  family_problems(family, clusters, num_graphs)  Problems of built-in family members.
  train_family(family, clusters, ...)            train on a family.
  train_command(family, clusters, logdir, episodes, seed, num_graphs)  the `tfplaceto train` verb.

What a logdir holds: `ckpt/` (tf.train.CheckpointManager: network, optimizer, baseline buffer,
step counter), `state.json` (episodes done, wall time, the generators' states, the best placement
of every problem, the problems' fingerprints; written atomically after each checkpoint),
`policy/` (the exported network, loadable by `tfplaceto.policy.checkpoint.load_policy`), and
TensorBoard event files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from collections.abc import Callable, Sequence

import gin
import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from tfplaceto.baselines import starting_placements
from tfplaceto.policy import features as F
from tfplaceto.policy.checkpoint import save_policy
from tfplaceto.policy.network import PlacetoNetwork
from tfplaceto.problem import Problem
from tfplaceto.rl.agent import PlacetoAgent
from tfplaceto.rl.environment import Best, PlacementEnvironment


# -- collection ---------------------------------------------------------------------------------------
def _stack(observations: Sequence[dict]) -> dict:
    return {key: np.stack([o[key] for o in observations]) for key in observations[0]}


def make_logits_fn(network: PlacetoNetwork, observation_spec: dict) -> Callable[[dict], np.ndarray]:
    """A tf.function (batch dimension left open) from stacked observations to logits."""
    signature = {k: tf.TensorSpec((None,) + tuple(s.shape), s.dtype, k) for k, s in observation_spec.items()}

    @tf.function(input_signature=[signature], autograph=False)
    def logits(observation):
        return network(observation)

    return lambda observation: logits({k: tf.constant(v) for k, v in observation.items()}).numpy()


def choose(logits: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """Greedy (rng None) or sampled (Gumbel-max) device per row of masked logits."""
    logits = np.asarray(logits, np.float64)
    if rng is not None:
        logits = logits + rng.gumbel(size=logits.shape)
    return logits.argmax(axis=1).astype(np.int32)


def rollout(envs: Sequence[PlacementEnvironment], logits_fn, rng: np.random.Generator | None,
            num_steps: int | None = None):
    """One episode in each env, stepped together; (Trajectory [B, T], weights [B, T], summaries).

    T is `num_steps` (default: the longest episode); steps past an episode's end are padding
    (weight 0, copies of its last observation). rng None acts greedily.
    """
    steps = [envs[i].reset() for i in range(len(envs))]
    records: list[list[tuple]] = [[] for _ in envs]
    summaries: list[dict | None] = [None] * len(envs)
    running = list(range(len(envs)))
    while running:
        observations = _stack([steps[i].observation for i in running])
        actions = choose(logits_fn(observations), rng)
        still = []
        for i, action in zip(running, actions):
            following = envs[i].step(action)
            records[i].append((steps[i].observation, action, float(following.reward)))
            steps[i] = following
            if following.is_last():
                summaries[i] = envs[i].episode_summary()
            else:
                still.append(i)
        running = still
    length = num_steps or max(len(r) for r in records)
    if max(len(r) for r in records) > length:
        raise ValueError(f"an episode has more than num_steps={length} steps")
    batch = len(envs)
    weights = np.zeros((batch, length), np.float32)
    rewards = np.zeros((batch, length), np.float32)
    actions = np.zeros((batch, length), np.int32)
    observations = []
    for b, record in enumerate(records):
        count = len(record)
        weights[b, :count] = 1.0
        rewards[b, :count] = [r for _, _, r in record]
        actions[b, :count] = [a for _, a, _ in record]
        padded = [o for o, _, _ in record] + [record[-1][0]] * (length - count)
        observations.append(_stack(padded))
    step_type = np.where(np.arange(length) == 0, ts.StepType.FIRST, ts.StepType.MID)
    step_type = np.broadcast_to(step_type, (batch, length)).astype(np.int32)
    experience = trajectory.Trajectory(
        step_type=step_type, observation=_stack(observations), action=actions, policy_info=(),
        next_step_type=np.where(weights > 0, ts.StepType.MID, ts.StepType.LAST).astype(np.int32),
        reward=rewards, discount=np.ones((batch, length), np.float32))
    return experience, weights, summaries


# -- the loop -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class TrainResult:
    """What a training run leaves: the network, the best placement of every problem, the history.

    history: one dict per episode: episode, update, wall_s (training wall time so far), problem,
      step_time_s, improvement (over the episode's initial placement), best_step_time_s (of that
      problem so far).
    """

    network: PlacetoNetwork
    best: list[Best]
    history: list[dict]
    episodes: int
    wall_s: float


def _fingerprints(problems: Sequence[Problem]) -> list[str]:
    return [f"{p.graph.fingerprint()}@{p.cluster.fingerprint()}" for p in problems]


def _write_json(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def _best_to_json(best: Best) -> dict:
    return {"step_time_s": best.step_time_s if np.isfinite(best.step_time_s) else None,
            "oom": best.oom, "placement": None if best.placement is None else best.placement.tolist()}


def _best_from_json(payload: dict) -> Best:
    if payload["placement"] is None:
        return Best()
    return Best(payload["step_time_s"], payload["oom"], np.asarray(payload["placement"], np.int32))


@gin.configurable(denylist=["problems", "logdir", "network", "callback"])
def train(problems: Problem | Sequence[Problem], episodes: int = 200, logdir: str | None = None,
          seed: int = 0, rollouts_per_update: int = 4, initial: str | tuple = ("best", "single"),
          order: str = "topological", lookahead: bool = True, window: int | None = None,
          polish: Callable | None = None, gains_only: bool = False, hidden: int = 32, rounds: int = 2,
          lookahead_prior: float = 50.0,
          learning_rate: float = 3e-3, entropy_coefficient: float = 0.01,
          gradient_clipping: float = 1.0, baseline_window: int = 16,
          max_train_steps: int | None = 512, oom_penalty: float = 1.0,
          checkpoint_every: int = 5, budget_s: float | None = None,
          network: PlacetoNetwork | None = None, progress: bool = True,
          callback: Callable[[dict], None] | None = None) -> TrainResult:
    """Trains a Placeto policy on `problems` (one graph, or a family); resumes from `logdir`.

    Args:
      problems: a Problem or several (each episode samples one, per environment).
      episodes: total episodes (counting those of a resumed run).
      logdir: checkpoints, state and TensorBoard summaries (None: nothing written, no resume).
      seed: seeds the network (when not given), the environments and the actions.
      rollouts_per_update: episodes per REINFORCE update (collected in lockstep).
      initial, order, lookahead, window, polish, gains_only, oom_penalty: see PlacementEnvironment.
      hidden, rounds, lookahead_prior: the network (ignored when `network` is given).
      learning_rate, entropy_coefficient, gradient_clipping, baseline_window, max_train_steps:
        see PlacetoAgent.
      checkpoint_every: updates between checkpoints (also one at the end).
      budget_s: stop after this many wall seconds of this call (between updates).
      network: start from these weights (e.g. the shipped policy) instead of fresh ones.
      progress: show a tqdm bar (postfix: the best step time found).
      callback: called with each episode's history entry.
    """
    start = time.perf_counter()
    problems = [problems] if isinstance(problems, Problem) else list(problems)
    statics = [F.graph_statics(p) for p in problems]
    dims = F.dims_for(statics, [p.num_devices for p in problems])
    num_steps = max(s.num_steps for s in statics)
    num_steps = min(num_steps, window) if window else num_steps
    seeds = np.random.SeedSequence(seed).spawn(rollouts_per_update + 1)
    initial = _shared(initial)
    envs = [PlacementEnvironment(problems, initial=initial, order=order, seed=int(s.generate_state(1)[0]),
                                 oom_penalty=oom_penalty, lookahead=lookahead, dims=dims, window=window,
                                 polish=polish, gains_only=gains_only)
            for s in seeds[:-1]]
    action_rng = np.random.default_rng(seeds[-1])
    network = network or PlacetoNetwork(hidden=hidden, rounds=rounds, lookahead_prior=lookahead_prior,
                                        seed=seed)
    observation_spec = envs[0].observation_spec()
    network.warm_up(observation_spec)
    time_step_spec = tensor_spec.from_spec(ts.time_step_spec(observation_spec))
    action_spec = tensor_spec.from_spec(envs[0].action_spec())
    agent = PlacetoAgent(time_step_spec, action_spec, network, learning_rate=learning_rate,
                         entropy_coefficient=entropy_coefficient, gradient_clipping=gradient_clipping,
                         baseline_window=baseline_window, max_train_steps=max_train_steps, seed=seed)
    logits_fn = make_logits_fn(network, observation_spec)
    reference = _reference_times(problems)
    best = [Best() for _ in problems]
    history: list[dict] = []
    done, wall_before = 0, 0.0

    manager = writer = None
    if logdir:
        os.makedirs(logdir, exist_ok=True)
        checkpoint = tf.train.Checkpoint(**agent.variables_to_checkpoint())
        manager = tf.train.CheckpointManager(checkpoint, os.path.join(logdir, "ckpt"), max_to_keep=2)
        state_path = os.path.join(logdir, "state.json")
        if manager.latest_checkpoint and os.path.exists(state_path):
            with open(state_path) as f:
                state = json.load(f)
            if state["fingerprints"] != _fingerprints(problems) or state["network"] != network.config:
                raise ValueError(f"{logdir} holds a run on other problems or another network; use a "
                                 "new logdir (or the same problems and network to resume)")
            checkpoint.restore(os.path.join(logdir, "ckpt", state["checkpoint"])).assert_consumed()
            done, wall_before = state["episodes"], state["wall_s"]
            for env, env_state in zip(envs, state["envs"]):
                env.set_state(env_state)
            action_rng.bit_generator.state = state["action_rng"]
            best = [_best_from_json(b) for b in state["best"]]
            history = state.get("history", [])
        writer = tf.summary.create_file_writer(logdir)

    def save() -> None:
        if manager is None:
            return
        path = manager.save(checkpoint_number=agent.train_step_counter)
        _write_json(os.path.join(logdir, "state.json"), {
            "checkpoint": os.path.basename(path), "episodes": done,
            "wall_s": wall_before + time.perf_counter() - start, "fingerprints": _fingerprints(problems),
            "network": network.config, "envs": [env.get_state() for env in envs],
            "action_rng": action_rng.bit_generator.state, "best": [_best_to_json(b) for b in best],
            "history": history})
        save_policy(network, os.path.join(logdir, "policy"),
                           notes={"episodes": done, "problems": len(problems)})

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=episodes, initial=done, unit="episode", dynamic_ncols=True)
    updates_since_save = 0
    while done < episodes:
        if budget_s is not None and time.perf_counter() - start >= budget_s:
            break
        batch = envs[:min(rollouts_per_update, episodes - done)]
        experience, weights, summaries = rollout(batch, logits_fn, action_rng, num_steps)
        loss_info = agent.train(tf.nest.map_structure(tf.constant, experience), tf.constant(weights))
        update = int(agent.train_step_counter.numpy())
        wall = wall_before + time.perf_counter() - start
        for env in batch:
            for index in range(len(problems)):
                candidate = env.best_for(index)
                if candidate.placement is not None:
                    best[index].offer(candidate.step_time_s, candidate.oom, candidate.placement)
        for summary in summaries:
            done += 1
            entry = {"episode": done, "update": update, "wall_s": wall, "problem": summary["problem"],
                     "step_time_s": summary["step_time_s"], "improvement": summary["improvement"],
                     "best_step_time_s": best[summary["problem"]].step_time_s}
            history.append(entry)
            if callback is not None:
                callback(entry)
        if writer is not None:
            with writer.as_default(step=done):
                tf.summary.scalar("episode/step_time_s", np.mean([s["step_time_s"] for s in summaries]))
                tf.summary.scalar("episode/improvement", np.mean([s["improvement"] for s in summaries]))
                tf.summary.scalar("episode/best_over_single", _mean_ratio(best, reference))
                tf.summary.scalar("train/loss", loss_info.loss)
                tf.summary.scalar("train/policy_loss", loss_info.extra.policy_loss)
                tf.summary.scalar("train/entropy", loss_info.extra.entropy)
        if bar is not None:
            bar.update(len(summaries))
            if len(problems) == 1:
                bar.set_postfix(best_ms=f"{best[0].step_time_s * 1e3:.3f}",
                                entropy=f"{float(loss_info.extra.entropy):.2f}")
            else:
                bar.set_postfix(best_over_single=f"{_mean_ratio(best, reference):.3f}",
                                entropy=f"{float(loss_info.extra.entropy):.2f}")
        updates_since_save += 1
        if updates_since_save >= checkpoint_every:
            save()
            updates_since_save = 0
    if bar is not None:
        bar.close()
    if updates_since_save or (manager is not None and manager.latest_checkpoint is None):
        save()
    if writer is not None:
        writer.flush()
    return TrainResult(network, best, history, done, wall_before + time.perf_counter() - start)


def _shared(initial):
    """`initial` with baseline names ("best", "m_etf", ...) computed once for all environments."""
    choices = initial if isinstance(initial, tuple) else (initial,)
    cache: dict[tuple[int, str], np.ndarray] = {}

    def memoized(name: str):
        def placement(problem: Problem, rng: np.random.Generator) -> np.ndarray:
            key = (id(problem), name)
            if key not in cache:
                if name == "best":
                    cache[key] = next(iter(starting_placements(problem).values()))
                else:
                    from tfplaceto import baselines

                    cache[key] = baselines.run(name, problem)
            return cache[key]

        return placement

    shared = tuple(memoized(c) if isinstance(c, str) and c != "random" else c for c in choices)
    return shared if isinstance(initial, tuple) else shared[0]


def _reference_times(problems: Sequence[Problem]) -> list[float]:
    """The single-device step time of every problem: the scale of the progress figures."""
    from tfplaceto import baselines

    return [float(p.simulator().run(baselines.run("single", p))[0]) for p in problems]


def _mean_ratio(best: Sequence[Best], reference: Sequence[float]) -> float:
    """Mean over problems of best step time / reference step time (problems without a best skipped)."""
    ratios = [b.step_time_s / r for b, r in zip(best, reference) if np.isfinite(b.step_time_s) and r > 0]
    return float(np.mean(ratios)) if ratios else float("nan")


# -- families -----------------------------------------------------------------------------------------
def family_problems(family: str, clusters: Sequence[str], num_graphs: int, first: int = 0) -> list[Problem]:
    """Problems of members first .. first + num_graphs - 1 of built-in `family` on each cluster."""
    from tfplaceto.cluster import as_cluster
    from tfplaceto.costs import profile
    from tfplaceto.graph import import_graph
    from tfplaceto.problem import make_problem

    problems = []
    for member in range(first, first + num_graphs):
        op_graph = import_graph(f"builtin:{family}/{member}")
        for name in clusters:
            cluster = as_cluster(name)
            problems.append(make_problem(op_graph, cluster, profile(op_graph, cluster)))
    return problems


@gin.configurable(denylist=["logdir"])
def train_family(family: str | Sequence[str], clusters: Sequence[str], logdir: str | None,
                 num_graphs: int = 4, episodes: int = 400, seed: int = 0, **kwargs) -> TrainResult:
    """Trains on members 0 .. num_graphs - 1 of one or several built-in families on each cluster."""
    families = [family] if isinstance(family, str) else list(family)
    problems = [p for name in families for p in family_problems(name, clusters, num_graphs)]
    return train(problems, episodes=episodes, logdir=logdir, seed=seed, **kwargs)


def train_command(family: str, clusters: list[str], logdir: str, episodes: int, seed: int,
                  num_graphs: int) -> None:
    """`tfplaceto train --family F --cluster C ... --logdir D`: trains, resumes, exports the policy.

    `family` may list several families separated by commas ("cifar10-cells,ptb-cells"). The trained
    policy is exported to D/policy (copy it into tfplaceto/policy/pretrained/ to ship it).
    """
    families = [f.strip() for f in family.split(",") if f.strip()]
    result = train_family(families, clusters, logdir, num_graphs=num_graphs, episodes=episodes, seed=seed)
    if result.history:
        recent = result.history[-min(len(result.history), 20):]
        print(f"{result.episodes} episodes in {result.wall_s:.0f} s; mean improvement of the last "
              f"{len(recent)} episodes {np.mean([h['improvement'] for h in recent]):+.3f}; policy: "
              f"{os.path.join(logdir, 'policy')}")
    else:
        warnings.warn("no episode was run (already done?)", stacklevel=2)
