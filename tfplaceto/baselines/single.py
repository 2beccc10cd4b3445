"""Single device: everything on the fastest accelerator; ops without a kernel there go to the host.

When the whole graph does not fit in one device's memory this is still the answer (the simulator
reports OOM): it is the reference point of "no model parallelism".
"""

import numpy as np

from tfplaceto.baselines.common import accelerator_indices
from tfplaceto.problem import Problem


def place(problem: Problem, seed: int = 0, budget_s: float | None = None) -> np.ndarray:
    del seed, budget_s  # deterministic and instant
    accelerators = accelerator_indices(problem)
    # Fastest accelerator for the work it can run (ties: the first one).
    runnable_time = np.where(problem.allowed, problem.compute_s, 0.0)[:, accelerators].sum(0)
    best = int(accelerators[np.argmin(runnable_time)])
    device_of = np.where(problem.allowed[:, best], best, problem.allowed.argmax(1))
    return problem.tie(device_of)
