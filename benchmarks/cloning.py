"""Cloning teachers into a trained policy: does the policy alone place unseen members better?

An experiment on the family policy (docs/RESULTS.md, issue 19, session 33), in two steps; the
policy it makes is judged like every other, by `benchmarks/generalization.py --policy OUT`.

1. `--teach MEMBERS --cache DIR` (once): for every member in MEMBERS (e.g. 3-20) of the three
   built-in families on 2xK80, 4xV100 and 8xV100, a teacher placement: the best fast baseline
   hill-climbed (`search.polish`, at most `--climb-s` seconds); with `--run LOGDIR` instead, the
   best placement that training run found for each of its own problems (its state.json: members
   0-2). Each teacher is replayed as one episode from a random start (the environment's
   observations at fixed padded sizes, `dims()`) and pickled to DIR with the problem's statics, so
   the second step builds no graph: importing a family member leaks memory in TensorFlow (~0.3 GB
   for an nmt-variants member, not returned on `del`), so one process cannot import a few hundred;
   run one process per few members.
2. `--policy DIR --out OUT`: the policy's weights are trained to clone every pickled teacher
   (behaviour cloning: the negative log-likelihood of the teacher's device at every step, the
   mean over `--per-update` teachers an update, Adam at `--lr`), `--updates` updates; the
   policy is saved to OUT_uN every `--save-every` updates and at the end. `--policy untrained`
   clones into fresh weights of the shipped configuration: what cloning alone makes, with no
   reinforcement learning.

No episode of the policy is sampled: the replays are the teachers' own, and a teacher costs its
baselines and climb on the simulator. Run:

    python benchmarks/cloning.py --teach 0-2 --run runs/shipped-policy-seed5 --cache CACHE
    python benchmarks/cloning.py --teach 3-5 --cache CACHE   # ... 6-8, ..., 18-20: one process each
    python benchmarks/cloning.py --policy runs/shipped-policy-seed5/policy --cache CACHE --out OUT
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pickle
import time

import numpy as np

FAMILIES = ("cifar10-cells", "ptb-cells", "nmt-variants")
CLUSTERS = ("2xK80", "4xV100", "8xV100")


def dims():
    """The padded observation sizes every replay is made at (they hold members 0-20)."""
    from tfplaceto.policy.observation import Dims

    return Dims(nodes=400, edges=1200, devices=9, steps=300)


def teach(members: str, cache: str, run: str | None, climb_s: float) -> None:
    """Step 1 (module docstring): one pickle per problem of `members` in `cache`."""
    from tfplaceto import search
    from tfplaceto.policy.observation import graph_statics
    from tfplaceto.rl.acting import collect
    from tfplaceto.rl.environment import PlacementEnvironment
    from tfplaceto.rl.logdir import problem_fingerprints
    from tfplaceto.rl.train import _ReplayPolicy, problems_for

    low, high = map(int, members.split("-"))
    os.makedirs(cache, exist_ok=True)
    state = json.load(open(os.path.join(run, "state.json"))) if run else None
    rng = np.random.default_rng(low)
    for family in FAMILIES:
        for member in range(low, high + 1):
            problems, labels = problems_for([f"builtin:{family}/{member}"], CLUSTERS)
            for problem, label in zip(problems, labels):
                path = os.path.join(cache, label.replace("/", "_").replace(":", "_") + ".pkl")
                if os.path.exists(path):
                    continue
                began = time.perf_counter()
                baseline = search.best_baseline(problem, 0)
                baseline_s = baseline.step_time_s
                if state is not None:
                    fingerprint = problem_fingerprints([problem])[0]
                    if fingerprint not in state["fingerprints"]:
                        raise SystemExit(f"{label} is not one of the problems {run} was trained on")
                    index = state["fingerprints"].index(fingerprint)
                    target, kind = np.array(state["best"][index]["placement"]), "run best"
                else:
                    climbed = search.polish(problem, baseline.placement, np.random.default_rng(0),
                                            deadline=time.perf_counter() + climb_s)
                    search.offer(problem, baseline, climbed)  # the better of the two
                    target, kind = np.asarray(baseline.placement), "climbed"
                ratio = problem.simulator().run(target)[0] / baseline_s
                statics = graph_statics(problem)
                start = rng.integers(0, problem.allowed.shape[1], statics.num_nodes)
                nodes = np.arange(statics.num_nodes)
                start = np.where(problem.allowed[nodes, start], start, np.argmax(problem.allowed, 1))
                replay = PlacementEnvironment(problem, batch_size=1, initial=lambda p, r, s=start: s, dims=dims())
                policy = _ReplayPolicy(replay.time_step_spec(), replay.action_spec(), target, statics.steps)
                experience, weights, _ = collect(replay, policy, replay.reset())
                with open(path + ".tmp", "wb") as f:
                    pickle.dump({"label": label, "kind": kind, "ratio": float(ratio), "statics": statics,
                                 "experience": experience, "weights": weights}, f)
                os.replace(path + ".tmp", path)
                print(f"{label:40} {kind:8} teacher / best baseline {ratio:.3f}  "
                      f"{time.perf_counter() - began:.1f} s", flush=True)


def clone(policy_dir: str, cache: str, out: str, updates: int, learning_rate: float, per_update: int,
          save_every: int, seed: int) -> None:
    """Step 2 (module docstring)."""
    import tensorflow as tf
    from tf_agents.specs import array_spec, tensor_spec
    from tf_agents.trajectories import time_step as ts

    from tfplaceto.policy import observation
    from tfplaceto.policy.checkpoint import resolve_policy, save_policy
    from tfplaceto.rl.agent import PlacetoAgent, as_tensors
    from tfplaceto.rl.train import _fixed_op_order

    began = time.perf_counter()
    teachers = [pickle.load(open(path, "rb")) for path in sorted(glob.glob(os.path.join(cache, "*.pkl")))]
    if not teachers:
        raise SystemExit(f"no teachers in {cache}: run --teach first")
    print(f"{len(teachers)} teachers, teacher / best baseline {np.mean([t['ratio'] for t in teachers]):.3f} "
          "on average", flush=True)
    network = resolve_policy(policy_dir)
    packed = as_tensors(observation.pack([t["statics"] for t in teachers], dims()))
    time_step_spec = tensor_spec.from_spec(ts.time_step_spec(observation.observation_spec(dims())))
    action_spec = tensor_spec.from_spec(array_spec.BoundedArraySpec((), np.int32, 0, dims().devices - 1))
    # Imitation lanes only (advantage 1 on every step: the cloning loss), no entropy bonus.
    agent = PlacetoAgent(time_step_spec, action_spec, network, packed, learning_rate=learning_rate,
                         entropy_coefficient=0.0, max_train_steps=None, seed=seed)
    data = []
    for index, teacher in enumerate(teachers):
        teacher["experience"].observation[observation.PROBLEM][:] = index
        data.append((teacher["experience"], tf.constant(teacher["weights"])))
    cloned = tf.constant([1.0])
    probe = data[::max(1, len(data) // 40)]

    def loss() -> float:
        """The mean cloning loss (per step) over a fixed sample of the teachers."""
        return float(np.mean([agent._loss(e, w, imitation=cloned).extra.policy_loss for e, w in probe]))

    rng = np.random.default_rng(seed)
    with _fixed_op_order(True):
        print(f"cloning loss before: {loss():.4f}", flush=True)
        order: list[int] = []
        for update in range(1, updates + 1):
            if len(order) < per_update:
                order += list(rng.permutation(len(data)))
            chosen, order = order[:per_update], order[per_update:]
            agent.train_averaged([(*data[j], cloned) for j in chosen])
            if update % 50 == 0:
                print(f"update {update}: cloning loss {loss():.4f} ({time.perf_counter() - began:.0f} s)", flush=True)
            if update % save_every == 0 or update == updates:
                save_policy(network, f"{out}_u{update}", notes={
                    "cloned_from": policy_dir, "updates": update, "teachers": len(teachers)})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", required=True, help="the teachers' directory")
    parser.add_argument("--teach", metavar="MEMBERS", help="step 1 for these members, e.g. 3-5")
    parser.add_argument("--run", help="with --teach 0-2: that training run's best placements as teachers")
    parser.add_argument("--climb-s", type=float, default=5.0)
    parser.add_argument("--policy", help="step 2: the policy directory to clone into (or 'untrained')")
    parser.add_argument("--out", help="step 2: policies are saved to OUT_uN")
    parser.add_argument("--updates", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--per-update", type=int, default=9)
    parser.add_argument("--save-every", type=int, default=250)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.teach:
        teach(args.teach, args.cache, args.run, args.climb_s)
    elif args.policy and args.out:
        clone(args.policy, args.cache, args.out, args.updates, args.lr, args.per_update, args.save_every, args.seed)
    else:
        parser.error("give --teach MEMBERS, or --policy and --out")


if __name__ == "__main__":
    main()
