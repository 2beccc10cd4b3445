"""A training run's logdir: what it holds, restoring it, and its JSON files.

What a logdir holds: `ckpt/` (network, optimizer, entropy coefficient, sampling generator, step
counter), `state.json` (episodes, decisions, wall time, the environment's generator state, the
best placement of every problem, the problems' fingerprints, the history; written atomically
after each checkpoint), `policy/` (the exported network, `tfplaceto.policy.checkpoint`),
`summary.json` and TensorBoard event files. `policy/` holds the Sonnet checkpoint and, beside
it, `saved_policy/`: the greedy policy as a TF-Agents `PolicySaver` SavedModel (acts on the
training problems' observations). The loop that writes them is `tfplaceto.rl.train.train`.

  open_logdir(logdir, checkpoint, problems, network)   (CheckpointManager, saved state or None):
                       restores the last checkpoint; CheckpointError for a logdir that cannot be
                       used (unwritable, another run's, corrupted).
  problem_fingerprints(problems)   "graph@cluster" fingerprints: which problems a run (or a
                       Reverb actor's job) is about.
  write_json, best_to_json, best_from_json   state.json and summary.json, written atomically.
  read_episodes_per_actor(logdir)   the episodes per actor that a resumed run's summary.json holds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tfplaceto import errors
from tfplaceto.outputs import atomic_write
from tfplaceto.policy.network import PlacetoNetwork
from tfplaceto.problem import Best, Problem


def problem_fingerprints(problems: Sequence[Problem]) -> list[str]:
    """The "graph fingerprint@cluster fingerprint" of every problem."""
    return [f"{p.graph.fingerprint()}@{p.cluster.fingerprint()}" for p in problems]


def write_json(path: str, payload: dict) -> None:
    """Writes `payload` as JSON at `path`, atomically."""
    atomic_write(path, json.dumps(payload).encode())


def best_to_json(best: Best) -> dict:
    return {"step_time_s": best.step_time_s if np.isfinite(best.step_time_s) else None,
            "oom": best.oom, "placement": None if best.placement is None else best.placement.tolist()}


def best_from_json(payload: dict) -> Best:
    if payload["placement"] is None:
        return Best()
    return Best(payload["step_time_s"], payload["oom"], np.asarray(payload["placement"], np.int32))


def open_logdir(logdir: str, checkpoint, problems: Sequence[Problem], network: PlacetoNetwork):
    """(CheckpointManager, the saved state or None): restores the last checkpoint of a run.

    CheckpointError for a logdir that cannot be written, a run on other problems or another
    network, or a corrupted checkpoint or state (a state.json without its checkpoint included).
    """
    try:
        os.makedirs(logdir, exist_ok=True)
        if not os.access(logdir, os.W_OK):
            raise PermissionError(f"{logdir} is not writable")
    except OSError as e:
        raise errors.CheckpointError(f"cannot use {logdir} as a training logdir: {errors.first_line(e)}") from None
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(logdir, "ckpt"), max_to_keep=2)
    state_path = os.path.join(logdir, "state.json")
    if not os.path.exists(state_path):
        return manager, None
    try:
        with open(state_path) as f:
            state = json.load(f)
        missing = [key for key in ("fingerprints", "network", "checkpoint", "episodes", "decisions", "wall_s",
                                   "env", "best") if key not in state]
        if missing:
            raise KeyError(f"no {missing[0]!r}")
        saved, config, name = state["fingerprints"], state["network"], state["checkpoint"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise errors.CheckpointError(f"{state_path} is corrupted ({errors.first_line(e)}); remove the logdir "
                                     "to start again") from None
    if saved != problem_fingerprints(problems) or PlacetoNetwork.completed_config(config) != network.config:
        raise errors.CheckpointError(f"{logdir} holds a run on other graphs, clusters or another network; "
                                     "use a new logdir (or the same ones to resume)")
    try:
        checkpoint.restore(os.path.join(logdir, "ckpt", name)).assert_consumed()
    except (tf.errors.OpError, ValueError, AssertionError) as e:
        raise errors.CheckpointError(f"the checkpoint in {logdir} cannot be restored ({errors.first_line(e)}); "
                                     "remove the logdir to start again") from None
    return manager, state


def read_episodes_per_actor(logdir: str | None) -> dict[str, int]:
    """Episodes per actor of the run in `logdir` (its summary.json), for a run that resumes it;
    {} when there is no run to resume or its summary cannot be read."""
    if not logdir or not os.path.exists(os.path.join(logdir, "state.json")):
        return {}
    try:
        with open(os.path.join(logdir, "summary.json")) as f:
            return {str(k): int(v) for k, v in json.load(f)["episodes_per_actor"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
