"""`place(problem, seed, budget_s)`: the Placeto method, from the shipped policy.

  PRETRAINED_DIR       the policy shipped in the package (`pretrained/`: policy.json + weights.*).
  save_policy          writes a network there (or anywhere): its config and a tf.train.Checkpoint.
  load_policy          reads one back (None when there is none or it does not fit this code).
  search               greedy and sampled policy episodes from start placements: the best found.
  place                the placer `tfplaceto.place(..., method="placeto")` calls.

How `place` works:
1. Start placements: the best of the fast baselines (`tfplaceto.place.COMPARED_BASELINES` that are
   installed, by simulated (OOM, step time)) and the single-device placement.
2. From each start, greedy episodes of the policy (every colocation class re-placed once per
   episode, with the simulator's lookahead as features); repeated from the best placement found
   while an episode improves it; then a few episodes sampled from the policy (seeded) from the
   best placement so far (`search`). Every placement the simulator evaluates is a candidate.
3. With budget_s > 0: REINFORCE fine-tuning of the shipped weights on this problem for the rest of
   the budget (episodes start from the best placement so far and from the best baseline), then a
   last greedy episode.
The answer is the best placement simulated, so it is never worse than its starting placements.
Without a budget the result is deterministic given `seed`; with one, how many updates fit depends
on the machine.

The shipped policy was trained with (about 20 minutes on 2 CPU cores; resumable, rerun to resume):

    python -m tfplaceto.policy.placer --train --logdir /tmp/placeto-pretrain --minutes 20

which runs `tfplaceto.rl.train.train_family(["cifar10-cells", "ptb-cells"], ["2xK80", "4xV100",
"8xV100"], num_graphs=3, ...)` and copies `LOGDIR/policy` into `pretrained/`.
"""

from __future__ import annotations

import importlib.util  # noqa: F401  tfplaceto.baselines.available() needs it imported
import json
import os
import time
import warnings

import numpy as np

from tfplaceto.baselines import starting_placements  # noqa: F401  (re-exported)
from tfplaceto.policy.checkpoint import PRETRAINED_DIR, load_policy, save_policy  # noqa: F401
from tfplaceto.problem import Problem


def _network(seed: int, policy_dir: str | None):
    from tfplaceto.policy.network import PlacetoNetwork

    network = load_policy(policy_dir)
    if network is None:
        where = policy_dir or "tfplaceto/policy/pretrained/ (nothing shipped)"
        warnings.warn(f"no trained Placeto policy in {where}; using freshly initialized weights "
                      f"(seed {seed}): placements are still valid and never worse than the best "
                      "baseline", stacklevel=3)
        network = PlacetoNetwork(seed=seed)
    return network


# -- placing ---------------------------------------------------------------------------------------
def search(problem: Problem, network, starts, seed: int = 0, max_passes: int = 3,
           sampled_rounds: int = 2, batch: int = 4, deadline: float | None = None, best=None):
    """The best placement the policy finds from `starts` (a `Best`).

    First greedy episodes from each start, repeated from the best placement found while they
    improve it; then `sampled_rounds` rounds of `batch` episodes sampled from the policy (seeded),
    each starting from the best placement so far. Every simulated placement is a candidate.
    """
    from tfplaceto.rl.environment import Best, PlacementEnvironment
    from tfplaceto.rl.train import make_logits_fn, rollout

    best = best or Best()
    current = np.asarray(starts[0], np.int32)
    envs = [PlacementEnvironment(problem, initial=lambda p, rng: current, seed=seed + k)
            for k in range(batch)]
    logits_fn = make_logits_fn(network, envs[0].observation_spec())

    def expired() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    for start in starts:
        current = np.asarray(start, np.int32)
        for _ in range(max_passes):
            if expired():
                break
            before = (envs[0].best.oom, envs[0].best.step_time_s)
            rollout(envs[:1], logits_fn, None)
            current = envs[0].best.placement
            if (envs[0].best.oom, envs[0].best.step_time_s) >= before:
                break
    rng = np.random.default_rng(seed)
    for _ in range(sampled_rounds):
        if expired():
            break
        current = min((env.best for env in envs if env.best.placement is not None),
                      key=lambda b: (b.oom, b.step_time_s)).placement
        rollout(envs, logits_fn, rng)
    for env in envs:
        if env.best.placement is not None:
            best.offer(env.best.step_time_s, env.best.oom, env.best.placement)
    return best


def place(problem: Problem, seed: int = 0, budget_s: float | None = None,
          policy_dir: str | None = None) -> np.ndarray:
    """The device index of every node of `problem` (module docstring).

    Args:
      problem: the Problem to place.
      seed: seeds fresh weights (if no policy is installed) and fine-tuning.
      budget_s: wall seconds for fine-tuning on this problem (None or 0: zero-shot).
      policy_dir: a saved policy to use instead of the shipped one.
    """
    from tfplaceto.rl.environment import Best

    start_time = time.perf_counter()
    deadline = start_time + budget_s if budget_s else None
    network = _network(seed, policy_dir)
    starts = starting_placements(problem, seed)
    best = Best()
    simulator = problem.simulator()
    for placement in starts.values():
        step_time, _, oom = simulator.run(placement)
        best.offer(step_time, oom, placement)
    best = search(problem, network, list(starts.values()), seed=seed, deadline=deadline, best=best)
    if deadline is not None:
        remaining = deadline - time.perf_counter()
        if remaining > 1.0:
            from tfplaceto.rl.train import train

            baseline = next(iter(starts.values()))
            result = train(problem, episodes=10**9, seed=seed, budget_s=0.85 * remaining,
                           initial=(lambda p, rng: best.placement, lambda p, rng: baseline),
                           network=network, progress=False)
            found = result.best[0]
            if found.placement is not None:
                best.offer(found.step_time_s, found.oom, found.placement)
            best = search(problem, network, [best.placement], seed=seed, max_passes=1,
                          sampled_rounds=0, deadline=deadline, best=best)
    return problem.tie(best.placement)


# -- training the shipped policy -------------------------------------------------------------------
def _main(argv=None) -> None:
    """`python -m tfplaceto.policy.placer --train --logdir D --minutes M`: (re)train the shipped policy."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", action="store_true", required=True)
    parser.add_argument("--logdir", required=True)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--families", default="cifar10-cells,ptb-cells")
    parser.add_argument("--clusters", default="2xK80,4xV100,8xV100")
    parser.add_argument("--num-graphs", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=100000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-install", action="store_true", help="do not copy into pretrained/")
    args = parser.parse_args(argv)
    from tfplaceto.rl.train import family_problems, train

    state_path = os.path.join(args.logdir, "state.json")

    def progress() -> tuple[float, int]:
        if not os.path.exists(state_path):
            return 0.0, 0
        with open(state_path) as f:
            state = json.load(f)
        return state["wall_s"], state["episodes"]

    remaining = args.minutes * 60 - progress()[0]
    if remaining > 0:
        problems = [p for family in args.families.split(",")
                    for p in family_problems(family, args.clusters.split(","), args.num_graphs)]
        train(problems, episodes=args.episodes, logdir=args.logdir, seed=args.seed, budget_s=remaining)
    spent, episodes = progress()
    if not args.no_install:
        save_policy(load_policy(os.path.join(args.logdir, "policy")), PRETRAINED_DIR,
                    notes={"trained_by": "python -m tfplaceto.policy.placer --train --logdir D "
                           f"--minutes {args.minutes:g} --families {args.families} "
                           f"--clusters {args.clusters} --num-graphs {args.num_graphs} "
                           f"--seed {args.seed}", "wall_s": spent, "episodes": episodes})


if __name__ == "__main__":
    _main()
