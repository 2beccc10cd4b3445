"""Learning: how fast Placeto reaches the best baseline on Inception-V3 and NMT (4 layers), 4xV100.

For each graph (built-in training step, analytical costs, grouped as `tp.place` groups it):
1. Baselines: every fast baseline `tp.optimize` compares; the best one is the bar.
2. Learning curves, `--minutes` of wall time each, best simulated step time against episodes and
   wall seconds: (a) from scratch (fresh weights, no lookahead prior: pure REINFORCE), (b) from
   the shipped policy. Episodes start from the single-device and random placements (not from the
   best baseline), so the curves measure what the policy learns, not where it starts.
   Reported: episodes and minutes until the best step time reaches the best baseline, and until
   it is within 5% of it. `--minutes 0` skips the curves.
3. The placer as users call it: `tp.place(..., method="placeto", budget_s=--placer-minutes * 60)`
   (shipped policy, search from the best baseline, fine-tuning, search: tfplaceto/policy/placer.py)
   and zero-shot (`budget_s` None): target, with at most 10 minutes on these 2 cores, match or beat
   the best baseline. local_search (10 s) is shown beside them as the stricter yardstick.

Writes a JSON of everything (--out), a PNG of the curves (--plot) and a table on stdout.

Run: .venv/bin/python benchmarks/learning.py [--graphs inception_v3,nmt_4l] [--cluster 4xV100]
     [--minutes 5] [--placer-minutes 10] [--out learning.json] [--plot learning.png]
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

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout without an install
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfplaceto import baselines  # noqa: E402
from tfplaceto.place import COMPARED_BASELINES  # noqa: E402
from tfplaceto.problem import Problem  # noqa: E402


def build_problem(graph: str, cluster: str) -> Problem:
    """The grouped Problem of built-in `graph` on `cluster`, with analytical costs."""
    import tfplaceto as tp
    from tfplaceto.problem import make_problem

    op_graph = tp.import_graph(f"builtin:{graph}")
    return make_problem(op_graph, tp.Cluster.preset(cluster), tp.profile(op_graph, cluster))


def baseline_times(problem: Problem) -> dict[str, tuple[float, bool]]:
    """method -> (simulated step time, OOM) for every available compared baseline."""
    simulator = problem.simulator()
    times = {}
    for method in COMPARED_BASELINES:
        if method in baselines.available():
            step_time, _, oom = simulator.run(baselines.run(method, problem))
            times[method] = (float(step_time), bool(oom))
    return times


def best_baseline(times: dict[str, tuple[float, bool]]) -> tuple[str, float]:
    method = min(times, key=lambda m: (times[m][1], times[m][0]))
    return method, times[method][0]


def first_reaching(history: list[dict], target: float) -> dict | None:
    """The first history entry whose best step time is <= target (None if never)."""
    for entry in history:
        if entry["best_step_time_s"] <= target * (1 + 1e-9):
            return {"episode": entry["episode"], "minutes": entry["wall_s"] / 60}
    return None


def curve(problem: Problem, minutes: float, network, seed: int) -> dict:
    from tfplaceto.rl.train import train

    result = train(problem, episodes=10**9, seed=seed, budget_s=minutes * 60,
                   initial=("single", "random"), network=network, progress=False)
    history = [{"episode": h["episode"], "wall_s": h["wall_s"], "best_step_time_s": h["best_step_time_s"],
                "step_time_s": h["step_time_s"]} for h in result.history]
    return {"episodes": result.episodes, "wall_s": result.wall_s,
            "best_step_time_s": result.best[0].step_time_s, "history": history}


def run_graph(graph: str, cluster: str, minutes: float, placer_minutes: float, seed: int) -> dict:
    from tfplaceto.policy import placer
    from tfplaceto.policy.network import PlacetoNetwork

    start = time.perf_counter()
    problem = build_problem(graph, cluster)
    print(f"{graph}: {problem.num_nodes} groups of {problem.grouping.op_graph.num_ops if problem.grouping else problem.num_nodes} ops, "
          f"built in {time.perf_counter() - start:.0f} s", flush=True)
    times = baseline_times(problem)
    method, bar = best_baseline(times)
    row = {"graph": graph, "cluster": cluster, "nodes": problem.num_nodes, "baselines": times,
           "best_baseline": method, "best_baseline_s": bar, "curves": {}}
    runs = {"scratch": lambda: PlacetoNetwork(seed=seed, lookahead_prior=0.0),
            "shipped": placer.load_policy}
    for name, make_network in runs.items() if minutes > 0 else ():
        network = make_network()
        if network is None:
            row["curves"][name] = None
            warnings.warn("no shipped policy: skipping the 'shipped' curve", stacklevel=1)
            continue
        result = curve(problem, minutes, network, seed)
        result["reach_best_baseline"] = first_reaching(result["history"], bar)
        result["reach_within_5pct"] = first_reaching(result["history"], bar * 1.05)
        row["curves"][name] = result
        print(f"  {name}: {result['episodes']} episodes in {result['wall_s'] / 60:.1f} min, best "
              f"{result['best_step_time_s'] * 1e3:.3f} ms (best baseline {method} {bar * 1e3:.3f} ms); "
              f"reached it: {result['reach_best_baseline']}; within 5%: {result['reach_within_5pct']}",
              flush=True)
    if placer_minutes > 0:
        start = time.perf_counter()
        device_of = placer.place(problem, seed=seed, budget_s=placer_minutes * 60)
        step_time, _, oom = problem.simulator().run(device_of)
        row["placer"] = {"budget_s": placer_minutes * 60, "wall_s": time.perf_counter() - start,
                         "step_time_s": float(step_time), "oom": bool(oom),
                         "vs_best_baseline": float(step_time) / bar}
        print(f"  placer (shipped + {placer_minutes:g} min fine-tuning): {step_time * 1e3:.3f} ms, "
              f"{step_time / bar:.3f}x the best baseline", flush=True)
    zero_shot = placer.place(problem, seed=seed)
    row["zero_shot_s"] = float(problem.simulator().run(zero_shot)[0])
    row["local_search_s"] = float(problem.simulator().run(baselines.run("local_search", problem, seed=seed))[0])
    return row


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), 2, figsize=(11, 3.6 * len(rows)), squeeze=False)
    for row, (by_episode, by_time) in zip(rows, axes):
        for name, result in row["curves"].items():
            if not result or not result["history"]:
                continue
            episodes = [h["episode"] for h in result["history"]]
            minutes = [h["wall_s"] / 60 for h in result["history"]]
            best = [h["best_step_time_s"] * 1e3 for h in result["history"]]
            by_episode.plot(episodes, best, label=name)
            by_time.plot(minutes, best, label=name)
        for axis, label in ((by_episode, "episodes"), (by_time, "wall minutes")):
            axis.axhline(row["best_baseline_s"] * 1e3, color="k", linestyle="--",
                         label=f"best baseline ({row['best_baseline']})")
            axis.set_xlabel(label)
            axis.set_ylabel("best step time (ms)")
            axis.set_title(f"{row['graph']} on {row['cluster']}")
            axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", default="inception_v3,nmt_4l")
    parser.add_argument("--cluster", default="4xV100")
    parser.add_argument("--minutes", type=float, default=5.0, help="wall minutes per learning curve")
    parser.add_argument("--placer-minutes", type=float, default=10.0, help="placer fine-tuning budget")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="learning.json")
    parser.add_argument("--plot", default="learning.png")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    rows = []
    for graph in args.graphs.split(","):
        rows.append(run_graph(graph, args.cluster, args.minutes, args.placer_minutes, args.seed))
        with open(args.out, "w") as f:
            json.dump(rows, f)
    if args.plot:
        plot(rows, args.plot)
    print(f"\n{'graph':14} {'best baseline':>22} {'local_search':>12} {'zero-shot':>10} {'placer+ft':>10} "
          f"{'scratch best':>13} {'shipped best':>13} {'scratch reach':>14} {'shipped reach':>14}")
    for row in rows:
        curves = row["curves"]

        def cell(name, curves=curves):
            result = curves.get(name)
            return f"{result['best_step_time_s'] * 1e3:.3f}" if result else "-"

        def reach(name, curves=curves):
            result = curves.get(name)
            hit = result and result["reach_best_baseline"]
            return f"{hit['episode']}ep/{hit['minutes']:.1f}m" if hit else "never"

        placed = row.get("placer")
        print(f"{row['graph']:14} {row['best_baseline']:>10} {row['best_baseline_s'] * 1e3:9.3f}ms "
              f"{row['local_search_s'] * 1e3:12.3f} {row['zero_shot_s'] * 1e3:10.3f} {placed['step_time_s'] * 1e3 if placed else float('nan'):10.3f} "
              f"{cell('scratch'):>13} {cell('shipped'):>13} {reach('scratch'):>14} {reach('shipped'):>14}")
    print(f"(ms of simulated step time; JSON: {args.out}; curves: {args.plot})")


if __name__ == "__main__":
    main()
