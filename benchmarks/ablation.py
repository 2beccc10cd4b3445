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

With `--held-out 100,101`, rows of those held-out members of the built-in families
(`--held-out-families`, default cifar10-cells,ptb-cells,nmt-variants; never trained on by the
shipped policy, which saw members 0-2) on `--held-out-clusters` (default 4xV100) follow, imported
as training and `benchmarks/generalization.py` import them (`rl.train.problems_for`). The summary
is given over the bench rows, the held-out rows and all rows.

Single rows decide an 18-row mean (a search that misses a basin on NMT-4l moves it by ~0.01), so
one seed cannot order the variants. `--pool FILE...` pools the rows of several runs (other seeds)
and prints, beside each variant's pooled mean ratio, placeto's paired difference to each control
(per row and seed: placeto's ratio less the control's) with its standard error and the rows where
placeto is better and worse: a difference within about two standard errors is not shown.

`--rerun FILE --variants placeto,untrained` runs those variants again on FILE's rows (with the
same `--seed` as FILE's run), keeping its other figures (marked = in the table): a change to one
variant measured against the stored others. `--ended-before S` runs a variant only where FILE's
search ended before S wall seconds: for a change to a stopping rule under which a search can only
end later, a search FILE's run cut at its deadline runs the same (but for the wall clock's say in
its last round).

Run: .venv/bin/python benchmarks/ablation.py [--graphs inception_v3,nmt_4l,nasnet]
     [--clusters 2xK80,4xK80,4xV100,8xV100] [--held-out 100,101] [--out ablation.json]
     .venv/bin/python benchmarks/ablation.py --pool ablation_seed0.json ablation_seed1.json ...
     .venv/bin/python benchmarks/ablation.py --rerun ablation_seed0.json --variants placeto [--ended-before 9.8]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time
import warnings
from functools import lru_cache

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
    parser.add_argument("--held-out", default="", help="family members to add, e.g. 100,101 (default: none)")
    parser.add_argument("--held-out-families", default="cifar10-cells,ptb-cells,nmt-variants")
    parser.add_argument("--held-out-clusters", default="4xV100")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="ablation.json")
    parser.add_argument("--pool", nargs="+", metavar="FILE", help="pool the rows of these runs' --out files")
    parser.add_argument("--rerun", metavar="FILE", help="the rows of this run's --out file (not --graphs, "
                        "--held-out), its figures kept but for --variants")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="the variants to run (default: all)")
    parser.add_argument("--ended-before", type=float, metavar="S", help="with --rerun: run a variant only on "
                        "the rows where FILE's ended before S wall seconds")
    args = parser.parse_args(argv)

    def stored_rows(name: str) -> list[dict]:
        try:
            return json.loads(pathlib.Path(name).read_text())["rows"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            parser.error(f"--pool and --rerun take this benchmark's --out files; {name}: {type(error).__name__}: {error}")

    if args.pool:
        print(json.dumps(pooled([row for name in args.pool for row in stored_rows(name)]), indent=1))
        return
    variants = args.variants.split(",")
    if not set(variants) <= set(VARIANTS):
        parser.error(f"--variants: some of {','.join(VARIANTS)}")
    if args.rerun is None and (set(variants) != set(VARIANTS) or args.ended_before is not None):
        parser.error("--variants (but all) and --ended-before go with --rerun")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from tfplaceto.cluster import as_cluster
    from tfplaceto.costs import profile
    from tfplaceto.graph import import_graph
    from tfplaceto.outputs import atomic_write
    from tfplaceto.problem import make_problem
    from tfplaceto.rl.train import problems_for

    def problems():
        """(row, problem) of every row: with --rerun the stored row and a function that builds
        its problem (not called for a row with nothing to run again), else a new row (graph,
        cluster, group) and its problem."""
        if args.rerun:
            imported = lru_cache(maxsize=1)(import_graph)  # a bench graph's rows follow each other
            for row in stored_rows(args.rerun):

                def build(graph=row["graph"], cluster_name=row["cluster"]):
                    if "/" in graph:  # a family member, imported as training imports it
                        return problems_for([f"builtin:{graph}"], [cluster_name])[0][0]
                    op_graph, cluster = imported(f"builtin:{graph}"), as_cluster(cluster_name)
                    return make_problem(op_graph, cluster, profile(op_graph, cluster))

                yield row, build
            return
        for graph in filter(None, args.graphs.split(",")):
            op_graph = import_graph(f"builtin:{graph}")
            for cluster_name in args.clusters.split(","):
                cluster = as_cluster(cluster_name)
                yield ({"graph": graph, "cluster": cluster_name, "group": "bench"},
                       make_problem(op_graph, cluster, profile(op_graph, cluster)))
        clusters = args.held_out_clusters.split(",")
        for family in filter(None, args.held_out_families.split(",") if args.held_out else []):
            for member in args.held_out.split(","):
                graph = f"{family}/{member}"
                for cluster_name, problem in zip(clusters, problems_for([f"builtin:{graph}"], clusters)[0]):
                    yield {"graph": graph, "cluster": cluster_name, "group": "held-out"}, problem

    rows = []
    print(f"{'graph':17} {'cluster':7} {'baseline':>9}" + "".join(f"{v:>15}" for v in VARIANTS)
          + "   (simulated ms; wall s in brackets; =: kept from --rerun's file)")
    for row, problem in problems():
        if "variants" not in row:  # a new row
            row.update(baselines=baseline_times(problem), variants={})
        todo = [v for v in variants if v not in row["variants"] or args.ended_before is None
                or row["variants"][v]["wall_s"] < args.ended_before]
        if todo and callable(problem):
            problem = problem()
        for variant in todo:
            start = time.perf_counter()
            device_of = run_variant(variant, problem, args.seed)
            wall = time.perf_counter() - start
            step, _, oom = problem.simulator().run(device_of)
            row["variants"][variant] = {"step_time_s": float(step), "oom": bool(oom), "wall_s": wall}
        cells = []
        for variant in VARIANTS:
            figure = row["variants"][variant]
            cells.append(f"{figure['step_time_s'] * 1e3:8.2f}{'!' if figure['oom'] else ' '}({figure['wall_s']:3.0f})"
                         + ("" if variant in todo else "="))
        best_fast = min(t for t, oom in row["baselines"].values() if not oom)
        rows.append(row)
        print(f"{row['graph']:17} {row['cluster']:7} {best_fast * 1e3:9.2f}" + "".join(f"{c:>15}" for c in cells),
              flush=True)
        atomic_write(args.out, json.dumps({"rows": rows, "summary": summarize(rows), "groups": groups(rows)},
                                          indent=1).encode())
    print(json.dumps({"all rows": summarize(rows), **groups(rows)}, indent=1))


def groups(rows: list[dict]) -> dict:
    """`summarize` of the bench rows and of the held-out rows, when there are both."""
    names = ("bench", "held-out")
    if not all(any(row["group"] == name for row in rows) for name in names):
        return {}
    return {name: summarize([row for row in rows if row["group"] == name]) for name in names}


def ratios_to_local_search(rows: list[dict], variant: str) -> np.ndarray:
    """`variant`'s simulated step time over local_search's, row by row."""
    return np.array([row["variants"][variant]["step_time_s"] / row["variants"]["local_search"]["step_time_s"]
                     for row in rows])


def summarize(rows: list[dict]) -> dict:
    """Per variant: rows strictly better than local_search / than every fast baseline and
    local_search; its mean ratio to local_search; its largest gain over the best of all baselines."""
    summary = {"rows": len(rows)}
    for variant in VARIANTS[1:]:
        better_ls, better_all, gains = 0, 0, []
        for row in rows:
            mine = row["variants"][variant]["step_time_s"]
            yardstick = row["variants"]["local_search"]["step_time_s"]
            best_other = min([yardstick] + [t for t, oom in row["baselines"].values() if not oom])
            better_ls += mine < yardstick * (1 - 1e-9)
            better_all += mine < best_other * (1 - 1e-9)
            gains.append(1 - mine / best_other)
        summary[variant] = {"better_than_local_search": int(better_ls),
                            "better_than_every_baseline": int(better_all),
                            "mean_ratio_to_local_search": float(ratios_to_local_search(rows, variant).mean()),
                            "largest_gain_over_every_baseline": float(np.max(gains))}
    return summary


def pooled(rows: list[dict]) -> dict:
    """Each variant's mean ratio to local_search over `rows` (of one run or several), and
    placeto's paired difference to each control: the mean over rows of placeto's ratio less the
    control's (negative: placeto better), its standard error, and the rows either way."""
    ratio = {v: ratios_to_local_search(rows, v) for v in VARIANTS[1:]}
    result = {"rows": len(rows), "mean_ratio_to_local_search": {v: float(r.mean()) for v, r in ratio.items()}}
    for control in VARIANTS[2:]:
        diff = ratio["placeto"] - ratio[control]
        result[f"placeto - {control}"] = {
            "mean": float(diff.mean()),
            "standard_error": float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else float("nan"),
            "rows_placeto_better": int((diff < -1e-9).sum()), "rows_placeto_worse": int((diff > 1e-9).sum())}
    return result


if __name__ == "__main__":
    main()
