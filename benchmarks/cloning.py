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
    elif args.policy and args.out:
        clone(args.policy, args.cache, args.out, args.updates, args.lr, args.per_update, args.seed, args.schedule)
    else:
        parser.error("give --teach MEMBERS, or --policy and --out")


if __name__ == "__main__":
    main()
