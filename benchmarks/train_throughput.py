"""Training throughput: decisions/s and episodes/s of this engine against a reference commit's.

Both engines train on the same problem (default: cifar10-cells/0 on 4xV100) from fresh weights
for the same number of episodes, each in its own process: the reference engine runs from a git
worktree of `--reference` (default: the commit before the lockstep engine), with that commit's
own defaults (4 episodes per update, simulator lookahead); this engine with the training
configuration (`tfplaceto/policy/train.gin`: 64 lockstep episodes per batch, 4 updates per
batch, one embedding per 8 steps; model selection off), then the `--gin-param` bindings
(repeatable; this engine only: a candidate configuration). A decision is one action (one node
placed). Timed from the end of each engine's first update (its compiled functions are traced by
then) to the end of its last, from its own training history, in wall time and in the CPU time
of its process (all its threads).

How they share the machine (`--mode`): "interleaved" (default) runs them one at a time,
alternating, for `--rounds` rounds, so that neither slows the other and a load that drifts
reaches both alike; "concurrent" runs them at the same time (one round), as the first figures
were measured. On a machine others load, wall-clock figures follow that load; the CPU-time
figures (decisions per CPU-second) much less, as long as the engines are not starved of cache
and memory bandwidth. Last lines: `cpu-time: new D/cpu-s vs reference R/cpu-s decisions =
X.XXx`, then `throughput: new D/s vs reference R/s decisions = X.XXx` (wall clock, summed over
the rounds). `--reference HEAD` measures the same engine on both sides: the figures' bias.

    python benchmarks/train_throughput.py --episodes 48 --new-episodes 640
    python benchmarks/train_throughput.py --gin-param 'train.view="placed"' --gin-param train.refresh_every=1
    python benchmarks/train_throughput.py --reference HEAD --episodes 192 --new-episodes 192
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REFERENCE = "46ab397"  # main before the lockstep engine (issue "Placeto that learns")

# Runs inside the engine's own checkout (PYTHONPATH): prints one JSON line.
_PROBE = r"""
import json, sys
import tfplaceto as tp
try:
    from tfplaceto.policy.observation import graph_statics
except ImportError:  # engines from before policy/observation.py (the reference) keep it in features
    from tfplaceto.policy.features import graph_statics
from tfplaceto.problem import make_problem
from tfplaceto.rl.train import train
graph, cluster, episodes, bindings = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
op_graph = tp.import_graph("builtin:" + graph)
cluster = tp.Cluster.preset(cluster)
problem = make_problem(op_graph, cluster, tp.profile(op_graph, cluster))
import os
configuration = os.path.join("tfplaceto", "policy", "train.gin")
if os.path.exists(configuration):  # the engine's training configuration, when it has one
    import gin
    gin.parse_config_file(configuration)
    gin.bind_parameter("train.select_every", None)  # evaluation for model selection: not training
    gin.parse_config(bindings)  # --gin-param (this engine only)
import time
cpu = []  # the process's CPU time (all threads) when each episode's entry is logged (after its update)
result = train(problem, episodes=episodes, seed=0, progress=False, callback=lambda entry: cpu.append(time.process_time()))
# Steady state: from the end of the first update (tracing done) to the end of the last.
history = result.history
first = [h for h in history if h["update"] == history[0]["update"]]
timed = len(history) - len(first)
wall = history[-1]["wall_s"] - first[-1]["wall_s"]
cpu_s = cpu[-1] - cpu[len(first) - 1]
steps = graph_statics(problem).num_steps  # every episode visits every class once
print(json.dumps({"episodes": timed, "decisions": timed * steps, "wall_s": wall, "cpu_s": cpu_s}))
"""


def start(checkout: str, graph: str, cluster: str, episodes: int, bindings=()) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": checkout, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.Popen([sys.executable, "-c", _PROBE, graph, cluster, str(episodes), json.dumps(list(bindings))],
                            env=env,
                            cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(process: subprocess.Popen, checkout: str) -> dict:
    stdout, stderr = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"the engine in {checkout} failed:\n{stderr[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def total(rows: list[dict]) -> dict:
    """The rounds of one engine summed."""
    return {key: sum(row[key] for row in rows) for key in ("episodes", "decisions", "wall_s", "cpu_s")}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graph", default="cifar10-cells/0")
    parser.add_argument("--cluster", default="4xV100")
    parser.add_argument("--episodes", type=int, default=48,
                        help="the reference engine's episodes (the first update's are not timed)")
    parser.add_argument("--new-episodes", type=int, default=640,
                        help="this engine's episodes: more, so that both run for about the same time")
    parser.add_argument("--reference", default=REFERENCE, help="git commit of the reference engine")
    parser.add_argument("--gin-param", action="append", default=[], metavar="BINDING",
                        help="a gin binding applied after train.gin to this engine only (repeatable), "
                             "e.g. --gin-param 'train.view=\"placed\"'")
    parser.add_argument("--mode", choices=("interleaved", "concurrent"), default="interleaved",
                        help="one engine at a time, alternating (default), or both at once")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (each engine once a round)")
    args = parser.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows: dict[str, list[dict]] = {"reference": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="tfplaceto-reference-") as tmp:
        checkout = os.path.join(tmp, "reference")
        subprocess.run(["git", "-C", here, "worktree", "add", "--detach", checkout, args.reference],
                       check=True, capture_output=True)
        engines = {"reference": lambda: start(checkout, args.graph, args.cluster, args.episodes),
                   "new": lambda: start(here, args.graph, args.cluster, args.new_episodes, args.gin_param)}
        where = {"reference": checkout, "new": here}
        processes = []
        try:
            if args.mode == "concurrent":  # both at the same time, so that they share the machine's load alike
                processes = {name: launch() for name, launch in engines.items()}
                for name, process in processes.items():
                    rows[name].append(result(process, where[name]))
            else:
                for turn in range(max(args.rounds, 1)):
                    # Alternate which goes first, so that a drifting load reaches both alike.
                    for name in (("reference", "new") if turn % 2 == 0 else ("new", "reference")):
                        process = engines[name]()
                        processes = {name: process}
                        rows[name].append(result(process, where[name]))
        finally:
            for process in processes.values():
                process.kill()
            subprocess.run(["git", "-C", here, "worktree", "remove", "--force", checkout], check=False,
                           capture_output=True)
    if args.gin_param:
        print("this tree's engine with: " + " ".join(args.gin_param))
    print(f"mode: {args.mode}" + (f", {len(rows['new'])} rounds" if args.mode == "interleaved" else ""))
    print(f"{'engine':<28} {'episodes':>8} {'decisions':>10} {'wall s':>8} {'cpu s':>8} {'episodes/s':>10} "
          f"{'decisions/s':>12} {'decisions/cpu-s':>16}")
    reference, new = total(rows["reference"]), total(rows["new"])
    for label, row in ((f"reference ({args.reference})", reference), ("lockstep (this tree)", new)):
        print(f"{label:<28} {row['episodes']:>8} {row['decisions']:>10} {row['wall_s']:>8.1f} {row['cpu_s']:>8.1f} "
              f"{row['episodes'] / row['wall_s']:>10.2f} {row['decisions'] / row['wall_s']:>12.1f} "
              f"{row['decisions'] / row['cpu_s']:>16.1f}")
    new_cpu, reference_cpu = new["decisions"] / new["cpu_s"], reference["decisions"] / reference["cpu_s"]
    print(f"cpu-time: new {new_cpu:.0f}/cpu-s vs reference {reference_cpu:.0f}/cpu-s decisions = "
          f"{new_cpu / reference_cpu:.2f}x")
    new_rate = new["decisions"] / new["wall_s"]
    reference_rate = reference["decisions"] / reference["wall_s"]
    print(f"throughput: new {new_rate:.0f}/s vs reference {reference_rate:.0f}/s decisions = "
          f"{new_rate / reference_rate:.2f}x")


if __name__ == "__main__":
    main()
