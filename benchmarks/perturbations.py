"""What one perturbation of the search is worth, by its source: random moves, the shipped policy,
untrained weights.

`method="placeto"` is iterated local search (`tfplaceto.search.improve`): each round perturbs the
best placement and climbs every perturbed one. The search ablation (`benchmarks/ablation.py`)
compares whole 10 s searches, whose ends are decided by a handful of climbs on the large graphs
(NMT-4l: ~1-3 s a climb). This benchmark asks the question underneath, with many draws and no
clock: from one local optimum (the best fast baseline climbed, `search.polish`, seed 0), draw
`--draws` perturbations from each source (in pairs, as a search round does), climb each, and
compare the climbed placements with the optimum they started from.

The policy's windows ("shipped", "untrained") are the placer's: at a random position, seeing the
classes before them (`placeto.policy_perturbation`). `--sources` adds (not among the defaults)
"shipped where it differs" and "untrained where it differs": windows that begin at a class the
greedy policy would place elsewhere (`where_it_differs=True`, session 41); "shipped blind" and
"untrained blind": blind to the placement they re-place, as before session 40 (a "placed"-view
policy then sees only the classes it has placed in the episode: `sees=False`).
It also adds "relink shipped" and "relink untrained": path relinking
toward the policy's own greedy placement (from a random start), the policy as a guide rather than
a sampler. Each draw moves `search.WINDOW` consecutive classes (in topological order, at a random
position) of those where the placement and the guide differ to the guide's devices.

Per row and source it prints: the perturbed placements left unchanged (the search skips them);
the mean simulated step time over the optimum's before the climb and after it; the share that
climb to a strictly better placement (what moves a search on), the best of them; and the mean
seconds of a climb. Every figure here is the search's (climbs on the simulator), not what the
policy learned; the sources differ only in how they perturb (`tfplaceto.placeto.policy_perturbation`
with the shipped or untrained weights, `tfplaceto.search.random_window_moves`).

`--start searched` draws from where the search of random moves alone ends instead
(`benchmarks/ablation.py`'s "random moves": 10 s from the best fast baseline, seeded; the same
placement on any machine when it ends by patience, as it does on the small graphs): is there
anything left there for a source to find?

    python benchmarks/perturbations.py [--graphs nmt_4l nasnet nmt-variants/101] [--clusters 2xK80 4xV100]
        [--draws 32] [--sources "random moves" "relink shipped" ...] [--start searched] [--out perturbations.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling benchmarks
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SOURCES = ("random moves", "shipped", "untrained")
RELINK = ("relink shipped", "relink untrained")
WHERE_IT_DIFFERS = ("shipped where it differs", "untrained where it differs")
BLIND = ("shipped blind", "untrained blind")


def relink_moves(problem, guide: np.ndarray, window: int):
    """A Perturbation: `window` consecutive classes (topological order) among those where the
    placement and `guide` differ, moved to the guide's devices (module docstring)."""
    from tfplaceto.search import classes_in_order

    members = classes_in_order(problem)

    def perturb(rng: np.random.Generator, placement: np.ndarray, count: int) -> list[np.ndarray]:
        differ = [m for m in members if placement[m[0]] != guide[m[0]]]
        moved_all = []
        for _ in range(count):
            moved = placement.copy()
            begin = int(rng.integers(max(len(differ) - window, 0) + 1))
            for m in differ[begin:begin + window]:
                moved[m] = guide[m]
            moved_all.append(moved)
        return moved_all

    return perturb


def perturbations(problem, source: str, seed: int):
    """The search's Perturbation of `source` on `problem` (module docstring)."""
    from tfplaceto import placeto, search
    from tfplaceto.policy.checkpoint import resolve_policy
    from tfplaceto.rl.acting import Actor, greedy_placements

    if source == "random moves":
        return search.random_window_moves(problem)
    if source in RELINK:
        network = resolve_policy(source.split()[1], seed)
        return relink_moves(problem, greedy_placements(problem, network, "random", 1, seed)[0], search.WINDOW)
    network = resolve_policy(source.split()[0], seed)
    return placeto.policy_perturbation(Actor(problem, network, seed), sees=source not in BLIND,
                                       where_it_differs=source in WHERE_IT_DIFFERS)


def measure(problem, draws: int, seed: int = 0, sources=SOURCES, start: str = "climbed") -> dict:
    """source -> figures (module docstring) of `draws` climbed perturbations of one local optimum:
    the best fast baseline climbed (`start="climbed"`) or where the search of random moves alone
    ends (`start="searched"`, module docstring)."""
    from tfplaceto import search

    simulator = problem.simulator()
    neighbourhoods = search.prepare_neighbourhoods(problem)
    if start == "searched":
        from ablation import run_variant

        optimum = run_variant("random moves", problem, seed)
    else:
        optimum = search.polish(problem, search.best_baseline(problem, seed).placement,
                                np.random.default_rng(seed), neighbourhoods=neighbourhoods)
    optimum_s = simulator.run(optimum)[0]
    figures = {"optimum_s": float(optimum_s)}
    for source in sources:
        perturb, rng = perturbations(problem, source, seed), np.random.default_rng(seed + 1)
        moved: list[np.ndarray] = []
        while len(moved) < draws:
            drawn = perturb(rng, optimum, 2)
            if not drawn:  # none to draw (a policy that would change nothing where it differs)
                break
            moved += drawn
        before, after, climb_s = [], [], []
        for placement in moved[:draws]:
            if np.array_equal(placement, optimum):
                continue  # what `search.improve` skips
            before.append(simulator.run(placement)[0] / optimum_s)
            began = time.perf_counter()
            climbed = search.polish(problem, placement, rng, neighbourhoods=neighbourhoods)
            climb_s.append(time.perf_counter() - began)
            after.append(simulator.run(climbed)[0] / optimum_s)
        after_all = np.array(after + [1.0] * (draws - len(after)))  # an unchanged one stays at 1
        figures[source] = {"unchanged": draws - len(after), "before": float(np.mean(before or [1.0])),
                           "after": float(after_all.mean()), "better": float(np.mean(after_all < 1 - 1e-9)),
                           "best": float(after_all.min()), "climb_s": float(np.mean(climb_s or [0.0]))}
    return figures


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", nargs="+", default=["nmt_4l", "nasnet", "nmt-variants/101", "cifar10-cells/101"])
    parser.add_argument("--clusters", nargs="+", default=["2xK80", "4xV100"])
    parser.add_argument("--draws", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sources", nargs="+", default=list(SOURCES), choices=SOURCES + WHERE_IT_DIFFERS + RELINK + BLIND)
    parser.add_argument("--start", choices=("climbed", "searched"), default="climbed",
                        help="draw from the best fast baseline climbed, or from where the search of random moves ends")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    from tfplaceto.outputs import atomic_write
    from tfplaceto.rl.train import problems_for

    print(f"{'graph':<20} {'cluster':<7} {'source':<16} {'unchanged':>9} {'before':>7} {'after':>7} "
          f"{'better':>7} {'best':>7} {'climb s':>8}   (step time over the optimum's)")
    rows = []
    for graph in args.graphs:
        problems, _ = problems_for([f"builtin:{graph}"], args.clusters)
        for cluster, problem in zip(args.clusters, problems):
            row = {"graph": graph, "cluster": cluster, **measure(problem, args.draws, args.seed, args.sources, args.start)}
            rows.append(row)
            for source in args.sources:
                f = row[source]
                print(f"{graph:<20} {cluster:<7} {source:<16} {f['unchanged']:9d} {f['before']:7.3f} {f['after']:7.4f} "
                      f"{f['better']:7.2f} {f['best']:7.4f} {f['climb_s']:8.2f}", flush=True)
            if args.out:
                atomic_write(args.out, json.dumps(rows, indent=1).encode())
    for source in args.sources:
        print(f"{source:<16} over {len(rows)} rows: after {np.mean([r[source]['after'] for r in rows]):.4f}, "
              f"better {np.mean([r[source]['better'] for r in rows]):.3f}, "
              f"climb {np.mean([r[source]['climb_s'] for r in rows]):.2f} s")


if __name__ == "__main__":
    main()
