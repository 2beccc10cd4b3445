"""How far is the single-device placement from the best baseline, in moves a one-pass policy makes?

A diagnostic of the learning problem (issue "Placeto that learns"), not a placer. The policy alone
visits every class once in topological order; trained from random starts it consolidates the
graph on one device (where the best baseline is better, it stops there). This script measures,
on the simulator, two hand-written one-pass rules and a small search over them:
- "inputs": each class goes to the device that holds most of the bytes of its inputs among the
  classes already visited (the first, with none, to the first allowed device). Its end placement
  does not depend on the start (every class is visited): a policy with this rule places
  everything on one device when no class deviates.
- "inputs + k deviations" (a SEARCH, named so): the same rule, except that k classes are sent to
  a chosen device; the k (class, device) pairs are chosen greedily one after another, each the
  best of every class and device given the earlier ones. A deviation carries down its branch:
  the classes that read from it follow it, until a join takes the device with more input bytes.
The figure to read: how many coordinated choices separate the consolidated placement from the
best baseline. A policy that has learned "majority of the visited compute" instead of "follow your
inputs" needs a whole branch of independent deviations at once to find the same placement.

With `--policy-episodes N`, the same question of a trained policy: a policy is trained on the graph
(fresh weights, the gin file's settings, N episodes), then from `--starts` random starts its
greedy episode is run once as it is and once per (class, device) with that one class forced to
that device; printed: its end, how many of the forced deviations end better, the best of them.
A policy that carries a deviation down its branch has some; one that sends the branch back has
none.

    python benchmarks/deviations.py --graphs ptb-cells/0 cifar10-cells/0 inception_v3 --max-deviations 3
    python benchmarks/deviations.py --graphs ptb-cells/0 --max-deviations 1 --policy-episodes 384
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learning import problem_of  # noqa: E402


def inputs_rule(statics, forced: dict[int, int] | None = None) -> np.ndarray:
    """End placement of one pass of the "inputs" rule over the visiting order; `forced`: step ->
    device for the deviating classes (a device the class may not use falls back to its first)."""
    forced = forced or {}
    placement = np.zeros(statics.num_nodes, np.int64)
    visited = np.zeros(statics.num_nodes, bool)
    for step, members in enumerate(statics.members):
        inside = np.zeros(statics.num_nodes, bool)
        inside[members] = True
        into = inside[statics.receivers] & ~inside[statics.senders] & visited[statics.senders]
        held = np.bincount(placement[statics.senders[into]], weights=statics.edge_bytes[into],
                           minlength=statics.allowed.shape[1])
        node = statics.steps[step]
        device = forced.get(step, int(held.argmax()) if held.sum() > 0 else 0)
        if not statics.allowed[node, device]:
            device = int(np.flatnonzero(statics.allowed[node])[0])
        placement[members] = device
        visited[members] = True
    return placement


def run_graph(name: str, cluster: str, max_deviations: int, seed: int) -> dict:
    from tfplaceto import search
    from tfplaceto.baselines import run
    from tfplaceto.policy import observation

    problem = problem_of(name, cluster)
    simulator = problem.simulator()
    statics = observation.graph_statics(problem)

    def step_time(placement) -> float:
        return float(simulator.run(placement)[0])

    best = search.best_baseline(problem, seed)
    row = {"graph": name, "cluster": cluster, "classes": statics.num_steps,
           "best_baseline_s": best.step_time_s, "single_s": step_time(run("single", problem, seed=seed)),
           "inputs_s": step_time(inputs_rule(statics)), "deviations": []}
    forced: dict[int, int] = {}
    devices = statics.allowed.shape[1]
    for _ in range(max_deviations):
        candidates = [(step_time(inputs_rule(statics, {**forced, step: device})), step, device)
                      for step in range(statics.num_steps) if step not in forced for device in range(devices)]
        value, step, device = min(candidates)
        forced[step] = device
        row["deviations"].append({"step": step, "device": device, "step_time_s": value})
    return row


def policy_deviations(problem, episodes: int, starts: int, seed: int) -> list[dict]:
    """Trains a policy on `problem` (module docstring) and tries every single forced deviation of
    its greedy episode from `starts` random starts: one dict per start."""
    from learning import fresh_network

    from tfplaceto.policy import observation
    from tfplaceto.rl.acting import Actor
    from tfplaceto.rl.environment import initial_placement
    from tfplaceto.rl.train import train

    network = fresh_network(seed)
    train(problem, episodes=episodes, seed=seed, network=network, progress=False)
    actor, simulator = Actor(problem, network, seed), problem.simulator()
    steps, devices = observation.graph_statics(problem).num_steps, problem.num_devices
    forced = [{}] + [{step: device} for step in range(steps) for device in range(devices)]
    rng, rows = np.random.default_rng(seed), []
    for _ in range(starts):
        start = initial_placement(problem, "random", rng, {})
        ends = [float(simulator.run(p)[0]) for p in actor.episodes(start, len(forced), forced=forced)]
        better = sorted((end, list(choice.items())[0]) for end, choice in zip(ends[1:], forced[1:])
                        if end < ends[0] * (1 - 1e-6))
        rows.append({"greedy_s": ends[0], "tried": len(forced) - 1, "better": len(better),
                     "best": better[0] if better else None})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", nargs="+", default=["ptb-cells/0", "cifar10-cells/0", "inception_v3"])
    parser.add_argument("--cluster", default="4xV100")
    parser.add_argument("--max-deviations", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy-episodes", type=int, default=0,
                        help="also train a policy this many episodes and force its deviations")
    parser.add_argument("--starts", type=int, default=3, help="random starts of the policy diagnostic")
    parser.add_argument("--gin-param", action="append", default=[],
                        help="a gin binding on top of train.gin (repeatable)")
    args = parser.parse_args(argv)
    header = "".join(f"{f'+{k} dev.':>10}" for k in range(1, args.max_deviations + 1))
    print(f"{'graph':<18} {'classes':>7} {'best base':>10} {'single':>10} {'inputs':>10}{header}"
          "   (ms; '+k dev.': a search over the inputs rule, x best baseline in brackets below)")
    for name in args.graphs:
        row = run_graph(name, args.cluster, args.max_deviations, args.seed)
        best = row["best_baseline_s"]
        times = [row["single_s"], row["inputs_s"]] + [d["step_time_s"] for d in row["deviations"]]
        print(f"{name:<18} {row['classes']:>7} {best * 1e3:>10.3f} " + "".join(f"{t * 1e3:>10.3f}" for t in times))
        print(f"{'':<18} {'':>7} {'':>10} " + "".join(f"{f'({t / best:.3f}x)':>10}" for t in times))
        if args.policy_episodes:
            import gin

            import tfplaceto.rl.train  # noqa: F401  (registers train() with gin)

            gin.parse_config_files_and_bindings(
                [os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tfplaceto",
                              "policy", "train.gin")], args.gin_param)
            for i, r in enumerate(policy_deviations(problem_of(name, args.cluster), args.policy_episodes,
                                                    args.starts, args.seed)):
                best_text = (f"best {r['best'][0] * 1e3:.3f} ms (class {r['best'][1][0]} to device {r['best'][1][1]})"
                             if r["best"] else "none better")
                print(f"  policy after {args.policy_episodes} episodes, random start {i}: greedy "
                      f"{r['greedy_s'] * 1e3:.3f} ms; {r['better']} of {r['tried']} forced deviations end better; "
                      f"{best_text}", flush=True)


if __name__ == "__main__":
    main()
