"""Round robin: node k (in topological order) goes to the k-th feasible device, cyclically.

Only accelerators take part when the cluster has any; nodes without a kernel on them fall back
to the first device that has one.
"""

import numpy as np

from tfplaceto.baselines.common import accelerator_indices
from tfplaceto.problem import Problem


def place(problem: Problem, seed: int = 0, budget_s: float | None = None) -> np.ndarray:
    del seed, budget_s
    cycle = accelerator_indices(problem)
    device_of = np.empty(problem.num_nodes, np.int32)
    for k, node in enumerate(problem.graph.topo_order):
        device = cycle[k % len(cycle)]
        device_of[node] = device if problem.allowed[node, device] else problem.allowed[node].argmax()
    return problem.tie(device_of)
