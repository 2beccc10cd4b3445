"""Perturbation quality: what the policy's episodes are worth to the search, measured directly.

The placer's search (tfplaceto/policy/placer.py) sits at a local optimum of its climbing and
leaves it by perturbing: re-placing WINDOW consecutive classes, then climbing again. A good
perturbation is one whose climbed result is better than where it started. Here, on each
(graph, cluster) row, the placer's start (the best fast baseline, climbed) is perturbed
`--samples` times by each kind of perturbation, each perturbed placement is climbed
(`placer.polish`, no deadline), and the climbed step times are compared with the start:
- policy: sampled episodes of the shipped policy (what the search uses);
- untrained: the same episodes with fresh weights in the policy's configuration;
- random: the window sent to random allowed devices (`placer.random_window_moves`).
Every kind starts from the same placement; episodes and random moves are seeded, so a row is
deterministic and machine speed does not enter (unlike the wall-clock-bounded ablation).
Per kind: the share of perturbations whose climbed result is strictly better than the start
("better"), the mean climbed step time relative to the start ("mean"), the best one ("best"),
and the wall seconds per try, perturbing and climbing (in the JSON).

Defaults are graphs the shipped policy never saw (held-out family members); `--graphs` also
takes the benchmark models (nmt_4l, nasnet, ...), which take minutes per row.

Run: .venv/bin/python benchmarks/perturbations.py [--graphs cifar10-cells/100,ptb-cells/100]
     [--clusters 2xK80,4xV100,8xV100] [--samples 32] [--policy-dir DIR] [--out perturbations.json]
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

KINDS = ("policy", "untrained", "random")


def policy_ends(problem: Problem, network, start: np.ndarray, samples: int, seed: int) -> list[np.ndarray]:
    """The placements `samples` sampled policy episodes (window WINDOW) leave `start` in."""
    from tfplaceto.policy import placer
    from tfplaceto.rl.environment import PlacementEnvironment
    from tfplaceto.rl.train import make_logits_fn, rollout

    envs = [PlacementEnvironment(problem, initial=lambda p, r: start, seed=seed + k, window=placer.WINDOW)
            for k in range(samples)]
    rollout(envs, make_logits_fn(network, envs[0].observation_spec()), np.random.default_rng(seed))
    return [env.placement for env in envs]


def run_row(problem: Problem, networks: dict, samples: int, seed: int) -> dict:
    from tfplaceto.policy import placer

    simulator = problem.simulator()
    neighbourhoods = placer.prepare_neighbourhoods(problem)
    start = placer._start(problem, seed, np.random.default_rng(seed), float("inf"), neighbourhoods).placement
    start_s = float(simulator.run(start)[0])
    row = {"nodes": problem.num_nodes, "start_s": start_s}
    for kind in KINDS:
        began = time.perf_counter()
        if kind == "random":
            perturb = placer.random_window_moves(problem, placer.WINDOW)
            rng = np.random.default_rng(seed)
            ends = [perturb(rng, start) for _ in range(samples)]
        else:
            ends = policy_ends(problem, networks[kind], start, samples, seed)
        rng = np.random.default_rng(seed)
        climbed = [placer.polish(problem, end, rng, neighbourhoods=neighbourhoods) for end in ends]
        times = np.array([simulator.run(c)[0] for c in climbed]) / start_s
        row[kind] = {"better": float(np.mean(times < 1 - 1e-9)), "mean": float(times.mean()),
                     "best": float(times.min()), "wall_s_per_try": (time.perf_counter() - began) / samples}
    return row


def load_problems(graphs: list[str], clusters: list[str]):
    """(graph, cluster, Problem) for every row: "family/member" or a built-in model name."""
    from tfplaceto.cluster import as_cluster
    from tfplaceto.costs import profile
    from tfplaceto.graph import import_graph
    from tfplaceto.problem import make_problem
    from tfplaceto.rl.train import family_problems

    for graph in graphs:
        if "/" in graph:
            family, member = graph.rsplit("/", 1)
            yield from ((graph, c, p) for c, p in zip(clusters, family_problems(family, clusters, 1, int(member))))
            continue
        op_graph = import_graph(f"builtin:{graph}")
        for name, cluster in zip(clusters, map(as_cluster, clusters)):
            yield graph, name, make_problem(op_graph, cluster, profile(op_graph, cluster))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", default="cifar10-cells/100,cifar10-cells/101,ptb-cells/100,ptb-cells/101")
    parser.add_argument("--clusters", default="2xK80,4xV100,8xV100")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--policy-dir", default=None, help="a saved policy instead of the shipped one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="perturbations.json")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from tfplaceto.policy import placer

    trained = placer.load_policy(args.policy_dir)
    if trained is None:
        sys.exit(f"no policy in {args.policy_dir or placer.PRETRAINED_DIR}")
    networks = {"policy": trained, "untrained": placer.untrained_network(args.seed, like=trained)}
    rows = []
    header = "".join(f" {kind + ' better/mean/best':>28}" for kind in KINDS)
    print(f"{'graph':20} {'cluster':7} {'start ms':>9}{header}")
    for graph, cluster, problem in load_problems(args.graphs.split(","), args.clusters.split(",")):
        row = {"graph": graph, "cluster": cluster, **run_row(problem, networks, args.samples, args.seed)}
        rows.append(row)
        cells = "".join(f" {row[k]['better']:10.2f} {row[k]['mean']:8.4f} {row[k]['best']:8.4f}" for k in KINDS)
        print(f"{graph:20} {cluster:7} {row['start_s'] * 1e3:9.3f}{cells}", flush=True)
    summary = {kind: {"better": float(np.mean([r[kind]["better"] for r in rows])),
                      "mean": float(np.mean([r[kind]["mean"] for r in rows])),
                      "best": float(np.mean([r[kind]["best"] for r in rows]))} for kind in KINDS}
    tmp = f"{args.out}.tmp"
    with open(tmp, "w") as f:
        json.dump({"args": vars(args), "rows": rows, "summary": summary}, f, indent=1)
    os.replace(tmp, args.out)
    print("mean over rows:", json.dumps(summary))


if __name__ == "__main__":
    main()
