"""`place(problem, seed, budget_s)`: the Placeto method, from the shipped policy.

  PRETRAINED_DIR       the policy shipped in the package (`pretrained/`: policy.json + weights.*).
  save_policy          writes a network there (or anywhere): its config and a tf.train.Checkpoint.
  load_policy          reads one back (None when there is none or it does not fit this code).
  untrained_network    fresh weights in the shipped policy's configuration (for ablations).
  block_moves          moves of runs of consecutive tie classes to one device (a layer at once).
  prepare_neighbourhoods  the moves every climb tries (single classes, blocks), prepared once.
  polish               hill climbing over single-class and block moves: every climb of the placer.
  improve              iterated local search, perturbing by policy episodes and random moves.
  random_window_moves  the random moves: a policy episode's window sent to random devices.
  place                the placer `tfplaceto.place(..., method="placeto")` calls.

How `place` works (every placement the simulator evaluates is a candidate; the answer is the best,
so it is never worse than its starting placements):
1. Start: the best of the fast baselines (`COMPARED_BASELINES`, by simulated (OOM, step time)),
   improved by hill climbing on the simulator to a local optimum of two neighbourhoods in turn:
   one tie class to another device (`local_search.climb`, local_search's moves) and a run of
   consecutive classes to one device (`block_moves`: a layer moves at once, where each of its
   classes moved alone would add transfers both ways). Every "climb" below is this one.
2. One greedy episode of the policy from there (every colocation class re-placed once, with the
   simulator's lookahead as features), climbed again.
3. With budget_s > 0: REINFORCE fine-tuning of the shipped weights on this problem in the role
   the search gives the policy (`SearchRole`: episodes re-place a window of the climbed start or
   of the best placement so far and are climbed; the return is the climbed gain) for the budget
   minus the search.
4. `improve` until the deadline (SEARCH_BUDGET_S without a budget: the default budget of
   `local_search`, so the two compare at equal wall time) or until PATIENCE rounds in a row find
   nothing better: each round perturbs the best placement ROLLOUTS times (WINDOW consecutive
   classes re-placed at a random position: POLICY_ROLLOUTS sampled policy episodes, the others
   random devices), climbs from each perturbed placement, and keeps the best. Climbing alone
   stops at the first local optimum; the perturbations leave it. `benchmarks/ablation.py`
   compares the policy's episodes with random moves alone and with untrained weights.
Deterministic given `seed` when the search stops by patience; a search cut by the deadline
depends on the machine's speed (like local_search's).

The shipped policy was trained in that role (`SearchRole`: episodes re-place a window of a local
optimum, are climbed, and return the climbed gain) with (20 minutes on 2 CPU cores, 4192 episodes;
resumable, rerun to resume):

    python -m tfplaceto.policy.placer --train --logdir /tmp/placeto-pretrain --minutes 20

which trains fresh weights without a lookahead prior (`--lookahead-prior 0`: at first the
episodes are close to random moves, the perturbation the policy has to beat) on members 0-2 of
cifar10-cells and ptb-cells on 2xK80, 4xV100 and 8xV100, and copies `LOGDIR/policy` into
`pretrained/`. `benchmarks/perturbations.py` measures the episodes against random moves and
untrained weights on held-out members.
"""

from __future__ import annotations

import importlib.util  # noqa: F401  tfplaceto.baselines.available() needs it imported
import json
import os
import time
import warnings

import numpy as np

from tfplaceto.baselines import local_search, starting_placements  # noqa: F401  (re-exported)
from tfplaceto.policy.checkpoint import PRETRAINED_DIR, load_policy, save_policy  # noqa: F401
from tfplaceto.problem import Problem

SEARCH_BUDGET_S = local_search.DEFAULT_BUDGET_S
BLOCK_SIZES = (2, 4, 8, 16, 32)  # consecutive tie classes a block move sends to one device
WINDOW = 8  # classes re-placed by one perturbation episode (picked from 8, 16, 32, 96, all: RESULTS.md)
ROLLOUTS = 4  # perturbations per round
# Of which policy episodes (batched through the network); the rest are random moves of the same
# size: neither kind is better on every row of the benchmarks (RESULTS.md, the ablation).
POLICY_ROLLOUTS = 2
PATIENCE = 8  # rounds without improvement that end the search


def untrained_network(seed: int, like=None):
    """Fresh weights (seeded) in the configuration of `like`, else of the shipped policy, else the
    defaults: the "untrained" of the ablations, which differs from the policy in its weights only."""
    from tfplaceto.policy.network import PlacetoNetwork

    like = like if like is not None else load_policy()
    return PlacetoNetwork(**{**(like.config if like is not None else {}), "seed": seed})


def _network(seed: int, policy_dir: str | None):
    network = load_policy(policy_dir)
    if network is None:
        where = policy_dir or "tfplaceto/policy/pretrained/ (nothing shipped)"
        warnings.warn(f"no trained Placeto policy in {where}; using freshly initialized weights "
                      f"(seed {seed}): placements are still valid and never worse than the best "
                      "baseline", stacklevel=3)
        network = untrained_network(seed)
    return network


# -- placing ---------------------------------------------------------------------------------------
def block_moves(problem: Problem, inst=None) -> local_search.Moves:
    """Moves of runs of consecutive tie classes (by their first op's topological position), of
    BLOCK_SIZES classes overlapping by half, each run to one device.

    A layer, or a stage of a pipeline, is several tie classes: hill climbing over single-class
    moves cannot move it when every class moved alone makes the step slower (it adds transfers
    both ways) while moving all of them together makes it faster. `inst`: `_common.prepare(problem)`,
    computed here when not given.
    """
    from tfplaceto.baselines import _common

    inst = inst or _common.prepare(problem)
    position = np.empty(inst.num_nodes, np.int64)
    position[inst.order] = np.arange(inst.num_nodes)
    classes = np.argsort(position[inst.class_members[inst.class_ptr[:-1]]], kind="stable")
    blocks = [classes[i:i + size] for size in BLOCK_SIZES if size < len(classes)
              for i in range(0, len(classes) - size // 2, size // 2)]
    return local_search.class_moves(inst, blocks)


def prepare_neighbourhoods(problem: Problem, blocks: local_search.Moves | None = None):
    """(inst, single-class moves, block moves (`blocks`, default `block_moves(problem)`)) of
    `problem`: what `polish` and `improve` climb over, prepared once for every climb."""
    from tfplaceto.baselines import _common

    inst = _common.prepare(problem)
    return inst, local_search.class_moves(inst), block_moves(problem, inst) if blocks is None else blocks


def polish(problem: Problem, placement: np.ndarray, rng: np.random.Generator,
           deadline: float = float("inf"), neighbourhoods=None) -> np.ndarray:
    """`placement` hill-climbed to a local optimum of single-class and block moves in turn (or
    to the deadline): every climb of the placer. `neighbourhoods`:
    `prepare_neighbourhoods(problem)`, prepared here when not given."""
    inst, singles, blocks = neighbourhoods or prepare_neighbourhoods(problem)
    current = placement
    while time.perf_counter() < deadline:
        current = local_search.climb(problem, current, rng, deadline, inst, singles)
        moved = local_search.climb(problem, current, rng, deadline, inst, blocks)
        if np.array_equal(moved, current):
            break
        current = moved
    return current


def _start(problem: Problem, seed: int, rng: np.random.Generator, deadline: float, neighbourhoods):
    """A `Best` holding where the search begins: the best fast baseline (by simulated (OOM,
    step time)), climbed."""
    from tfplaceto.rl.environment import Best

    best = Best()
    simulator = problem.simulator()
    for placement in starting_placements(problem, seed).values():
        step_time, _, oom = simulator.run(placement)
        best.offer(step_time, oom, placement)
    _climbed(problem, best.placement, best, rng, deadline, neighbourhoods)
    return best


def _climbed(problem: Problem, placement: np.ndarray, best, rng: np.random.Generator,
             deadline: float, neighbourhoods) -> None:
    """Offers `polish(problem, placement, ...)` to `best`."""
    current = polish(problem, placement, rng, deadline, neighbourhoods)
    step_time, _, oom = problem.simulator().run(current)
    best.offer(step_time, oom, current)


def improve(problem: Problem, network, best, seed: int = 0, deadline: float = float("inf"),
            window: int | None = WINDOW, rollouts: int = ROLLOUTS, policy_rollouts: int = POLICY_ROLLOUTS,
            patience: int = PATIENCE, perturb=None, on_round=None, neighbourhoods=None):
    """Iterated local search from `best.placement` (a `Best`, updated and returned).

    Each round perturbs the best placement `rollouts` times, re-placing `window` consecutive
    classes: `policy_rollouts` of them are episodes sampled from the policy (seeded), the others
    random moves (`random_window_moves`, or `perturb` (rng, placement) -> placement when given,
    which then replaces the policy's episodes too: for ablations). Each perturbed placement is
    hill-climbed (`polish` over `neighbourhoods`, default `prepare_neighbourhoods(problem)`); the
    best placement seen is kept. Ends at `deadline` or after `patience`
    rounds in a row without improvement. `on_round(best)` is called after every round.
    """
    from tfplaceto.rl.environment import PlacementEnvironment
    from tfplaceto.rl.train import make_logits_fn, rollout

    rng = np.random.default_rng(seed)
    neighbourhoods = neighbourhoods or prepare_neighbourhoods(problem)
    if perturb is None:
        perturb = random_window_moves(problem, window or problem.num_nodes)
    else:
        policy_rollouts = 0
    envs = [PlacementEnvironment(problem, initial=lambda p, r: best.placement, seed=seed + k,
                                 window=window) for k in range(min(policy_rollouts, rollouts))]
    if envs:
        logits_fn = make_logits_fn(network, envs[0].observation_spec())
    idle = 0
    while idle < patience and time.perf_counter() < deadline:
        before = (best.oom, best.step_time_s)
        ends = []
        if envs:
            rollout(envs, logits_fn, rng)
            ends = [env.placement for env in envs]
            for env in envs:
                best.offer(env.best.step_time_s, env.best.oom, env.best.placement)
        ends += [perturb(rng, best.placement) for _ in range(rollouts - len(envs))]
        for end in ends:
            if time.perf_counter() >= deadline:
                break
            _climbed(problem, end, best, rng, deadline, neighbourhoods)
        idle = idle + 1 if (best.oom, best.step_time_s) >= before else 0
        if on_round is not None:
            on_round(best)
    return best


def random_window_moves(problem: Problem, window: int):
    """(rng, placement) -> placement with `window` consecutive classes (the policy's step order)
    moved to random allowed devices: the policy's perturbation without the policy."""
    from tfplaceto.policy import features

    statics = features.graph_statics(problem)
    allowed = [np.flatnonzero(problem.allowed[node]) for node in statics.steps]

    def perturb(rng: np.random.Generator, placement: np.ndarray) -> np.ndarray:
        moved = placement.copy()
        begin = int(rng.integers(max(statics.num_steps - window, 0) + 1))
        for step in range(begin, min(begin + window, statics.num_steps)):
            moved[statics.members[step]] = rng.choice(allowed[step])
        return moved

    return perturb


class SearchRole:
    """The policy's part in the search as `train()` arguments: train it for the job it does.

    The search perturbs its best placement (a local optimum of the placer's climbing) by
    re-placing WINDOW consecutive classes, then climbs (`polish`), and keeps the best result.
    Episodes of this role do the same: they start from a local optimum, re-place a window, and
    are polished by the same climbing; the return is the improvement of the polished placement
    when positive, else 0 (`gains_only`: the search loses nothing by a worse try, and scoring
    losses teaches the policy to change nothing). Half the episodes start from the placer's start
    (the best fast baseline, climbed), half from the best placement found so far (the search
    moves on from its best too; alone it soon leaves nothing to find on small graphs).
    `best`: when given (one problem), the best so far, shared with the caller (fine-tuning).
    """

    def __init__(self, seed: int = 0, best=None):
        self._rng = np.random.default_rng(seed)
        self._seed = seed
        self._given = best
        self._state: dict[int, tuple] = {}  # id(problem) -> (start, best, neighbourhoods)

    def _of(self, problem: Problem) -> tuple:
        key = id(problem)
        if key not in self._state:
            neighbourhoods = prepare_neighbourhoods(problem)
            best = self._given if self._given is not None else _start(
                problem, self._seed, self._rng, float("inf"), neighbourhoods)
            self._state[key] = (best.placement.copy(), best, neighbourhoods)
        return self._state[key]

    def start(self, problem: Problem, rng: np.random.Generator) -> np.ndarray:
        return self._of(problem)[0]

    def best(self, problem: Problem, rng: np.random.Generator) -> np.ndarray:
        return self._of(problem)[1].placement

    def polish(self, problem: Problem, placement: np.ndarray) -> np.ndarray:
        _, best, neighbourhoods = self._of(problem)
        polished = polish(problem, placement, self._rng, neighbourhoods=neighbourhoods)
        step_time, _, oom = problem.simulator().run(polished)
        best.offer(step_time, oom, polished)
        return polished

    def train_kwargs(self) -> dict:
        """`initial`, `window`, `polish` and `gains_only` for `tfplaceto.rl.train.train`."""
        return {"initial": (self.start, self.best), "window": WINDOW, "polish": self.polish,
                "gains_only": True}


def place(problem: Problem, seed: int = 0, budget_s: float | None = None,
          policy_dir: str | None = None, network=None, perturb=None) -> np.ndarray:
    """The device index of every node of `problem` (module docstring).

    Args:
      problem: the Problem to place.
      seed: seeds fresh weights (if no policy is installed), the search and fine-tuning.
      budget_s: wall seconds in all (None or 0: zero-shot, searching for at most
        SEARCH_BUDGET_S); above that, the time beyond SEARCH_BUDGET_S fine-tunes the policy.
      policy_dir: a saved policy to use instead of the shipped one.
      network: a PlacetoNetwork to use instead of loading one (e.g. untrained weights, or a policy
        just trained; fine-tuning updates it).
      perturb: for ablations, (rng, placement) -> placement: `improve` uses these moves instead of
        the policy's episodes, and the greedy policy episode (step 2) is skipped: no policy at all.
    """
    from tfplaceto.rl.environment import PlacementEnvironment
    from tfplaceto.rl.train import make_logits_fn, rollout

    began = time.perf_counter()
    deadline = began + max(budget_s or 0.0, SEARCH_BUDGET_S)
    network = network if network is not None else _network(seed, policy_dir)
    rng = np.random.default_rng(seed)
    neighbourhoods = prepare_neighbourhoods(problem)
    best = _start(problem, seed, rng, deadline, neighbourhoods)

    if perturb is None:
        env = PlacementEnvironment(problem, initial=lambda p, r: best.placement, seed=seed)
        rollout([env], make_logits_fn(network, env.observation_spec()), None)
        best.offer(env.best.step_time_s, env.best.oom, env.best.placement)
        _climbed(problem, env.placement, best, rng, deadline, neighbourhoods)

    tuning_s = deadline - SEARCH_BUDGET_S - time.perf_counter()
    if budget_s and tuning_s > 1.0:
        from tfplaceto.rl.train import train

        result = train(problem, episodes=10**9, seed=seed, budget_s=tuning_s, network=network,
                       progress=False, **SearchRole(seed, best).train_kwargs())
        found = result.best[0]
        if found.placement is not None:
            best.offer(found.step_time_s, found.oom, found.placement)
    from tqdm.auto import tqdm

    # A bar on interactive terminals only (disable=None): seconds of the search, best so far.
    with tqdm(total=round(deadline - began), unit="s", desc="placeto search", disable=None,
              leave=False, dynamic_ncols=True) as bar:
        def on_round(found) -> None:
            bar.n = min(round(time.perf_counter() - began), bar.total)
            bar.set_postfix(best_ms=f"{found.step_time_s * 1e3:.4g}", refresh=True)

        best = improve(problem, network, best, seed=seed, deadline=deadline, perturb=perturb,
                       on_round=on_round, neighbourhoods=neighbourhoods)
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
    parser.add_argument("--lookahead-prior", type=float, default=0.0,
                        help="initial weight of the simulator's lookahead in the logits")
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
        train(problems, episodes=args.episodes, logdir=args.logdir, seed=args.seed, budget_s=remaining,
              lookahead_prior=args.lookahead_prior, **SearchRole(args.seed).train_kwargs())
    spent, episodes = progress()
    if not args.no_install:
        save_policy(load_policy(os.path.join(args.logdir, "policy")), PRETRAINED_DIR,
                    notes={"trained_by": "python -m tfplaceto.policy.placer --train --logdir D "
                           f"--minutes {args.minutes:g} --families {args.families} "
                           f"--clusters {args.clusters} --num-graphs {args.num_graphs} "
                           f"--lookahead-prior {args.lookahead_prior:g} --seed {args.seed}", "wall_s": spent, "episodes": episodes})


if __name__ == "__main__":
    _main()
