"""Ablation of the Placeto placer on the benchmark graphs: what does each part contribute?

For every (graph, cluster) of the bench table, side by side in one run, each with the same wall
time (`local_search`'s default budget, SEARCH_BUDGET_S = 10 s):
- local_search: hill climbing from the best fast baseline (the yardstick of issue 4);
- placeto: `tp.place(method="placeto")`, the shipped policy zero-shot: the search
  (`tfplaceto.search`) from the best fast baseline and the policy's own placements, perturbing
  by sampled policy episodes and random moves;
- untrained: the same placer with freshly initialized weights of the shipped configuration
  (`policy="untrained"`): what training adds is the difference;
- random moves: the same search from the best fast baseline alone, every perturbation a random
  move (`search.random_window_moves`: WINDOW consecutive classes to random allowed devices): what
  the policy adds over plain iterated local search.
Figures: simulated step time (ms) per method, and per method the rows where it is strictly better
than local_search and than every fast baseline.

The variants are built through the public search API (`tfplaceto.search`, `tfplaceto.placeto`).

Run: .venv/bin/python benchmarks/ablation.py [--graphs inception_v3,nmt_4l,nasnet]
     [--clusters 2xK80,4xK80,4xV100,8xV100] [--out ablation.json]
"""

from __future__ import annotations

import argparse
import json
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

from tfplaceto.problem import Problem  # noqa: E402

VARIANTS = ("local_search", "placeto", "untrained", "random moves")


def baseline_times(problem: Problem) -> dict[str, tuple[float, bool]]:
    """method -> (simulated step time, OOM) of every fast baseline."""
    from tfplaceto.baselines import COMPARED_BASELINES, run

    simulator = problem.simulator()
    return {m: tuple(simulator.run(run(m, problem))[::2]) for m in COMPARED_BASELINES}


def run_variant(variant: str, problem: Problem, seed: int) -> np.ndarray:
    from tfplaceto import baselines, placeto, search

    if variant == "local_search":
        return baselines.run("local_search", problem, seed=seed)
    if variant == "placeto":
        return placeto.place(problem, seed=seed)
    if variant == "untrained":
        return placeto.place(problem, seed=seed, policy="untrained")
    deadline = time.perf_counter() + search.BUDGET_S
    start = search.best_baseline(problem, seed).placement
    found = search.search(problem, [start], [(search.random_window_moves(problem), placeto.POLICY_PERTURBATIONS
                                              + placeto.RANDOM_PERTURBATIONS)], seed=seed, deadline=deadline)
    return found.placement


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", default="inception_v3,nmt_4l,nasnet")
    parser.add_argument("--clusters", default="2xK80,4xK80,4xV100,8xV100")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="ablation.json")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from tfplaceto.cluster import as_cluster
    from tfplaceto.costs import profile
    from tfplaceto.graph import import_graph
    from tfplaceto.problem import make_problem

    rows = []
    print(f"{'graph':14} {'cluster':7} {'baseline':>9}" + "".join(f"{v:>14}" for v in VARIANTS)
          + "   (simulated ms; wall s in brackets)")
    for graph in args.graphs.split(","):
        op_graph = import_graph(f"builtin:{graph}")
        for cluster_name in args.clusters.split(","):
            cluster = as_cluster(cluster_name)
            problem = make_problem(op_graph, cluster, profile(op_graph, cluster))
            simulator = problem.simulator()
            times = baseline_times(problem)
            row = {"graph": graph, "cluster": cluster_name, "baselines": times, "variants": {}}
            cells = []
            for variant in VARIANTS:
                start = time.perf_counter()
                device_of = run_variant(variant, problem, args.seed)
                wall = time.perf_counter() - start
                step, _, oom = simulator.run(device_of)
                row["variants"][variant] = {"step_time_s": float(step), "oom": bool(oom), "wall_s": wall}
                cells.append(f"{step * 1e3:8.2f}{'!' if oom else ' '}({wall:3.0f})")
            best_fast = min(t for t, oom in times.values() if not oom)
            rows.append(row)
            print(f"{graph:14} {cluster_name:7} {best_fast * 1e3:9.2f}" + "".join(f"{c:>14}" for c in cells),
                  flush=True)
            with open(args.out, "w") as f:
                json.dump({"rows": rows, "summary": summarize(rows)}, f, indent=1)
    print(json.dumps(summarize(rows), indent=1))


def summarize(rows: list[dict]) -> dict:
    """Per variant: rows strictly better than local_search / than every fast baseline and
    local_search; its mean ratio to local_search; its largest gain over the best of all baselines."""
    summary = {"rows": len(rows)}
    for variant in VARIANTS[1:]:
        better_ls, better_all, ratios, gains = 0, 0, [], []
        for row in rows:
            mine = row["variants"][variant]["step_time_s"]
            yardstick = row["variants"]["local_search"]["step_time_s"]
            best_other = min([yardstick] + [t for t, oom in row["baselines"].values() if not oom])
            better_ls += mine < yardstick * (1 - 1e-9)
            better_all += mine < best_other * (1 - 1e-9)
            ratios.append(mine / yardstick)
            gains.append(1 - mine / best_other)
        summary[variant] = {"better_than_local_search": int(better_ls),
                            "better_than_every_baseline": int(better_all),
                            "mean_ratio_to_local_search": float(np.mean(ratios)),
                            "largest_gain_over_every_baseline": float(np.max(gains))}
    return summary


if __name__ == "__main__":
    main()
