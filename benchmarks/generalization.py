"""Generalization by the policy alone: the shipped policy on held-out family members, zero-shot.

For each held-out member (never trained on) of each family, on each cluster: the policy alone
(`method="placeto_policy"`: greedy episodes from `--starts` fixed random starts, no search, no
climbing; the mean simulated step time of their end placements) with
- the shipped policy (or `--policy DIR`), zero-shot;
- a policy trained on that member alone from fresh weights (`--per-graph-episodes`, 0 to skip),
  configured as the shipped policy was (`--gin`, default `tfplaceto/policy/pretrained/train.gin`,
  then `--gin-param`: the same MDP and settings). The per-graph column of docs/RESULTS.md (512
  episodes) was made when that file bound 16 lanes, before session 13's shipped policy:
  `--gin-param train.lanes=16 --gin-param train.entropy_decay_episodes=4096` restores it;
  with 64 lanes a budget is a multiple of 64 episodes;
- untrained weights (the control) and uniform random actions from the same starts;
against the best fast baseline. Prints every row and the averages the targets are stated in; each
figure's row also counts the end placements that run out of device memory (`*_oom` in the JSON).

    python benchmarks/generalization.py --held-out 100-109 --clusters 2xK80 4xV100 8xV100 \\
        --per-graph-episodes 256 --out docs/generalization.json

`--models ResNet50:32 MobileNetV2:64 ...` measures real models from outside the families instead
(Keras applications at their default image size, weights=None, one SGD-with-momentum training
step of that batch): architectures the policy never saw, where memory binds on K80s and V100s as
it seldom does in the families. Every policy, and the uniform random actions, is kept off a
device it would fill past `tfplaceto.rl.environment.MEMORY_HEADROOM` of its memory, as the
policy alone acts (`PlacementEnvironment(memory_headroom=)`); `--memory-headroom none` lifts
that mask (a number sets another share).

    python benchmarks/generalization.py --models ResNet50:32 MobileNetV2:64 DenseNet121:32 \\
        VGG16:32 Xception:32 EfficientNetB0:32 --out docs/generalization_keras_applications_session48.json

`--merge A.json B.json ... --out C.json` measures nothing: it joins the rows of earlier runs
(ordered by family, member and cluster; a later file's row replaces an earlier one's), writes them
and prints the table and the averages over all of them. `--no-controls` measures the zero-shot
column (and per-graph, if asked) only: the controls do not depend on the trained policy (untrained
weights are fresh ones of its configuration, seeded), so a candidate policy's run merged after
one with the same starts, seed and configuration has the same table as a full run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learning import MEMORY_HEADROOM_HELP, ROOT, mean_and_oom, memory_headroom_of, random_actions  # noqa: E402


def members(spec: str) -> list[int]:
    """"100-109" or "100,101" -> member indices."""
    if "-" in spec:
        first, last = spec.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(m) for m in spec.split(",")]


def keras_application(spec: str):
    """The OpGraph of one SGD-with-momentum training step of a Keras application, "NAME:BATCH"
    (e.g. "ResNet50:32"; weights=None, its default image size, ImageNet's 1000 classes)."""
    import tensorflow as tf

    import tfplaceto as tp

    name, _, batch = spec.partition(":")
    model = getattr(tf.keras.applications, name)(weights=None)
    model.compile(tf.keras.optimizers.SGD(0.01, momentum=0.9), tf.keras.losses.SparseCategoricalCrossentropy())
    return tp.import_graph(model, batch_size=int(batch or 32))


def row(name: str, cluster: str, problem, policy, starts: int, seed: int, per_graph_episodes: int,
        controls: bool, memory_headroom: float | None) -> dict:
    from tfplaceto import search
    from tfplaceto.policy.network import PlacetoNetwork
    from tfplaceto.rl.acting import Actor
    from tfplaceto.rl.train import train

    simulator = problem.simulator()

    result = {"graph": name, "cluster": cluster, "best_baseline_s": search.best_baseline(problem, seed).step_time_s}

    def record(key: str, placements) -> None:
        """The mean step time of `placements` as `key`_s, and how many do not fit as `key`_oom."""
        result[f"{key}_s"], result[f"{key}_oom"] = mean_and_oom(simulator, placements)

    def alone(network) -> list:
        return Actor(problem, network, seed, memory_headroom).episodes("random", starts, greedy=True, seed=10_000 + seed)

    record("zero_shot", alone(policy))
    if controls:
        record("untrained", alone(PlacetoNetwork(**{**policy.config, "seed": seed})))
        record("random_actions", random_actions(problem, starts, 10_000 + seed, memory_headroom))
    if per_graph_episodes:
        trained = train(problem, episodes=per_graph_episodes, seed=seed, progress=False)
        record("per_graph", alone(trained.exported_network()))
        result["per_graph_wall_s"] = trained.wall_s
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--families", nargs="+", default=["cifar10-cells", "ptb-cells", "nmt-variants"])
    parser.add_argument("--held-out", default="100-109", help="members, e.g. 100-109 or 100,101")
    parser.add_argument("--models", nargs="+", default=None,
                        help="Keras applications NAME:BATCH (e.g. ResNet50:32) in place of the families' members")
    parser.add_argument("--clusters", nargs="+", default=["2xK80", "4xV100", "8xV100"])
    parser.add_argument("--policy", default=None, help="a policy directory (default: the shipped one)")
    parser.add_argument("--starts", type=int, default=4)
    parser.add_argument("--per-graph-episodes", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--gin", default=os.path.join(ROOT, "tfplaceto", "policy", "pretrained", "train.gin"),
                        help="the per-graph policies' configuration (the shipped policy's own gin file)")
    parser.add_argument("--gin-param", action="append", default=[],
                        help="a gin binding on top of --gin (repeatable)")
    parser.add_argument("--merge", nargs="+", default=None, help="JSON files of earlier runs: join and report them")
    parser.add_argument("--memory-headroom", default="placer", help=MEMORY_HEADROOM_HELP)
    parser.add_argument("--no-controls", action="store_true",
                        help="zero-shot (and per-graph) only; merge with a run that has the controls")
    args = parser.parse_args(argv)
    if args.merge:
        rows = merge(args.merge, args.families)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
        print(header(args.starts))
        for r in rows:
            print(line(r))
        print(averages(rows))
        return
    import gin

    from tfplaceto.policy.checkpoint import resolve_policy
    from tfplaceto.rl import cloning  # noqa: F401  registers clone_teachers, bound by the shipped gin
    from tfplaceto.rl.train import problems_for

    gin.parse_config_files_and_bindings([args.gin], args.gin_param)  # for the per-graph policies

    headroom = memory_headroom_of(args.memory_headroom)
    policy = resolve_policy(args.policy)
    rows = []
    print(header(args.starts))
    # (name, source) of every graph, imported one at a time: a Keras application's when reached.
    sources = ((spec, keras_application(spec)) for spec in args.models) if args.models else (
        (f"{family}/{member}", f"builtin:{family}/{member}") for family in args.families
        for member in members(args.held_out))
    for name, source in sources:
        problems = problems_for([source], args.clusters)[0]  # one import per graph
        for cluster, problem in zip(args.clusters, problems):
            r = row(name, cluster, problem, policy, args.starts, args.seed, args.per_graph_episodes,
                    controls=not args.no_controls, memory_headroom=headroom)
            rows.append(r)
            print(line(r), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(rows, f, indent=1)
    print(averages(rows))


def header(starts: int) -> str:
    return (f"{'graph':<20} {'cluster':<7} {'best base':>10} {'zero-shot':>10} {'per-graph':>10} "
            f"{'untrained':>10} {'random':>10}   (ms; policy alone, mean of {starts} random starts)")


def line(r: dict) -> str:
    def cell(key: str) -> str:
        return f"{r[key] * 1e3:10.3f}" if key in r else f"{'-':>10}"

    return (f"{r['graph']:<20} {r['cluster']:<7} {cell('best_baseline_s')} {cell('zero_shot_s')} "
            f"{cell('per_graph_s')} {cell('untrained_s')} {cell('random_actions_s')}")


def figures(rows: list[dict]) -> dict:
    """The averages the targets are stated in (the controls and per-graph over the rows that have
    them: a run with --no-controls has neither)."""
    over_best = [r["zero_shot_s"] / r["best_baseline_s"] for r in rows]
    result = {"rows": len(rows), "zero_shot_over_best_baseline": float(np.mean(over_best))}
    over_untrained = [r["zero_shot_s"] / r["untrained_s"] for r in rows if "untrained_s" in r]
    if over_untrained:
        result.update(zero_shot_over_untrained=float(np.mean(over_untrained)),
                      untrained_over_zero_shot=float(np.mean([1 / x for x in over_untrained])),
                      random_actions_over_zero_shot=float(np.mean([r["random_actions_s"] / r["zero_shot_s"]
                                                                   for r in rows if "random_actions_s" in r])))
    if all("zero_shot_oom" in r for r in rows):  # rows measured before OOM was counted have no count
        result["zero_shot_oom_rows"] = sum(r["zero_shot_oom"] > 0 for r in rows)
    over_per_graph = [r["zero_shot_s"] / r["per_graph_s"] for r in rows if "per_graph_s" in r]
    if over_per_graph:
        result.update(per_graph_rows=len(over_per_graph), zero_shot_over_per_graph=float(np.mean(over_per_graph)),
                      zero_shot_over_per_graph_worst=float(max(over_per_graph)))
    return result


def averages(rows: list[dict]) -> str:
    """`figures` as the benchmark's last line."""
    f = figures(rows)
    text = f"{f['rows']} rows; zero-shot / best fast baseline: mean {f['zero_shot_over_best_baseline']:.3f}"
    if "zero_shot_over_untrained" in f:
        text += (f"; zero-shot / untrained: mean {f['zero_shot_over_untrained']:.3f} "
                 f"(untrained / zero-shot {f['untrained_over_zero_shot']:.2f}x)")
    else:
        text += " (no controls: merge them in)"
    if "zero_shot_oom_rows" in f:
        text += f"; zero-shot out of memory on {f['zero_shot_oom_rows']} rows"
    if "per_graph_rows" in f:
        text += (f"; zero-shot / per-graph ({f['per_graph_rows']} rows): mean {f['zero_shot_over_per_graph']:.3f}, "
                 f"worst {f['zero_shot_over_per_graph_worst']:.3f}")
    return text


def merge(paths: list[str], families: list[str]) -> list[dict]:
    """The rows of the JSON files `paths`, one per (graph, cluster), in order; a later file's row
    adds its keys to an earlier one's (e.g. per-graph figures to the zero-shot rows)."""
    by_key: dict = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f):
                by_key.setdefault((r["graph"], r["cluster"]), {}).update(r)
    clusters = {"2xK80": 0, "4xV100": 1, "8xV100": 2}

    def order(key):
        family, _, member = key[0].rpartition("/")  # a model outside the families: no member
        rank = families.index(family) if family in families else len(families)
        return rank, family, int(member) if member.isdigit() else 0, member, clusters.get(key[1], len(clusters)), key[1]

    return [by_key[key] for key in sorted(by_key, key=order)]


if __name__ == "__main__":
    main()
