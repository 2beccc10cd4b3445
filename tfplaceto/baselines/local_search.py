"""Local search: greedy hill climbing on the simulator, from the best of the other baselines.

Start: the placements of every other fast baseline (`COMPARED_BASELINES`, cheapest first; those
that raise UnplaceableError are skipped, and so are the rest once half the budget is spent), each
simulated; the best (no OOM first, then least overflow, then step time) is the start. Moves: one
tie class (a colocation class, or a single node) to another device it is allowed on. Visit order:
a seeded random permutation of all (class, device) moves; the first move that improves is taken
(first improvement) and the walk continues with the next move in the order. A pass over every
move without an improvement ends the search, as does the time budget (default 10 s, counted
from the call, start placements included). Only strict improvements are accepted, so the result
is never worse than the start.

Moves are simulated in batches (`Simulator.run_batch`), in visit order, keeping the first
improving one: the same walk as one-at-a-time evaluation, at a fraction of the call overhead. The
batch starts small after an accepted move (improvements tend to come in runs, and the rest of a
batch after the first improving move is wasted) and doubles up to BATCH while none improves.
Deterministic given the seed as long as the search converges within the budget (the budget is
wall-clock time, so a search it cuts short, or a start it skips, may differ on a slower machine).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from tfplaceto import baselines, errors
from tfplaceto.baselines import common
from tfplaceto.problem import Problem

DEFAULT_BUDGET_S = 10.0
# The fast baselines (COMPARED_BASELINES), cheapest first: later ones are skipped once half the
# budget is spent.
START_METHODS = ("single", "round_robin", "expert", "m_topo", "metis", "heft", "m_etf", "m_sct")
BATCH = 64
FIRST_BATCH = 4
# A move must shorten the step by more than this fraction: float noise does not count.
MIN_GAIN = 1e-9


def place(problem: Problem, seed: int = 0, budget_s: float | None = None) -> np.ndarray:
    began = time.perf_counter()
    deadline = began + (DEFAULT_BUDGET_S if budget_s is None else float(budget_s))
    inst = common.prepare(problem)
    common.check_persistent_fits(problem, inst)
    simulator = problem.simulator()

    best, best_score = None, None
    for method in START_METHODS:
        if best is not None and time.perf_counter() - began > (deadline - began) / 2:
            break
        try:
            candidate = baselines.run(method, problem, seed=seed)
        except errors.UnplaceableError:  # a greedy placer found no room; the others may
            continue
        score = _score(simulator.run(candidate), inst.memory)
        if best is None or score < best_score:
            best, best_score = candidate, score
    return climb(problem, best, np.random.default_rng(seed), deadline, inst)


def _score(run: tuple, memory: np.ndarray) -> tuple[bool, float, float]:
    """(out of memory, bytes over the limits, step time): smaller is better."""
    step_time, peak, oom = run
    return bool(oom), float(np.maximum(peak - memory, 0).sum()), float(step_time)


def _better(score: tuple, than: tuple) -> bool:
    if score[:2] != than[:2]:
        return score[:2] < than[:2]
    return score[2] < than[2] * (1 - MIN_GAIN)


@dataclasses.dataclass(frozen=True)
class Moves:
    """Moves of a hill climb: move m sends `nodes[m]` (one or more tie classes) to `device[m]`."""

    nodes: list[np.ndarray]
    device: np.ndarray


def class_moves(inst: common.Instance, blocks=None) -> Moves:
    """A move per (block, device) where some class of the block is allowed on the device.

    `blocks`: sequences of tie class ids moved together; default: every class alone (the
    single-class moves of local_search), in class order, devices ascending.
    """
    first = inst.class_members[inst.class_ptr[:-1]]
    blocks = [[c] for c in range(inst.num_classes)] if blocks is None else blocks
    nodes, device = [], []
    for block in blocks:
        for d in range(inst.num_devices):
            movable = [inst.members(c) for c in block if inst.allowed[first[c], d]]
            if movable:
                nodes.append(np.concatenate(movable))
                device.append(d)
    return Moves(nodes, np.asarray(device, np.int32))


def climb(problem: Problem, start: np.ndarray, rng: np.random.Generator, deadline: float,
          inst: common.Instance | None = None, moves: Moves | None = None) -> np.ndarray:
    """First-improvement hill climbing from `start` until a local optimum or `deadline` (a
    time.perf_counter() value); never worse than `start`.

    `inst` is `common.prepare(problem)`, computed here when not given. `moves`: the
    neighbourhood, by default `class_moves(inst)` (one tie class to another device).
    """
    inst = inst or common.prepare(problem)
    moves = class_moves(inst) if moves is None else moves
    simulator = problem.simulator()
    current = np.asarray(start, np.int32).copy()
    score = _score(simulator.run(current), inst.memory)

    def moving(candidates: np.ndarray) -> np.ndarray:  # drop moves that change nothing now
        keep = [bool((current[moves.nodes[m]] != moves.device[m]).any()) for m in candidates]
        return candidates[np.asarray(keep, bool)]

    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        order = moving(rng.permutation(len(moves.device)))
        k, size = 0, FIRST_BATCH
        while k < len(order) and time.perf_counter() < deadline:
            # A move may have become a no-op after an earlier accepted move: skip those.
            chunk = moving(order[k:k + size])
            if len(chunk) == 0:
                k += size
                continue
            batch = np.repeat(current[None, :], len(chunk), axis=0)
            for row, m in enumerate(chunk):
                batch[row, moves.nodes[m]] = moves.device[m]
            steps, peaks, ooms = simulator.run_batch(batch)
            accepted = -1
            for row in range(len(chunk)):
                candidate = _score((steps[row], peaks[row], ooms[row]), inst.memory)
                if _better(candidate, score):
                    accepted, score = row, candidate
                    break
            if accepted < 0:
                k += size
                size = min(2 * size, BATCH)
                continue
            current = batch[accepted].copy()
            improved = True
            # Continue the walk right after the accepted move.
            k += int(np.flatnonzero(order[k:k + size] == chunk[accepted])[0]) + 1
            size = FIRST_BATCH
    return current
