"""The Placeto methods: `placeto_policy` (the policy alone) and `placeto` (the search using it).

  policy_placement     `method="placeto_policy"`: the end placement of one greedy episode of the
                       policy from `start` ("random" by default, drawn with `seed`; "single";
                       "baseline"). Nothing else: no search, no climbing. A policy that learned
                       nothing keeps a bad placement, so this is what measures what was learned.
  policy_perturbation  a `search.Perturbation`: sampled policy episodes re-placing a window of
                       consecutive classes of a given placement.
  place                `method="placeto"` (the default): the search (`tfplaceto.search`) from the
                       best fast baseline and from the policy's own placement (one greedy episode;
                       with a "full"-view policy also one from the best baseline; each start
                       climbed, `search.search`), perturbing by policy episodes and
                       random moves (shared by how often each has improved the best on this
                       problem, `search.improve(adaptive=True)`); with `budget_s` above the
                       search's time, the policy is first fine-tuned on the problem (the same MDP
                       it was trained with). The starts are produced lazily: the best baseline is
                       climbed before the policy runs at all (its first episode traces a function:
                       seconds on a loaded host), the policy is not begun with less time left than
                       building it took last (`_LazyActor`), and no policy episode takes a step
                       once the deadline has passed, so the budget holds to a step. Never worse
                       than the best baseline: it is always the first start, and every start is a
                       candidate.

Layering: this module sits above `tfplaceto.rl` (which trains and runs the policy) and
`tfplaceto.search` (which knows no policy); neither imports it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from tfplaceto import errors, search
from tfplaceto.policy.checkpoint import resolve_policy
from tfplaceto.problem import Problem
from tfplaceto.progress import tqdm
from tfplaceto.rl.acting import Actor, greedy_placements
from tfplaceto.rl.train import train

STARTS = ("random", "single", "baseline")
POLICY_PERTURBATIONS = 2  # policy episodes per search round
RANDOM_PERTURBATIONS = 2  # random window moves per search round


def policy_placement(problem: Problem, policy=None, start: str = "random", seed: int = 0) -> np.ndarray:
    """The policy alone (module docstring): device index of every node of `problem`.

    `policy`: "shipped" (default), "untrained", a policy directory or a PlacetoNetwork.
    """
    if start not in STARTS:
        raise errors.InvalidArgumentError(f"start must be one of {', '.join(STARTS)}, got {start!r}")
    network = resolve_policy(policy, seed)
    return greedy_placements(problem, network, start=start, starts=1, seed=seed)[0]


class _LazyActor:
    """An `Actor` built at its first episode (not at all if none is asked for), and not begun
    when the time left before `deadline` is shorter than building one took last time.

    Building an Actor traces the policy's function: seconds on a loaded host (2-3 s measured on
    NMT-4l, 2 cores), which no deadline can cut once it has begun. The estimate is the last
    measured in this process (`warm_up_s`, a guess of that size before the first).
    """

    warm_up_s = 3.0

    def __init__(self, problem: Problem, network, seed: int):
        self._make = lambda: Actor(problem, network, seed)
        self._actor: Actor | None = None

    def episodes(self, *args, deadline: float | None = None, **kwargs) -> list[np.ndarray]:
        if self._actor is None:
            began = time.perf_counter()
            if deadline is not None and deadline - began < _LazyActor.warm_up_s:
                return []
            self._actor = self._make()
            _LazyActor.warm_up_s = time.perf_counter() - began
        return self._actor.episodes(*args, deadline=deadline, **kwargs)


def policy_perturbation(actor, window: int = search.WINDOW, deadline: float | None = None,
                        sees: bool = True, where_it_differs: bool = False) -> search.Perturbation:
    """A Perturbation: sampled policy episodes (of a `tfplaceto.rl.acting.Actor`) re-placing a
    window of `window` consecutive classes of the given placement, in lockstep; none steps
    after `deadline` (a `time.perf_counter()` value).

    `sees` (the default): the episode sees the classes before its window where the placement has
    them (`PlacementEnvironment(window_sees=True)`): it resumes a whole episode at the window, as the
    policy was trained to act, instead of placing the window into what a "placed"-view policy
    takes for an empty graph. Its re-placements are then far less destructive, and many leave
    the placement as it was; those cost only their episode (`search.improve` climbs no unchanged
    draw) and count against the policy in the adaptive shares. Draw for draw they climb to a
    better placement less often than random moves do (docs/RESULTS.md, session 40).

    `where_it_differs` (not the placer's): each window begins at a class the greedy policy would
    put elsewhere, everything before it being as the placement has it (`Actor.disagreements`,
    one replayed episode per placement asked about); none is drawn when there is no such class.
    Draw for draw, from one local optimum, these climb to a better placement more often than
    random moves and than untrained weights' do, from gentler perturbations in less climbing
    time. In the 10 s search they did worse than windows at random positions, both in their
    place and as a second policy source beside them, as far as four seeds tell (docs/RESULTS.md,
    session 41), so `method="placeto"` does not use them."""
    asked: dict[bytes, np.ndarray] = {}  # the placement last asked about -> its disagreements

    def perturb(rng: np.random.Generator, placement: np.ndarray, count: int) -> list[np.ndarray]:
        at = None
        if where_it_differs:
            if placement.tobytes() not in asked:
                asked.clear()
                asked[placement.tobytes()] = actor.disagreements(placement, deadline)
            at = asked[placement.tobytes()]
            if not len(at):
                return []
        return actor.episodes(placement, count, greedy=False, window=window, seed=int(rng.integers(2**31)),
                              deadline=deadline, window_sees=sees, window_at=at)

    return perturb


def place(problem: Problem, seed: int = 0, budget_s: float | None = None, policy=None) -> np.ndarray:
    """`method="placeto"` (module docstring): device index of every node of `problem`.

    Args:
      problem: the Problem to place.
      seed: seeds the policy's starts, fine-tuning and the search.
      budget_s: wall seconds in all (None: the search's default `search.BUDGET_S`); the time
        beyond `search.BUDGET_S` fine-tunes the policy on the problem first.
      policy: "shipped" (default), "untrained", a policy directory, or a PlacetoNetwork (which
        fine-tuning updates).
    """
    began = time.perf_counter()
    deadline = began + max(budget_s or 0.0, search.BUDGET_S)
    network = resolve_policy(policy, seed)
    tuning_s = deadline - search.BUDGET_S - time.perf_counter()
    if budget_s and tuning_s > 1.0:
        train(problem, episodes=10**9, seed=seed, network=network, progress=False,
              stop_after_s=tuning_s, select_every=None)
    baseline = search.best_baseline(problem, seed)
    actor = _LazyActor(problem, network, seed)

    def starts() -> Iterator[np.ndarray]:
        """The best baseline, then the policy's own placements. `search.search` offers (and
        climbs) each before asking for the next and asks for none after the deadline, so the
        baseline is climbed before any policy episode runs, and none runs when the time is gone."""
        yield baseline.placement
        # With the "placed" and "scheduled" views a greedy episode ends at the same placement
        # from every start (`tfplaceto.policy.features`): a second start would repeat the first.
        own = ("random", baseline.placement) if network.config["view"] == "full" else ("random",)
        for start in own:
            yield from actor.episodes(start, 1, greedy=True, seed=seed, deadline=deadline)

    perturbations = [(policy_perturbation(actor, deadline=deadline), POLICY_PERTURBATIONS),
                     (search.random_window_moves(problem), RANDOM_PERTURBATIONS)]
    # A bar on interactive terminals only (disable=None): seconds of the search, best so far.
    with tqdm(total=round(deadline - began), unit="s", desc="placeto search", disable=None,
              leave=False, dynamic_ncols=True) as bar:
        def on_round(found) -> None:
            bar.n = min(round(time.perf_counter() - began), bar.total)
            bar.set_postfix(best_ms=f"{found.step_time_s * 1e3:.4g}", refresh=True)

        best = search.search(problem, starts(), perturbations, seed=seed, deadline=deadline,
                             on_round=on_round, adaptive=True)
    return problem.tie(best.placement)
