"""Does `method="placeto"` keep to its time? Wall seconds of the search against its budget.

For each (graph, cluster), the problem is built first (import, costs, grouping: outside any
budget), then `tfplaceto.placeto.place` (the search `tp.place(method="placeto")` runs, with the
shipped policy) is timed from its call to its return, with the default budget (`search.BUDGET_S`,
10 s) or `--budget-s`. Printed per row: the budget, the wall time, the overrun (wall - budget;
what the search took beyond its time), and the simulated step time of its answer. The policy is
loaded inside the timed call, as a user's call loads it; graphs run in the order given, so the
first one also pays what a process pays once (numba's cache, TensorFlow's first traces).

    python benchmarks/search_budget.py [--graphs nmt_4l nasnet cifar10-cells/100] [--clusters 4xK80 4xV100]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", nargs="+", default=["nmt_4l", "nasnet", "cifar10-cells/100"])
    parser.add_argument("--clusters", nargs="+", default=["4xK80", "4xV100"])
    parser.add_argument("--budget-s", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from tfplaceto import placeto, search
    from tfplaceto.cluster import as_cluster
    from tfplaceto.costs import profile
    from tfplaceto.graph import import_graph
    from tfplaceto.problem import make_problem

    budget = max(args.budget_s or 0.0, search.BUDGET_S)  # what placeto.place allows itself
    print(f"{'graph':<20} {'cluster':<7} {'budget s':>9} {'wall s':>8} {'overrun s':>10} {'step ms':>10}")
    overruns = []
    for graph in args.graphs:
        op_graph = import_graph(f"builtin:{graph}")
        for name in args.clusters:
            cluster = as_cluster(name)
            problem = make_problem(op_graph, cluster, profile(op_graph, cluster))
            began = time.perf_counter()
            placement = placeto.place(problem, seed=args.seed, budget_s=args.budget_s)
            wall = time.perf_counter() - began
            overruns.append(wall - budget)
            step = problem.simulator().run(placement)[0]
            print(f"{graph:<20} {name:<7} {budget:9.1f} {wall:8.2f} {wall - budget:10.2f} {step * 1e3:10.3f}",
                  flush=True)
    print(f"{len(overruns)} rows; largest overrun {max(overruns):.2f} s, mean {sum(overruns) / len(overruns):.2f} s")


if __name__ == "__main__":
    main()
