"""The search `method="placeto"` runs: climbing on the simulator and iterated perturbation.

It knows nothing of the policy: perturbations are plain functions, so the placer (`placeto.py`)
perturbs with policy episodes and the benchmarks build their variants (random moves only,
untrained weights) through the same calls. Map of the file:

  Perturbation         (rng, placement, count) -> `count` perturbed placements.
  block_moves          moves of runs of consecutive tie classes to one device (a layer at once).
  prepare_neighbourhoods  the moves every climb tries (single classes, blocks), prepared once.
  polish               hill climbing over single-class and block moves to a local optimum.
  best_baseline        the best fast baseline (by simulated (OOM, step time)): a `Best`.
  climbed_baseline     the same, climbed to a local optimum (`polish`): training's teachers.
  classes_in_order     the nodes of each tie class, classes in topological order.
  random_window_moves  a Perturbation: `window` consecutive classes sent to random devices.
  improve              iterated local search from a `Best`: each round perturbs the best
                       placement with every perturbation, climbs each result, keeps the best;
                       `adaptive`: the draws shared among the perturbations by the share of
                       each one's draws that improved the best (Thompson sampling).
  search               starts (each climbed in turn) + improve until a deadline or until one
                       perturbation has had `patience` rounds' worth of idle climbs.
                       The starts may be produced lazily (any iterable, a generator): each is
                       offered (and climbed) before the next is asked for, and none is asked
                       for after the deadline but the first, so a costly start (a policy's
                       episode) costs nothing when the time is gone.

Every placement evaluated is a candidate; the answer is the best, so the search is never worse
than its starts. Deterministic given `seed` when it stops by patience; a search cut by the
deadline depends on the machine's speed (like `local_search`'s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from tfplaceto.baselines import common, local_search, starting_placements
from tfplaceto.problem import Best, Problem

Perturbation = Callable[[np.random.Generator, np.ndarray, int], list[np.ndarray]]
BUDGET_S = local_search.DEFAULT_BUDGET_S  # the default search time: local_search's, to compare
BLOCK_SIZES = (2, 4, 8, 16, 32)  # consecutive tie classes a block move sends to one device
WINDOW = 8  # classes re-placed by one perturbation
PATIENCE = 8  # rounds' worth of climbs without improvement that end the search (`improve`)


def block_moves(problem: Problem, inst=None) -> local_search.Moves:
    """Moves of runs of consecutive tie classes (by their first op's topological position), of
    BLOCK_SIZES classes overlapping by half, each run to one device.

    A layer, or a stage of a pipeline, is several tie classes: hill climbing over single-class
    moves cannot move it when every class moved alone makes the step slower (it adds transfers
    both ways) while moving all of them together makes it faster.
    """
    inst = inst or common.prepare(problem)
    classes = _class_order(inst)
    blocks = [classes[i:i + size] for size in BLOCK_SIZES if size < len(classes)
              for i in range(0, len(classes) - size // 2, size // 2)]
    return local_search.class_moves(inst, blocks)


def prepare_neighbourhoods(problem: Problem):
    """(inst, single-class moves, block moves) of `problem`: what every climb tries."""
    inst = common.prepare(problem)
    return inst, local_search.class_moves(inst), block_moves(problem, inst)


def polish(problem: Problem, placement: np.ndarray, rng: np.random.Generator,
           deadline: float = float("inf"), neighbourhoods=None) -> np.ndarray:
    """`placement` hill-climbed to a local optimum of single-class and block moves in turn (or
    to the deadline). `neighbourhoods`: `prepare_neighbourhoods(problem)`, made when not given."""
    inst, singles, blocks = neighbourhoods or prepare_neighbourhoods(problem)
    current = placement
    while time.perf_counter() < deadline:
        current = local_search.climb(problem, current, rng, deadline, inst, singles)
        moved = local_search.climb(problem, current, rng, deadline, inst, blocks)
        if np.array_equal(moved, current):
            break
        current = moved
    return current


def offer(problem: Problem, best: Best, placement: np.ndarray) -> None:
    """Simulates `placement` and offers it to `best`."""
    step_time, _, oom = problem.simulator().run(placement)
    best.offer(step_time, oom, placement)


def best_baseline(problem: Problem, seed: int = 0) -> Best:
    """The best of the fast baselines (`COMPARED_BASELINES`) by simulated (OOM, step time)."""
    best = Best()
    for placement in starting_placements(problem, seed).values():
        offer(problem, best, placement)
    return best


def climbed_baseline(problem: Problem, seed: int = 0, baseline: Best | None = None) -> Best:
    """The best fast baseline (`baseline`, when already found) hill-climbed to a local optimum
    (`polish`, no deadline: the same placement on any machine), or the baseline itself when the
    climb finds nothing better. A new Best: `baseline` is left as it is."""
    baseline = baseline or best_baseline(problem, seed)
    best = Best()
    best.offer(baseline.step_time_s, baseline.oom, baseline.placement)
    offer(problem, best, polish(problem, baseline.placement, np.random.default_rng(seed)))
    return best


def _class_order(inst) -> np.ndarray:
    """The tie classes of `inst` (a `common.Instance`) by the topological position of their first
    node (a class's members are in topological order)."""
    position = np.empty(inst.num_nodes, np.int64)
    position[inst.order] = np.arange(inst.num_nodes)
    return np.argsort(position[inst.class_members[inst.class_ptr[:-1]]], kind="stable")


def classes_in_order(problem: Problem) -> list[np.ndarray]:
    """The nodes of each tie class, the classes in topological order (of their first node)."""
    inst = common.prepare(problem)
    return [inst.members(c) for c in _class_order(inst)]


def random_window_moves(problem: Problem, window: int = WINDOW) -> Perturbation:
    """A Perturbation: `window` consecutive classes (in topological order, at a random position)
    moved to random allowed devices."""
    members = classes_in_order(problem)
    allowed = [np.flatnonzero(problem.allowed[m[0]]) for m in members]

    def perturb(rng: np.random.Generator, placement: np.ndarray, count: int) -> list[np.ndarray]:
        moved_all = []
        for _ in range(count):
            moved = placement.copy()
            begin = int(rng.integers(max(len(members) - window, 0) + 1))
            for step in range(begin, min(begin + window, len(members))):
                moved[members[step]] = rng.choice(allowed[step])
            moved_all.append(moved)
        return moved_all

    return perturb


def improve(problem: Problem, best: Best, perturbations: Sequence[tuple[Perturbation, int]],
            seed: int = 0, deadline: float = float("inf"), patience: int = PATIENCE,
            on_round: Callable[[Best], None] | None = None, neighbourhoods=None,
            adaptive: bool = False) -> Best:
    """Iterated local search from `best.placement` (a `Best`, updated and returned).

    Each round draws `count` perturbed placements of the best from each (perturbation, count),
    climbs each (`polish`; not one that left the best as it was, as a policy's re-placement
    sometimes does) and keeps the best seen. Ends at `deadline`, or once one perturbation has had
    `patience` rounds' worth of climbs (`patience` times the counts' sum) since the best last
    improved; `on_round(best)` is called after every round.
    - Climbs, not rounds: a draw that left the best as it was costs no climb, and counted by
      rounds, a search whose policy returns many such draws would give up sooner, in climbs and
      in seconds, than one of random moves (on cifar10-cells/101 at 8 of its 10 s:
      docs/RESULTS.md, session 43). A search whose draws never change the best still ends, after
      as many rounds.
    - One perturbation's climbs, not all of them: counted together, a second perturbation's
      idle climbs used up the first one's patience, so a search of random moves and policy
      windows gave up after fewer climbs of random moves than the search of random moves alone
      makes (docs/RESULTS.md, session 45). A search of one perturbation ends as before, and
      every search ends no sooner than before: a search the old count cut by its deadline runs
      the same.

    `adaptive`: after a first round as the counts say, each round's draws (the counts' sum) are
    shared among the perturbations by Thompson sampling (`_shares`) on the share of each one's
    draws that improved the best. Why: what a source is worth depends on the problem (a
    policy's re-placements find basins random moves miss on one graph, and climb back to the
    best they started from on another), so fixed counts pay for the worse source on every
    problem. Draws, not seconds: a draw's cost is mostly its climb, whatever its source (a
    policy's pair of window episodes is ~0.05 s, a climb 0.1-2 s), and counted draws keep the
    search deterministic given `seed` when it ends by patience.
    """
    rng = np.random.default_rng(seed)
    neighbourhoods = neighbourhoods or prepare_neighbourhoods(problem)
    counts = np.array([count for _, count in perturbations])
    draws, gains = np.zeros(len(counts)), np.zeros(len(counts))
    idle = patience * int(counts.sum())  # one source's climbs (or rounds) without improvement that end it
    idle_climbs, idle_rounds = np.zeros(len(counts), np.int64), 0
    while idle_climbs.max() < idle and idle_rounds < idle and time.perf_counter() < deadline:
        before = (best.oom, best.step_time_s)
        if adaptive and draws.all():  # every source tried
            counts = _shares(rng, draws, gains, counts.sum())
        for source, ((perturb, _), count) in enumerate(zip(perturbations, counts)):
            draws[source] += count  # as asked: a source that returns fewer (a policy not begun) failed
            for moved in perturb(rng, best.placement, count) if count else ():
                if time.perf_counter() >= deadline:
                    break
                if np.array_equal(moved, best.placement):
                    continue  # the best, already climbed: its climb would find nothing
                was = (best.oom, best.step_time_s)
                offer(problem, best, moved)
                offer(problem, best, polish(problem, moved, rng, deadline, neighbourhoods))
                gains[source] += (best.oom, best.step_time_s) < was
                idle_climbs[source] += 1
        if (best.oom, best.step_time_s) < before:
            idle_climbs[:], idle_rounds = 0, 0
        else:
            idle_rounds += 1
        if on_round is not None:
            on_round(best)
    return best


def _shares(rng: np.random.Generator, draws: np.ndarray, gains: np.ndarray, total: int) -> np.ndarray:
    """How many of `total` draws each source gets (Thompson sampling): for each draw, every
    source's chance of improving the best is sampled from its Beta posterior (uniform prior,
    `gains` in `draws`); the draw goes to the highest. A source that has not helped yet keeps a
    chance, shrinking as its failures add up."""
    chance = rng.beta(gains[:, None] + 1, draws[:, None] - gains[:, None] + 1, (len(draws), total))
    return np.bincount(chance.argmax(axis=0), minlength=len(draws))


def search(problem: Problem, starts: Iterable[np.ndarray], perturbations: Sequence[tuple[Perturbation, int]],
           seed: int = 0, deadline: float = float("inf"), patience: int = PATIENCE,
           on_round: Callable[[Best], None] | None = None, adaptive: bool = False) -> Best:
    """The best placement found from `starts` by `improve` with `perturbations` (`adaptive`: as
    `improve` says).

    `starts` (at least one) is consumed one at a time: each start is offered and climbed before
    the next is asked for; once the deadline has passed no further start is asked for (the first
    always is, so the answer is never worse than it).

    Every start is climbed, one that begins worse than the first too: where a start begins says
    little about the optimum its climb reaches. On NMT-4l the shipped policy's own placement
    begins 4-17% slower than the best baseline, and in one climb each reached 1330 ms against the
    baseline's 1386 on 2xK80, 306 against 317 on 4xV100. Climbing only the starts that began
    better (sessions 16-48) threw that away; over 144 row-seeds the shipped policy's search gains
    0.0010 of local_search's step time by climbing every start, untrained weights' loses 0.0008
    (docs/RESULTS.md, session 49). A worse start's climb can take the rest of the time on a
    large graph: the deadline bounds it.
    """
    rng = np.random.default_rng(seed)
    neighbourhoods = prepare_neighbourhoods(problem)
    best = Best()
    for placement in starts:
        offer(problem, best, placement)
        offer(problem, best, polish(problem, placement, rng, deadline, neighbourhoods))
        if time.perf_counter() >= deadline:
            break  # before the iterable makes its next start
    return improve(problem, best, perturbations, seed, deadline, patience, on_round, neighbourhoods, adaptive)
