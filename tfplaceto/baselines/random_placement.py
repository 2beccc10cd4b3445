"""Random: every node on a uniformly random feasible accelerator (seeded)."""

import numpy as np

from tfplaceto.baselines.common import candidate_devices
from tfplaceto.problem import Problem


def place(problem: Problem, seed: int = 0, budget_s: float | None = None) -> np.ndarray:
    del budget_s
    rng = np.random.default_rng(seed)
    scores = rng.random(problem.allowed.shape) * candidate_devices(problem)
    return problem.tie(scores.argmax(1).astype(np.int32))
