"""Does the policy learn? The policy alone, trained from fresh weights on one graph, beside its controls.

For each graph (on one cluster), a policy is trained from fresh weights with the paper's MDP
(random starts, every node visited once, intermediate rewards; `tfplaceto.rl.train.train`,
configured by the shipped policy's gin file) for a fixed, seeded number of episodes. Every `--eval-every` episodes the policy alone is measured:
greedy episodes from `--starts` fixed random starts (`method="placeto_policy"`: no search, no
climbing), the mean simulated step time of their end placements. Flat references:
- best fast baseline (the best of single, round_robin, expert, metis, m_topo, m_etf, m_sct, heft);
- untrained weights: the same greedy episodes with fresh weights (the control);
- uniform random actions: the same random starts, every node re-placed uniformly at random.
"last" is the last weights' evaluation; "policy" is the exported policy (with the shipped
configuration, the best policy alone evaluated during training on starts of its own,
`train(select_every=...)`: model selection on the training graph), measured on the benchmark's
starts. Also the exported policy alone from the single-device start (where the best baseline is the
single device, a policy that learned nothing scores 1.0x from that start: the random start is
the one that counts).

Every evaluation also counts the end placements that run out of device memory (the "OOM"
column): a graph counts as reached only when the policy's placements all fit.

Prints a table (last line: how many graphs reached 1.05x of the best baseline) and writes a
JSON file and a PNG of the curves (against episodes and training wall time).

    python benchmarks/learning.py --graphs cifar10-cells/0 ptb-cells/0 --episodes 1536 512 \\
        --out docs/learning.json --plot docs/learning.png
    python benchmarks/learning.py --graphs ptb-cells/0 --episodes 2048 --gin-param train.lanes=64
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = 1.05  # the policy alone within 5% of the best fast baseline


def problem_of(name: str, cluster: str, batch_size: int | None = None):
    """The Problem of a graph (a built-in name, or anything `import_graph` takes, with
    `batch_size` for an unknown batch dimension) on a cluster."""
    from tfplaceto.rl.train import problems_for

    if batch_size is not None:
        import tfplaceto as tp

        return problems_for([tp.import_graph(name, batch_size=batch_size, cluster=cluster)], [cluster])[0][0]
    return problems_for([name if ":" in name else f"builtin:{name}"], [cluster])[0][0]


def memory_headroom_of(text: str) -> float | None:
    """--memory-headroom: "placer" (`tfplaceto.rl.environment.MEMORY_HEADROOM`, as the policy alone
    acts and trains by default), "none" (no memory mask) or a share of each device's memory the
    policy fills at most (`PlacementEnvironment(memory_headroom=)`)."""
    from tfplaceto.rl.environment import MEMORY_HEADROOM

    return {"placer": MEMORY_HEADROOM, "none": None}[text] if text in ("placer", "none") else float(text)


MEMORY_HEADROOM_HELP = ("the share of a device's memory the policy (and the random actions) fill at most: "
                        "a number, 'none' (no memory mask) or 'placer' (the default: "
                        "tfplaceto.rl.environment.MEMORY_HEADROOM, as the policy alone acts)")


def fresh_network(seed: int):
    """Fresh weights built as `train` builds them: the network settings the gin file binds
    (`train.hidden`, `rounds`, `refresh_every`, `view`, `nodes_on_device`), else `train`'s defaults."""
    import inspect

    import gin

    from tfplaceto.policy.network import PlacetoNetwork
    from tfplaceto.rl.train import train

    defaults = inspect.signature(train).parameters
    settings = {}
    for name in ("hidden", "rounds", "refresh_every", "view", "nodes_on_device", "passes"):
        try:
            settings[name] = gin.query_parameter(f"train.{name}")
        except ValueError:  # not bound
            settings[name] = defaults[name].default
    return PlacetoNetwork(seed=seed, **settings)


def random_actions(problem, starts: int, seed: int, memory_headroom: float | None) -> list[np.ndarray]:
    """End placements of episodes with uniform random actions from the same random starts,
    among the devices a policy's `Actor` of that `memory_headroom` may choose."""
    from tfplaceto.rl.environment import PlacementEnvironment

    env = PlacementEnvironment(problem, batch_size=starts, initial="random", seed=seed,
                               memory_headroom=memory_headroom)
    rng = np.random.default_rng(seed)
    step = env.reset()
    while not step.is_last().all():
        step = env.step(np.array([rng.choice(np.flatnonzero(m)) for m in step.observation["action_mask"]],
                                 np.int32))
    return [s["placement"] for s in env.pop_summaries()]


def mean_and_oom(simulator, placements) -> tuple[float, int]:
    """(mean simulated step time, how many of the placements run out of memory)."""
    runs = [simulator.run(p) for p in placements]
    return float(np.mean([r[0] for r in runs])), sum(r[2] for r in runs)


def run_graph(name: str, cluster: str, episodes: int, eval_every: int, starts: int, seed: int,
              config: dict, log, batch_size: int | None = None, memory_headroom: float | None = None) -> dict:
    from tfplaceto import search
    from tfplaceto.baselines import COMPARED_BASELINES, run
    from tfplaceto.rl.acting import Actor
    from tfplaceto.rl.train import train

    problem = problem_of(name, cluster, batch_size)
    simulator = problem.simulator()

    baseline_runs = {m: simulator.run(run(m, problem, seed=seed)) for m in COMPARED_BASELINES}
    baselines = {m: float(r[0]) for m, r in baseline_runs.items()}
    baselines_oom = sorted(m for m, r in baseline_runs.items() if r[2])
    best_method = min(baselines, key=lambda m: (m in baselines_oom, baselines[m]))
    best = search.best_baseline(problem, seed).step_time_s
    eval_seed = 10_000 + seed  # evaluation starts differ from the training starts

    network = fresh_network(seed)
    actor = Actor(problem, network, seed, memory_headroom)  # one compiled function; it sees the weights as they train

    def policy_alone(acting=actor, start="random") -> tuple[float, int]:
        return mean_and_oom(simulator, acting.episodes(start, starts, greedy=True, seed=eval_seed))

    untrained, untrained_oom = policy_alone()
    random_moves, random_oom = mean_and_oom(simulator, random_actions(problem, starts, eval_seed, memory_headroom))
    curve = [{"episode": 0, "wall_s": 0.0, "step_time_s": untrained, "oom": untrained_oom}]
    evaluation_s = [0.0]

    def on_episode(entry: dict) -> None:
        if entry["episode"] % eval_every == 0:
            wall = entry["wall_s"] - evaluation_s[0]  # training time only: earlier evaluations out
            began = time.perf_counter()
            step_time, oom = policy_alone()
            evaluation_s[0] += time.perf_counter() - began
            curve.append({"episode": entry["episode"], "wall_s": wall, "step_time_s": step_time, "oom": oom})
            log(f"{name} {cluster}: episode {entry['episode']}, policy alone {step_time * 1e3:.3f} ms "
                f"({step_time / best:.3f}x best baseline)" + (f", {oom}/{starts} out of memory" if oom else "")
                + f"; best found so far {entry['best_step_time_s'] * 1e3:.3f} ms (a search's figure)")

    result = train(problem, episodes=episodes, seed=seed, network=network, progress=False,
                   callback=on_episode, **config)
    reached = next((p for p in curve if p["step_time_s"] <= TARGET * best and not p["oom"]), None)
    last = curve[-1]["step_time_s"]
    exported_actor = Actor(problem, result.exported_network(), seed, memory_headroom)
    final, final_oom = policy_alone(exported_actor)
    from_single, from_single_oom = policy_alone(exported_actor, start="single")
    return {
        "graph": name, "cluster": cluster, "nodes": problem.num_nodes, "episodes": result.episodes,
        "decisions": result.decisions, "train_wall_s": result.wall_s - evaluation_s[0],
        "best_baseline": best_method, "best_baseline_s": best, "baselines_s": baselines,
        "baselines_oom": baselines_oom, "single_is_best": best_method == "single",
        "untrained_s": untrained, "untrained_oom": untrained_oom,
        "random_actions_s": random_moves, "random_actions_oom": random_oom, "curve": curve, "last_s": last,
        "selected_episode": result.selected_episode, "final_s": final, "final_oom": final_oom,
        "final_over_best": final / best, "final_over_untrained": final / untrained,
        "met": final / best <= TARGET and not final_oom,
        "from_single_s": from_single, "from_single_oom": from_single_oom,
        "untrained_from_single_s": policy_alone(Actor(problem, fresh_network(seed), seed), "single")[0],
        # A search's figure: the best placement simulated in training (the episodes' intermediate and
        # end placements; with `train.imitate_baseline`, the teacher's placement until one beats it).
        "sampled_best_s": result.best[0].step_time_s,
        "reached_episode": reached["episode"] if reached else None,
        "reached_wall_s": reached["wall_s"] if reached else None,
    }


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(rows), figsize=(4.5 * len(rows), 7), squeeze=False)
    for col, row in enumerate(rows):
        for ax, key, label in ((axes[0, col], "episode", "episodes"), (axes[1, col], "wall_s", "training wall s")):
            xs = [p[key] for p in row["curve"]]
            ax.plot(xs, [p["step_time_s"] * 1e3 for p in row["curve"]], "o-", label="policy alone (greedy, random starts)")
            oom = [(x, p["step_time_s"] * 1e3) for x, p in zip(xs, row["curve"]) if p.get("oom")]
            if oom:
                ax.plot(*zip(*oom), "rx", markersize=9, label="some end placements out of memory")
            for value, style, name in ((row["best_baseline_s"], "k-", f"best baseline ({row['best_baseline']})"),
                                       (row["untrained_s"], "r--", "untrained weights"),
                                       (row["random_actions_s"], "m:", "uniform random actions")):
                ax.axhline(value * 1e3, color=style[0], linestyle=style[1:], label=name)
            ax.set_yscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel("simulated step time (ms)")
            ax.set_title(f"{row['graph']} on {row['cluster']}")
        axes[0, col].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", nargs="+", default=["cifar10-cells/0", "ptb-cells/0", "nmt_4l", "inception_v3"])
    parser.add_argument("--cluster", default="4xV100")
    parser.add_argument("--episodes", type=int, nargs="+", default=[2048],
                        help="training episodes, one for all graphs or one per graph")
    parser.add_argument("--eval-every", type=int, default=128)
    parser.add_argument("--starts", type=int, default=4, help="fixed random starts per evaluation")
    parser.add_argument("--gin", default=os.path.join(ROOT, "tfplaceto", "policy", "train.gin"),
                        help="training configuration (default: the shipped policy's)")
    parser.add_argument("--gin-param", action="append", default=[],
                        help="a gin binding on top of --gin, e.g. train.lanes=64 (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=None, help="batch size of graph files that have none")
    parser.add_argument("--memory-headroom", default="placer", help=MEMORY_HEADROOM_HELP)
    parser.add_argument("--out", default=None, help="JSON results")
    parser.add_argument("--plot", default=None, help="PNG of the curves")
    args = parser.parse_args(argv)
    import gin

    import tfplaceto.rl.train  # noqa: F401  (registers train() with gin)

    gin.parse_config_files_and_bindings([args.gin], args.gin_param)
    episodes = args.episodes * len(args.graphs) if len(args.episodes) == 1 else args.episodes
    # What made each row: a row is one seeded draw of this configuration.
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    made_by = {"gin": os.path.relpath(args.gin, ROOT), "gin_params": args.gin_param, "seed": args.seed,
               "commit": commit}
    rows = []
    for name, count in zip(args.graphs, episodes):
        rows.append(run_graph(name, args.cluster, count, args.eval_every, args.starts, args.seed, {},
                              log=lambda line: print(line, flush=True), batch_size=args.batch_size,
                              memory_headroom=memory_headroom_of(args.memory_headroom)) | {"made_by": made_by})
        if args.out:
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
        if args.plot:
            plot(rows, args.plot)
    report(rows, args.starts)


def report(rows: list[dict], starts: int) -> None:
    """Prints the table of `rows` (run_graph's) and the line of how many graphs reached the target."""
    print(f"\n{'graph':<18} {'best baseline':>22} {'untrained':>10} {'random':>10} {'last':>10} "
          f"{'policy':>10} {'(episode)':>9} {'OOM':>4} {'x best':>7} {'x untr.':>8} {'from single':>12} "
          f"{'reached 1.05x at':>24}")
    for r in rows:
        reached = (f"{r['reached_episode']} ep / {r['reached_wall_s']:.0f} s" if r["reached_episode"] is not None
                   else "not reached")
        print(f"{r['graph']:<18} {r['best_baseline_s'] * 1e3:>10.3f} ms ({r['best_baseline']:>7}) "
              f"{r['untrained_s'] * 1e3:>8.3f}ms {r['random_actions_s'] * 1e3:>8.3f}ms {r['last_s'] * 1e3:>8.3f}ms "
              f"{r['final_s'] * 1e3:>8.3f}ms {str(r['selected_episode']):>9} {r['final_oom']:>2}/{starts:<1} "
              f"{r['final_over_best']:>7.3f} {r['final_over_untrained']:>8.3f} {r['from_single_s'] * 1e3:>10.3f}ms "
              f"{reached:>24}")
    for r in rows:
        print(f"{r['graph']}: best placement found in training (a search's figure, not the policy's; with "
              "train.imitate_baseline it starts at the best baseline's): "
              f"{r['sampled_best_s'] * 1e3:.3f} ms ({r['sampled_best_s'] / r['best_baseline_s']:.3f}x)")
        if r["baselines_oom"]:
            print(f"{r['graph']}: out of memory: {', '.join(r['baselines_oom'])}")
    met = sum(r["met"] for r in rows)
    print(f"policy alone within {TARGET:.2f}x of the best fast baseline (and in memory) on {met}/{len(rows)} "
          f"graphs; at most 0.8x untrained weights on {sum(r['final_over_untrained'] <= 0.8 for r in rows)}/{len(rows)}")


if __name__ == "__main__":
    main()
