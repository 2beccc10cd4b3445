"""Generalization: a policy trained on a graph family places held-out members zero-shot.

The shipped policy (tfplaceto/policy/pretrained/) was trained on members 0..2 of the
cifar10-cells and ptb-cells families (see tfplaceto/policy/placer.py). Here, held-out members
(default 100..102, never seen in training) of each family are placed on each cluster by:
- every fast baseline (`tfplaceto.place.COMPARED_BASELINES`); the best one and m-ETF are the bars;
- zero-shot: `placer.place(problem)` with the shipped policy, no training on the graph;
- untrained ("prior" column, an ablation): the same search with fresh weights in the shipped
  policy's configuration: what the learned weights add is the difference;
- per-graph policy: a policy trained from scratch on that graph alone for `--per-graph-minutes`
  (same training setup as the shipped policy: `placer.SearchRole`), then the same search with
  it; its result is the best placement seen in training and search. The issue's comparison gives it the family policy's
  whole training time per graph; pass `--per-graph-minutes 20` for that (hours for all rows).
Targets: zero-shot within 5% of the per-graph policy, at least as good as m-ETF; Placeto better
than every baseline on at least half of the (graph, cluster) rows.

Run: .venv/bin/python benchmarks/generalization.py [--families cifar10-cells,ptb-cells]
     [--held-out 100,101,102] [--clusters 2xK80,4xV100,8xV100] [--per-graph-minutes 2]
     [--out generalization.json]
"""

from __future__ import annotations

import argparse
import importlib.util  # noqa: F401  baselines.available() uses importlib.util without importing it
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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from learning import baseline_times, best_baseline  # noqa: E402


def per_graph(problem: Problem, minutes: float, seed: int) -> tuple[float, float]:
    """(step time, wall seconds) of a policy trained on `problem` alone, then searched with."""
    from tfplaceto.policy import placer
    from tfplaceto.rl.train import train

    start = time.perf_counter()
    result = train(problem, episodes=10**9, seed=seed, budget_s=minutes * 60,
                   network=placer.untrained_network(seed), progress=False,
                   **placer.SearchRole(seed).train_kwargs())
    device_of = placer.place(problem, seed=seed, network=result.network)
    searched = float(problem.simulator().run(device_of)[0])
    trained = result.best[0].step_time_s
    return min(searched, trained), time.perf_counter() - start


def run_row(problem: Problem, graph: str, cluster: str, minutes: float, seed: int) -> dict:
    from tfplaceto.policy import placer

    simulator = problem.simulator()
    times = baseline_times(problem)
    method, bar = best_baseline(times)
    start = time.perf_counter()
    zero_shot = float(simulator.run(placer.place(problem, seed=seed))[0])
    zero_shot_wall = time.perf_counter() - start
    prior = float(simulator.run(placer.place(problem, seed=seed, network=placer.untrained_network(seed)))[0])
    row = {"graph": graph, "cluster": cluster, "nodes": problem.num_nodes, "baselines": times,
           "best_baseline": method, "best_baseline_s": bar, "m_etf_s": times.get("m_etf", (None,))[0],
           "zero_shot_s": zero_shot, "zero_shot_wall_s": zero_shot_wall, "prior_only_s": prior}
    if minutes > 0:
        row["per_graph_s"], row["per_graph_wall_s"] = per_graph(problem, minutes, seed)
    return row


def summarize(rows: list[dict]) -> dict:
    def ratios(key, against):
        return [r[key] / r[against] for r in rows if r.get(key) and r.get(against)]

    beats_all = [r["zero_shot_s"] < min(t for t, _ in r["baselines"].values()) * (1 - 1e-9) for r in rows]
    summary = {
        "rows": len(rows),
        "zero_shot_vs_best_baseline_mean": float(np.mean(ratios("zero_shot_s", "best_baseline_s"))),
        "zero_shot_vs_m_etf_mean": float(np.mean(ratios("zero_shot_s", "m_etf_s"))),
        "zero_shot_at_least_m_etf": int(sum(r["zero_shot_s"] <= r["m_etf_s"] * (1 + 1e-9) for r in rows
                                            if r.get("m_etf_s"))),
        "prior_only_vs_best_baseline_mean": float(np.mean(ratios("prior_only_s", "best_baseline_s"))),
        "placeto_beats_every_baseline_rows": int(sum(beats_all)),
    }
    per_graph_ratios = ratios("zero_shot_s", "per_graph_s")
    if per_graph_ratios:
        summary["zero_shot_vs_per_graph_mean"] = float(np.mean(per_graph_ratios))
        summary["zero_shot_vs_per_graph_max"] = float(np.max(per_graph_ratios))
        summary["zero_shot_within_5pct_of_per_graph"] = int(sum(x <= 1.05 for x in per_graph_ratios))
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", default="cifar10-cells,ptb-cells")
    parser.add_argument("--held-out", default="100,101,102")
    parser.add_argument("--clusters", default="2xK80,4xV100,8xV100")
    parser.add_argument("--per-graph-minutes", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="generalization.json")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from tfplaceto.policy import placer
    from tfplaceto.rl.train import family_problems

    if placer.load_policy() is None:
        warnings.warn("no shipped policy: 'zero-shot' uses fresh weights", stacklevel=1)
    clusters = args.clusters.split(",")
    rows = []
    print(f"{'graph':22} {'cluster':7} {'best baseline':>20} {'m_etf':>8} {'zero-shot':>9} "
          f"{'prior':>8} {'per-graph':>9}   (ms)")
    for family in args.families.split(","):
        for member in (int(m) for m in args.held_out.split(",")):
            graph = f"{family}/{member}"
            for problem, cluster in zip(family_problems(family, clusters, 1, first=member), clusters):
                row = run_row(problem, graph, cluster, args.per_graph_minutes, args.seed)
                rows.append(row)
                per_graph_ms = row.get("per_graph_s", float("nan")) * 1e3
                print(f"{graph:22} {cluster:7} {row['best_baseline']:>10} {row['best_baseline_s'] * 1e3:9.3f} "
                      f"{(row['m_etf_s'] or float('nan')) * 1e3:8.3f} {row['zero_shot_s'] * 1e3:9.3f} "
                      f"{row['prior_only_s'] * 1e3:8.3f} {per_graph_ms:9.3f}", flush=True)
                with open(args.out, "w") as f:
                    json.dump({"rows": rows, "summary": summarize(rows)}, f, indent=1)
    print(json.dumps(summarize(rows), indent=1))


if __name__ == "__main__":
    main()
