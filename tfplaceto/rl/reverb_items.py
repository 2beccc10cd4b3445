"""What a learner and its actors exchange through Reverb: the tables, the items, the job.

The embedded engine (`tfplaceto.rl.train.Embedded`) collects and learns in one process. With
`actors > 0`, or a Reverb address, collection moves to actor processes, as TF-Agents' distributed
on-policy examples do (`tf_agents/examples/ppo/schulman17/train_eval_lib.py`,
`tf_agents/experimental/distributed/reverb_variable_container.py`): the learner side is
`tfplaceto.rl.learner`, the actor side `tfplaceto.rl.actor_process`, and this module the format
both speak:

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

  TRAJECTORIES, VARIABLES, JOB   the table names; POLICY_KEY, TRAIN_STEP_KEY the variables' keys.
  parse_address        "HOST:PORT" -> (host, port), checked.
  item_spec, pack_item, unpack_item   the TensorSpec nest of an item, a collected batch as an
                       item, an item back as the loop's `Batch` (and its actor's figures).
  make_job             the JSON-able job actors build their environment from.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory as trajectory_lib

from tfplaceto import errors
from tfplaceto.problem import Best, Problem
from tfplaceto.rl.logdir import problem_fingerprints
from tfplaceto.rl.train import Batch

TRAJECTORIES = "trajectories"
VARIABLES = "variables"  # tf_agents' reverb_variable_container.DEFAULT_TABLE
JOB = "job"
POLICY_KEY = "policy_variables"  # the keys TF-Agents' distributed examples push
TRAIN_STEP_KEY = "train_step"
_TRAJECTORY_FIELDS = ("step_type", "observation", "action", "next_step_type", "reward", "discount")


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of "HOST:PORT" (InvalidArgumentError otherwise)."""
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise errors.InvalidArgumentError(f"a Reverb address is HOST:PORT (port 1-65535), got {address!r}")
    return host, int(port)


# -- items ----------------------------------------------------------------------------------------
def item_spec(env, lanes: int) -> dict:
    """The TensorSpec nest of one item (a batch of `env`'s problems, padded: module docstring)."""
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
            "network": settings["network"], "exploration": settings.get("exploration", 0.0),
            "prioritize": settings.get("prioritize", 0.0), "memory_headroom": settings.get("memory_headroom"),
            "dims": [dims.nodes, dims.edges, dims.devices, dims.steps]}
