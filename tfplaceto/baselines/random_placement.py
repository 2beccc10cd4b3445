"""Random: every node on a uniformly random feasible accelerator (seeded)."""

import numpy as np

from tfplaceto.baselines.round_robin import _accelerator_indices
from tfplaceto.problem import Problem


def place(problem: Problem, seed: int = 0, budget_s: float | None = None) -> np.ndarray:
    del budget_s
    rng = np.random.default_rng(seed)
    candidates = np.zeros_like(problem.allowed)
    candidates[:, _accelerator_indices(problem)] = True
    candidates &= problem.allowed
    candidates[~candidates.any(1)] = problem.allowed[~candidates.any(1)]
    scores = rng.random(problem.allowed.shape) * candidates
    return problem.tie(scores.argmax(1).astype(np.int32))
