"""Training throughput: decisions/s and episodes/s of this engine against a reference commit's.

Both engines train on the same problem (default: cifar10-cells/0 on 4xV100) from fresh weights
for the same number of episodes, one after the other in this run, each in its own process: the
reference engine runs from a git worktree of `--reference` (default: the commit before the
lockstep engine), with that commit's own defaults; this engine with its defaults (32 lockstep
episodes per update). A decision is one action (one node placed). Tracing the compiled functions
is excluded: each engine first runs a short warm-up of its own.
Last line: `throughput: new D/s vs reference R/s decisions = X.XXx`.

    python benchmarks/train_throughput.py --episodes 128
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
import json, sys, time
import numpy as np
import tfplaceto as tp
from tfplaceto.problem import make_problem
from tfplaceto.rl.train import train
graph, cluster, episodes, warm_up, lanes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
op_graph = tp.import_graph("builtin:" + graph)
cluster = tp.Cluster.preset(cluster)
problem = make_problem(op_graph, cluster, tp.profile(op_graph, cluster))
kwargs = {} if lanes == "default" else {"lanes": int(lanes)}
train(problem, episodes=warm_up, seed=1, progress=False, **kwargs)  # traces the compiled functions
began = time.perf_counter()
result = train(problem, episodes=episodes, seed=0, progress=False, **kwargs)
wall = time.perf_counter() - began
decisions = getattr(result, "decisions", None)
if decisions is None:  # the reference engine does not count them: every episode visits every class
    from tfplaceto.policy import features
    decisions = result.episodes * features.graph_statics(problem).num_steps
print(json.dumps({"episodes": result.episodes, "decisions": int(decisions), "wall_s": wall}))
"""


def measure(checkout: str, graph: str, cluster: str, episodes: int, warm_up: int, lanes: str) -> dict:
    env = {**os.environ, "PYTHONPATH": checkout, "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run([sys.executable, "-c", _PROBE, graph, cluster, str(episodes), str(warm_up), lanes],
                         env=env, cwd=checkout, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the engine in {checkout} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graph", default="cifar10-cells/0")
    parser.add_argument("--cluster", default="4xV100")
    parser.add_argument("--episodes", type=int, default=128, help="episodes timed, per engine")
    parser.add_argument("--reference", default=REFERENCE, help="git commit of the reference engine")
    args = parser.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="tfplaceto-reference-") as tmp:
        checkout = os.path.join(tmp, "reference")
        subprocess.run(["git", "-C", here, "worktree", "add", "--detach", checkout, args.reference],
                       check=True, capture_output=True)
        try:
            reference = measure(checkout, args.graph, args.cluster, args.episodes, 4, "default")
        finally:
            subprocess.run(["git", "-C", here, "worktree", "remove", "--force", checkout], check=False,
                           capture_output=True)
    new = measure(here, args.graph, args.cluster, args.episodes, 32, "default")
    print(f"{'engine':<28} {'episodes':>8} {'decisions':>10} {'wall s':>8} {'episodes/s':>10} {'decisions/s':>12}")
    for label, row in ((f"reference ({args.reference})", reference), ("lockstep (this tree)", new)):
        print(f"{label:<28} {row['episodes']:>8} {row['decisions']:>10} {row['wall_s']:>8.1f} "
              f"{row['episodes'] / row['wall_s']:>10.2f} {row['decisions'] / row['wall_s']:>12.1f}")
    new_rate = new["decisions"] / new["wall_s"]
    reference_rate = reference["decisions"] / reference["wall_s"]
    print(f"throughput: new {new_rate:.0f}/s vs reference {reference_rate:.0f}/s decisions = "
          f"{new_rate / reference_rate:.2f}x")


if __name__ == "__main__":
    main()
