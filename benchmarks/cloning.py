"""Cloning teachers into a policy, outside training: which teachers, into which weights?

The experiments around the teacher phase of `tfplaceto train` (`tfplaceto.rl.cloning`, gin
`clone_teachers.*`), in two steps; the policy they make is judged like every other, by
`benchmarks/generalization.py --policy OUT`.

1. `--teach MEMBERS --cache DIR` (once): the teachers of members MEMBERS (e.g. 3-20) of the three
   built-in families on 2xK80, 4xV100 and 8xV100 (`cloning.teach`: climbed best baselines,
   imported a few members per child process); with `--run LOGDIR` instead, the best placement
   that training run found for each of its own problems (its state.json: members 0-2).
2. `--policy DIR --out OUT`: every teacher in DIR cloned into that policy's weights
   (`cloning.clone`, `--updates` updates) and saved to OUT. `--policy untrained` clones into
   fresh weights of the shipped configuration: what the teacher phase alone makes.

3. `--roll-out MEMBERS --policy DIR --cache TEACHERS --out OUT` (DAgger's step, session 35): for
   each teacher of those members, one greedy episode of the policy from the teacher's own start,
   every step labelled with the teacher's device; saved in OUT as teachers are, so that step 2
   with `--cache TEACHERS OUT` clones the teachers and the policy's own states together.

Session 33's figures (docs/RESULTS.md) were made at commit 3cac551, before the teacher phase
existed: its teachers were climbed for at most 5 s and replayed at fixed padded sizes.

    python benchmarks/cloning.py --teach 0-2 --run runs/shipped-policy-seed5 --cache CACHE
    python benchmarks/cloning.py --teach 3-20 --cache CACHE
    python benchmarks/cloning.py --policy runs/shipped-policy-seed5/policy --cache CACHE --out OUT
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import numpy as np

FAMILIES = ("cifar10-cells", "ptb-cells", "nmt-variants")
CLUSTERS = ("2xK80", "4xV100", "8xV100")


def teach(members: str, cache: str, run: str | None) -> None:
    """Step 1 (module docstring): one pickle per problem of `members` in `cache`."""
    from tfplaceto.rl import cloning
    from tfplaceto.rl.logdir import problem_fingerprints
    from tfplaceto.rl.train import problems_for

    low, high = map(int, members.split("-"))
    sources = [f"builtin:{family}/{member}" for family in FAMILIES for member in range(low, high + 1)]
    if run is None:
        teachers = cloning.teach(sources, CLUSTERS, cache)
    else:
        with open(os.path.join(run, "state.json")) as f:
            state = json.load(f)
        problems, labels = problems_for(sources, CLUSTERS)
        teachers = []
        for problem, label in zip(problems, labels):
            fingerprint = problem_fingerprints([problem])[0]
            if fingerprint not in state["fingerprints"]:
                raise SystemExit(f"{label} is not one of the problems {run} was trained on")
            best = state["best"][state["fingerprints"].index(fingerprint)]["placement"]
            teachers.append(cloning.make_teacher(problem, label, placement=np.array(best)))
            cloning.save_teacher(teachers[-1], os.path.join(cache, f"run-best-{len(teachers)}.npz"))
    for teacher in teachers:
        print(f"{teacher.label:40} teacher / best baseline {teacher.ratio:.3f}")


def roll_out(members: str, policy_dir: str, cache: str, out: str) -> None:
    """Step 3 (module docstring): the policy's greedy episodes labelled by the teachers."""
    import zlib

    from scipy.optimize import linear_sum_assignment
    from tf_agents.policies import greedy_policy

    from tfplaceto.policy import observation
    from tfplaceto.policy.checkpoint import resolve_policy
    from tfplaceto.rl import cloning
    from tfplaceto.rl.acting import CompiledPyPolicy, collect, specs
    from tfplaceto.rl.agent import PlacetoPolicy, as_tensors
    from tfplaceto.rl.environment import PlacementEnvironment
    from tfplaceto.rl.train import problems_for

    os.makedirs(out, exist_ok=True)
    network = resolve_policy(policy_dir)
    low, high = map(int, members.split("-"))
    sources = [f"builtin:{family}/{member}" for family in FAMILIES for member in range(low, high + 1)]
    problems, labels = problems_for(sources, CLUSTERS)
    for problem, label in zip(problems, labels):
        teacher = cloning.load_teacher(cloning._file(cache, label))
        env = PlacementEnvironment(problem, batch_size=1, initial="random", seed=zlib.crc32(label.encode()),
                                   **network.acting)
        statics = as_tensors(observation.pack(env.statics, env.dims))
        policy = greedy_policy.GreedyPolicy(PlacetoPolicy(*specs(env), network, statics))
        experience, weights, _ = collect(env, CompiledPyPolicy(policy), env.reset())
        n, taught_actions = problem.num_nodes, teacher.experience.action
        own, taught = (x.observation[observation.PLACEMENT][0, -1, :n] for x in (experience, teacher.experience))
        simulate = problem.simulator().run
        taught_s = simulate(taught)[0]
        # Devices alike (type, model, memory) are interchangeable when renaming them leaves the
        # simulated step time as it is: then the teacher is named as the policy names its devices.
        kinds = np.array([hash((d.type, d.model, d.memory_bytes)) for d in problem.cluster.devices])
        counts = np.zeros((len(kinds), len(kinds)))
        np.add.at(counts, (taught, own), 1)
        rows, cols = linear_sum_assignment(np.where(kinds[:, None] == kinds[None, :], -counts, 1e9))
        rename = np.arange(len(kinds))
        rename[rows] = cols
        if abs(simulate(rename[taught])[0] - taught_s) <= 1e-9 * taught_s:
            taught_actions = rename[taught_actions]
        labelled = experience._replace(action=taught_actions.astype(teacher.experience.action.dtype), policy_info=())
        cloning.save_teacher(cloning.Teacher(label + "#rollout", teacher.ratio, teacher.statics, labelled, weights),
                             cloning._file(out, label + "#rollout"))
        print(f"{label:40} policy / teacher {simulate(own)[0] / taught_s:.3f}  "
              f"steps as the teacher's {np.mean(experience.action == taught_actions):.3f}", flush=True)


def clone(policy_dir: str, caches: list[str], out: str, updates: int, learning_rate: float, per_update: int,
          seed: int, schedule: str) -> None:
    """Step 2 (module docstring)."""
    from tfplaceto.policy.checkpoint import resolve_policy, save_policy
    from tfplaceto.rl import cloning

    began = time.perf_counter()
    teachers = [cloning.load_teacher(path) for cache in caches
                for path in sorted(glob.glob(os.path.join(cache, "*.npz")))]
    if not teachers:
        raise SystemExit(f"no teachers in {' '.join(caches)}: run --teach first")
    print(f"{len(teachers)} teachers, teacher / best baseline {np.mean([t.ratio for t in teachers]):.3f} "
          "on average", flush=True)
    network = resolve_policy(policy_dir, seed)  # 'untrained': fresh weights seeded by --seed
    losses = cloning.clone(network, teachers, updates, learning_rate, per_update, seed, schedule=schedule)
    save_policy(network, out, notes={"cloned_from": policy_dir, "updates": updates, "teachers": len(teachers),
                                     "schedule": schedule})
    print(f"cloning loss {losses[0]:.4f} -> {np.mean(losses[-per_update:]):.4f} in "
          f"{time.perf_counter() - began:.0f} s; policy: {out}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cache", required=True, nargs="+",
                        help="the teachers' directory (step 2: one or more)")
    parser.add_argument("--teach", metavar="MEMBERS", help="step 1 for these members, e.g. 3-20")
    parser.add_argument("--roll-out", metavar="MEMBERS", help="step 3 for these members, with --policy and --out")
    parser.add_argument("--run", help="with --teach 0-2: that training run's best placements as teachers")
    parser.add_argument("--policy", help="step 2: the policy directory to clone into (or 'untrained')")
    parser.add_argument("--out", help="step 2: where the cloned policy is saved")
    parser.add_argument("--updates", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--per-update", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--schedule", default="constant", help="Adam's step size over the updates: constant, cosine")
    args = parser.parse_args(argv)
    if args.teach:
        if len(args.cache) != 1:
            parser.error("--teach writes to one --cache directory")
        os.makedirs(args.cache[0], exist_ok=True)
        teach(args.teach, args.cache[0], args.run)
    elif args.roll_out and args.policy and args.out:
        roll_out(args.roll_out, args.policy, args.cache[0], args.out)
    elif args.policy and args.out:
        clone(args.policy, args.cache, args.out, args.updates, args.lr, args.per_update, args.seed, args.schedule)
    else:
        parser.error("give --teach MEMBERS, or --policy and --out (with --roll-out MEMBERS or not)")


if __name__ == "__main__":
    main()
