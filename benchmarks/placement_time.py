"""How long each baseline takes to place the Inception-V3 training graph, and how good it is.

The graph is the built-in Inception-V3 training step (batch 32: forward, backward, RMSProp update),
profiled with analytical costs for the 8xV100 preset (8 GPUs + host CPU), made into a Problem by
`tfplaceto.problem.make_problem` (grouped to at most 256 groups, as `tp.place` does). Every
available baseline places it; the table gives the seconds to place (wall clock, and CPU time of
this process: benchmarks share the machine), the simulated step time, its ratio to
`tfplaceto.lower_bound`, and whether the simulator reports OOM. Target: every method under 30 s.

`--op-level` also places the ungrouped op graph (~5,500 ops), the largest problem a placer meets
when `make_problem` is told not to group. When the built-in model is not available, a Keras
InceptionV3 (weights=None) compiled with SGD and sparse categorical cross-entropy is imported.

Run: .venv/bin/python benchmarks/placement_time.py [--cluster 8xV100] [--op-level]
     [--methods m_etf,heft] [--budget-s 10] [--graph builtin:inception_v3]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
import warnings

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout without an install
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tfplaceto  # noqa: E402
from tfplaceto import baselines, errors  # noqa: E402
from tfplaceto.cluster import Cluster  # noqa: E402
from tfplaceto.problem import Problem, make_problem  # noqa: E402

TARGET_S = 30.0


def bench(problem: Problem, methods: list[str], lower_bound: float, budget_s: float) -> list[tuple]:
    """(method, wall s, cpu s, step s, ratio, oom, note) for each method."""
    simulator = problem.simulator()
    simulator.run(np.zeros(problem.num_nodes, np.int32))  # compile/load the kernel outside timing
    rows = []
    for method in methods:
        cpu, wall = time.process_time(), time.perf_counter()
        note = ""
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                device_of = baselines.run(method, problem, seed=0,
                                          budget_s=budget_s if method == "local_search" else None)
            note = "; ".join(str(w.message) for w in caught)[:60]
        except errors.UnplaceableError as error:
            rows.append((method, time.perf_counter() - wall, time.process_time() - cpu,
                         float("nan"), float("nan"), False, f"unplaceable: {error}"[:60]))
            continue
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        step, _, oom = simulator.run(device_of)
        used = len(np.unique(device_of))
        rows.append((method, wall, cpu, step, step / lower_bound, oom,
                     note or f"{used} device{'s' * (used > 1)}"))
    return rows


def print_table(title: str, rows: list[tuple]) -> None:
    print(f"\n{title}")
    print(f"{'method':<14}{'place s':>9}{'cpu s':>8}{'step ms':>10}{'ratio':>8}  {'oom':<5} note")
    for method, wall, cpu, step, ratio, oom, note in rows:
        flag = "" if wall < TARGET_S else "  > target"
        print(f"{method:<14}{wall:9.2f}{cpu:8.2f}{step * 1e3:10.3f}{ratio:8.3f}  {str(oom):<5} "
              f"{note}{flag}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="builtin:inception_v3")
    parser.add_argument("--cluster", default="8xV100")
    parser.add_argument("--methods", default=",".join(baselines.METHODS))
    parser.add_argument("--budget-s", type=float, default=10.0, help="local_search budget")
    parser.add_argument("--op-level", action="store_true", help="also place the ungrouped graph")
    args = parser.parse_args()

    began = time.perf_counter()
    op_graph, label = tfplaceto.import_graph(args.graph), args.graph
    cluster = Cluster.preset(args.cluster)
    costs = tfplaceto.profile(op_graph, cluster)
    bound = tfplaceto.lower_bound(op_graph, cluster, costs)
    print(f"{label}: {op_graph.num_ops} ops on {args.cluster} ({cluster.num_devices} devices); "
          f"lower bound {bound * 1e3:.3f} ms; import + profile {time.perf_counter() - began:.1f} s")
    methods = [m for m in args.methods.split(",") if m]

    problem = make_problem(op_graph, cluster, costs)
    levels = [(f"grouped: {problem.num_nodes} groups", problem)]
    if args.op_level:
        levels.append((f"op level: {op_graph.num_ops} ops",
                       make_problem(op_graph, cluster, costs, grouping_threshold=op_graph.num_ops + 1)))
    for title, level_problem in levels:
        classes = np.bincount(np.unique(level_problem.graph.colocation, return_inverse=True)[1])
        print_table(f"{title}, {len(classes)} colocation classes (largest {classes.max()} nodes)",
                    bench(level_problem, methods, bound, args.budget_s))


if __name__ == "__main__":
    main()
