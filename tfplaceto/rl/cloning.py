"""The teacher phase of training: behaviour cloning of climbed baselines before any episode.

Reinforcement learning from random weights finds the splits of a family's graphs slowly and
unevenly (seeds of one command differ by 0.02 in mean step time on unseen members); cloning good
placements of many members first gives the policy what a split looks like on each kind of member.
A teacher is the best fast baseline of a problem hill-climbed to a local optimum
(`search.climbed_baseline`: deterministic, no deadline), replayed as one episode from a random
start (`acting.replay_placement`): the observations the policy would see placing it. Cloning
trains the network on those episodes (the negative log-likelihood of the teacher's device at
every step: `PlacetoAgent`'s imitation lanes with weight 1, no entropy bonus). Map of the file:

  Teacher              one problem's teacher: its label, the teacher's step time over the best
                       fast baseline's, the problem's statics and the replayed episode.
  make_teacher(problem, label)   a Teacher (the baselines, the climb, the replay): the same
                       for every run, whatever its seed, so runs can share them.
  teacher_sources(sources, family_members)   the sources plus the first members of each
                       built-in family among them (not the validation and held-out members):
                       more members to clone than to train on.
  save_teacher, load_teacher   a Teacher as a numpy .npz file (plain arrays, no pickle).
  teach(sources, clusters, directory)  the Teachers of every source on every cluster,
                       saved in `directory` (a rerun makes only the missing ones). Named
                       sources are imported in child processes, a few each: importing a graph
                       leaks memory in TensorFlow that is never returned (~0.3 GB for an
                       nmt-variants member), so one process cannot import a few hundred.
  clone(network, teachers, updates)    behaviour cloning; the loss of every update.
  clone_teachers(sources, clusters, directory, seed)   the phase (gin-configurable, off unless
                       `updates` > 0), a function of the network: what `train` runs on fresh
                       weights before its first batch (`tfplaceto.rl.learner.train_sources`).

No episode of the policy is sampled: cloning is not counted in the run's episodes or decisions;
its wall time is in the run's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import multiprocessing
import os
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence

import gin
import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from tfplaceto import errors
from tfplaceto.cluster import as_cluster
from tfplaceto.graph import BUILTIN_PREFIX
from tfplaceto.graph.builtin import EVALUATION_MEMBERS, check_name
from tfplaceto.policy import observation
from tfplaceto.policy.network import PlacetoNetwork
from tfplaceto.problem import Problem
from tfplaceto.progress import tqdm
from tfplaceto.rl.acting import replay_placement
from tfplaceto.rl.agent import PlacetoAgent, as_tensors
from tfplaceto.rl.environment import PlacementEnvironment, action_spec_for
from tfplaceto.rl.train import problem_label, problems_for
from tfplaceto.search import best_baseline, climbed_baseline


@dataclasses.dataclass
class Teacher:
    """One problem's teacher. `experience` (Trajectory [1, T]) and `weights` ([1, T]) are the
    replayed episode at the problem's own padded sizes (`observation.dims_for([statics])`);
    `clone` pads them to the sizes of all the teachers it trains on."""

    label: str
    ratio: float  # the teacher's simulated step time over the best fast baseline's
    statics: observation.GraphStatics
    experience: object
    weights: np.ndarray


def make_teacher(problem: Problem, label: str, placement: np.ndarray | None = None) -> Teacher:
    """The climbed best baseline of `problem` (or `placement`, when given), replayed from a
    random start drawn from the label (each problem its own start, the same on every run)."""
    baseline = best_baseline(problem)
    if placement is None:
        placement = climbed_baseline(problem, baseline=baseline).placement
    env = PlacementEnvironment(problem, batch_size=1, initial="random", seed=zlib.crc32(label.encode()))
    experience, weights = replay_placement(env, placement)
    ratio = problem.simulator().run(placement)[0] / baseline.step_time_s
    return Teacher(label, ratio, env.statics[0], experience, weights)


def teacher_sources(sources: Sequence, family_members: int) -> list:
    """`sources`, then members 0 .. family_members - 1 of every built-in family a source is a
    member of ("builtin:cifar10-cells/3" is one of cifar10-cells) that are not already there,
    less the members the project's figures judge policies on (`builtin.EVALUATION_MEMBERS`:
    50-55 and 100-109), so that a clone is never validated or tested on what it imitated."""
    extra: list[str] = []
    for source in sources:
        if isinstance(source, str) and source.startswith(BUILTIN_PREFIX):
            entry, _ = check_name(source[len(BUILTIN_PREFIX):])
            if entry.kind == "family":
                extra += [f"{BUILTIN_PREFIX}{entry.name}/{m}" for m in range(family_members)
                          if m not in EVALUATION_MEMBERS]
    return list(sources) + [s for s in dict.fromkeys(extra) if s not in sources]


def _file(directory: str, label: str) -> str:
    return os.path.join(directory, hashlib.sha1(label.encode()).hexdigest()[:16] + ".npz")


def save_teacher(teacher: Teacher, path: str) -> None:
    """Writes `teacher` to `path` (atomically) as a numpy .npz of plain arrays (no pickle)."""
    arrays = {"label": np.array(teacher.label), "ratio": np.array(teacher.ratio), "weights": teacher.weights}
    for field in dataclasses.fields(observation.GraphStatics):
        value = getattr(teacher.statics, field.name)
        if isinstance(value, tuple):  # `members`: one array per step, stored end to end
            arrays[f"statics/{field.name}"] = np.concatenate(value) if value else np.zeros(0, np.int64)
            arrays[f"statics/{field.name}/lengths"] = np.array([len(v) for v in value], np.int64)
        else:
            arrays[f"statics/{field.name}"] = np.asarray(value)
    for name, value in teacher.experience._asdict().items():
        if isinstance(value, dict):
            arrays.update({f"experience/{name}/{key}": x for key, x in value.items()})
        elif not isinstance(value, tuple):  # policy_info is () for a replay
            arrays[f"experience/{name}"] = value
    with tempfile.NamedTemporaryFile("wb", dir=os.path.dirname(path) or ".", delete=False) as f:
        np.savez(f, **arrays)
    os.replace(f.name, path)


def load_teacher(path: str) -> Teacher:
    """The Teacher `save_teacher` wrote to `path`."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    statics = {}
    for field in dataclasses.fields(observation.GraphStatics):
        value = arrays[f"statics/{field.name}"]
        lengths = arrays.get(f"statics/{field.name}/lengths")
        if lengths is not None:
            value = tuple(np.split(value, np.cumsum(lengths)[:-1]))
        elif value.ndim == 0:
            value = value.item()
        statics[field.name] = value
    observations = {key.split("/")[2]: x for key, x in arrays.items() if key.startswith("experience/observation/")}
    experience = trajectory.Trajectory(**{
        name: observations if name == "observation" else arrays.get(f"experience/{name}", ())
        for name in trajectory.Trajectory._fields})
    return Teacher(str(arrays["label"]), float(arrays["ratio"]), observation.GraphStatics(**statics), experience,
                   arrays["weights"])


def _teach_and_save(sources: Sequence, clusters: Sequence, directory: str) -> int:
    """Makes and saves (`save_teacher`) the teachers of `sources` x `clusters` not in `directory`."""
    problems, labels = problems_for(sources, clusters)
    for problem, label in zip(problems, labels):
        path = _file(directory, label)
        if not os.path.exists(path):
            save_teacher(make_teacher(problem, label), path)
    return len(labels)


def teach(sources: Sequence, clusters: Sequence, directory: str, sources_per_process: int = 3,
          workers: int = 1, progress: bool = True) -> list[Teacher]:
    """The Teachers of every source on every cluster (sources-major, as `problems_for` orders
    them), made once and kept in `directory`. Sources named by strings are imported
    `sources_per_process` to a child process, `workers` at a time; others in this process."""
    os.makedirs(directory, exist_ok=True)
    clusters = [as_cluster(c) for c in clusters]
    labels = [[problem_label(s, c) if isinstance(s, str) else None for c in clusters] for s in sources]
    missing = [s for s, row in zip(sources, labels) if not all(x and os.path.exists(_file(directory, x)) for x in row)]
    bar = tqdm(total=len(sources) * len(clusters), initial=(len(sources) - len(missing)) * len(clusters),
               unit="teacher", desc="teachers", dynamic_ncols=True, disable=not progress)
    named = [s for s in missing if isinstance(s, str)]
    if named:
        chunks = [named[i:i + sources_per_process] for i in range(0, len(named), sources_per_process)]
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no TensorFlow state shared
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context, max_tasks_per_child=1) as pool:
            futures = [pool.submit(_teach_and_save, chunk, clusters, directory) for chunk in chunks]
            for future in concurrent.futures.as_completed(futures):
                bar.update(future.result())
    teachers: list[Teacher] = []
    for source, row in zip(sources, labels):
        if isinstance(source, str):
            for label in row:
                teachers.append(load_teacher(_file(directory, label)))
        else:  # an OpGraph or a graph already in memory: nothing to leak, nothing to name it by
            problems, own = problems_for([source], clusters)
            teachers += [make_teacher(p, label) for p, label in zip(problems, own)]
            bar.update(len(problems))
    bar.close()
    return teachers


def _padded(experience, dims: observation.Dims):
    """`experience`'s observations zero-padded to `dims`: what an environment at `dims` writes
    (slots past a graph's nodes and a cluster's devices are zero, `observation.fill_observations`)."""
    spec = observation.observation_spec(dims)
    fields = {name: (np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, spec[name].shape[0] - x.shape[-1])])
                     if spec[name].shape else x) for name, x in experience.observation.items()}
    return experience._replace(observation=fields)


SCHEDULES = ("constant", "cosine")


def clone(network: PlacetoNetwork, teachers: Sequence[Teacher], updates: int, learning_rate: float = 1e-3,
          per_update: int = 9, seed: int = 0, progress: bool = True, schedule: str = "constant") -> list[float]:
    """Behaviour cloning of `teachers` into `network`'s weights: `updates` Adam updates, each on
    the mean gradient of `per_update` teachers (every teacher once before any twice, in an
    order drawn from `seed`). Returns each update's loss (the mean over its teachers of the
    negative log-likelihood per step of the teacher's device).

    `schedule`: Adam's step size, "constant" (`learning_rate` throughout) or "cosine" (from
    `learning_rate` down to 0 at the last update): with a constant step the last weights are one
    draw of a noisy walk, and which draw depends on the order of the updates.

    An ensemble (`PlacetoNetwork(ensemble=K)`) is cloned member by member, member k in an order
    drawn from `seed + k`: each is then the network one run of seed `seed + k` clones, and the
    members err apart rather than together. The losses returned are the members' mean."""
    if schedule not in SCHEDULES:
        raise errors.InvalidArgumentError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if network.members:
        losses = [clone(member, teachers, updates, learning_rate, per_update, seed + k, progress, schedule)
                  for k, member in enumerate(network.members)]
        return [float(x) for x in np.mean(losses, axis=0)]
    dims = observation.dims_for([t.statics for t in teachers])
    packed = as_tensors(observation.pack([t.statics for t in teachers], dims))
    time_step_spec = tensor_spec.from_spec(ts.time_step_spec(observation.observation_spec(dims)))
    action_spec = tensor_spec.from_spec(action_spec_for(dims))
    if schedule == "cosine":
        learning_rate = tf.keras.optimizers.schedules.CosineDecay(learning_rate, max(updates, 1))
    agent = PlacetoAgent(time_step_spec, action_spec, network, packed, learning_rate=learning_rate,
                         entropy_coefficient=0.0, max_train_steps=None, seed=seed)
    imitation = tf.constant([1.0])  # the one lane is a teacher's: its every step is cloned
    data = []
    for index, teacher in enumerate(teachers):
        experience = _padded(teacher.experience, dims)
        experience.observation[observation.PROBLEM][:] = index
        data.append((tf.nest.map_structure(tf.constant, experience), tf.constant(teacher.weights), imitation))
    rng, order, losses = np.random.default_rng(seed), [], []
    with tqdm(total=updates, unit="update", desc="cloning", dynamic_ncols=True, disable=not progress) as bar:
        for _ in range(updates):
            if len(order) < per_update:
                order += list(rng.permutation(len(data)))
            chosen, order = order[:per_update], order[per_update:]
            losses.append(float(agent.train_averaged([data[j] for j in chosen]).extra.policy_loss))
            bar.update(1)
            bar.set_postfix(loss=f"{np.mean(losses[-per_update:]):.3f}")
    return losses


@gin.configurable(denylist=["sources", "clusters", "directory", "seed", "progress"])
def clone_teachers(sources: Sequence, clusters: Sequence, directory: str | None, seed: int = 0,
                   progress: bool = True, updates: int = 0, family_members: int = 0, learning_rate: float = 1e-3,
                   per_update: int = 9, sources_per_process: int = 3, workers: int = 1,
                   schedule: str = "constant") -> Callable[[PlacetoNetwork], dict] | None:
    """The teacher phase (module docstring) as `train`'s `pretrain`: None when `updates` is 0
    (the default: off). Its arguments are checked here, before any graph is imported.

    The phase makes teachers for every training source and, for built-in family members, for
    members 0 .. family_members - 1 of their families too (`teacher_sources`: never the
    validation and held-out members 50-55 and 100-109), on every cluster, kept in `directory`
    (a temporary one when None); then `updates` cloning updates (`clone`, in an order drawn
    from `seed`) into the network it is called with. It returns the record
    `train` keeps in its state and summary. The teachers do not depend on the seed: runs of
    several seeds can share a `directory` (copy it into each logdir) and make them once.
    """
    for name, value, least in (("updates", updates, 0), ("family_members", family_members, 0),
                               ("per_update", per_update, 1), ("sources_per_process", sources_per_process, 1),
                               ("workers", workers, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise errors.InvalidArgumentError(f"clone_teachers.{name} must be an integer >= {least}, got {value!r}")
    if schedule not in SCHEDULES:
        raise errors.InvalidArgumentError(f"clone_teachers.schedule must be one of {', '.join(SCHEDULES)}, "
                                          f"got {schedule!r}")
    if not updates:
        return None

    def phase(network: PlacetoNetwork) -> dict:
        began = time.perf_counter()
        with tempfile.TemporaryDirectory() if directory is None else contextlib.nullcontext(directory) as where:
            teachers = teach(teacher_sources(sources, family_members), clusters, where, sources_per_process,
                             workers, progress)
        losses = clone(network, teachers, updates, learning_rate, per_update, seed, progress, schedule)
        tail = max(1, min(len(losses), len(teachers) // per_update))  # about one pass over the teachers
        return {"teachers": len(teachers), "updates": updates, "schedule": schedule,
                "teacher_over_best_baseline": float(np.exp(np.mean(np.log([t.ratio for t in teachers])))),
                "loss_first": losses[0], "loss_last": float(np.mean(losses[-tail:])),
                "wall_s": time.perf_counter() - began}

    return phase
