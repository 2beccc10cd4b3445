"""Single device: everything on the fastest device that can run the most compute.

Nodes without a kernel there (CPU-only ops) go to the first device that has one. When the whole
graph does not fit in one device's memory, this is still the answer (the simulator reports OOM):
it is the reference point of "no model parallelism".
"""

import numpy as np

from tfplaceto.problem import Problem


def place(problem: Problem, seed: int = 0, budget_s: float | None = None) -> np.ndarray:
    del seed, budget_s  # deterministic and instant
    feasible_time = np.where(problem.allowed, problem.compute_s, 0.0).sum(0)
    runnable = problem.allowed.sum(0)
    # The device that runs the most nodes, fastest among those.
    best = int(np.lexsort((feasible_time, -runnable))[0])
    device_of = np.where(problem.allowed[:, best], best, problem.allowed.argmax(1))
    return problem.tie(device_of)
