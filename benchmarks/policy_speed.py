"""What running the policy costs: building an Actor, a greedy episode, a search's perturbation.

`method="placeto"` has 10 s (`search.BUDGET_S`). Before the policy's first move it builds an
`rl.acting.Actor` (traces the policy's function over the problem) and runs one greedy episode
(its own placement; the first call of the traced function also pays TensorFlow's graph
optimization and kernel creation); each search round then draws sampled episodes over a window
of `search.WINDOW` classes. What those take is time the search does not climb, so this benchmark
prints them per (graph, cluster), for the shipped policy (an ensemble) and, beside it, for one
untrained network of the shipped configuration without the ensemble (what a member costs):

  build       seconds to build the Actor (the trace);
  first       the first greedy episode from a random start (with the first call's warm-up);
  episode     a second greedy episode (warm): its seconds and milliseconds a step;
  perturb     a pair of sampled window episodes (one search round's policy draws, in lockstep).

The policy is loaded outside the timings. Graphs run in the order given; the first also pays what
a process pays once (numba's cache of the environment's kernels).

    python benchmarks/policy_speed.py [--graphs nmt_4l cifar10-cells/101] [--clusters 2xK80 8xV100]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout without an install
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def timed(call) -> tuple[float, object]:
    began = time.perf_counter()
    result = call()
    return time.perf_counter() - began, result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graphs", nargs="+", default=["nmt_4l", "cifar10-cells/101"])
    parser.add_argument("--clusters", nargs="+", default=["2xK80", "8xV100"])
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from tfplaceto import search
    from tfplaceto.policy.checkpoint import resolve_policy
    from tfplaceto.policy.network import PlacetoNetwork
    from tfplaceto.rl.acting import Actor
    from tfplaceto.rl.environment import PlacementEnvironment
    from tfplaceto.rl.train import problems_for

    shipped = resolve_policy("shipped", 0)
    single = PlacetoNetwork(**{**shipped.config, "ensemble": 1})
    policies = {f"shipped ({shipped.config['ensemble']} members)": shipped, "one network": single}
    print(f"{'graph':18} {'cluster':7} {'policy':22} {'steps':>5} {'build s':>8} {'first s':>8} "
          f"{'episode s':>9} {'ms/step':>8} {'perturb s':>9}")
    for graph in args.graphs:
        for cluster, problem in zip(args.clusters, problems_for([f"builtin:{graph}"], args.clusters)[0]):
            steps = len(PlacementEnvironment(problem).statics[0].steps)
            for name, network in policies.items():
                build_s, actor = timed(lambda: Actor(problem, network, 0))  # noqa: B023
                first_s, _ = timed(lambda: actor.episodes("random", 1, greedy=True, seed=0))  # noqa: B023
                episode_s, _ = timed(lambda: actor.episodes("random", 1, greedy=True, seed=1))  # noqa: B023
                perturb_s, _ = timed(lambda: actor.episodes("random", 2, greedy=False,  # noqa: B023
                                                            window=search.WINDOW, seed=2))
                print(f"{graph:18} {cluster:7} {name:22} {steps:5d} {build_s:8.2f} {first_s:8.2f} "
                      f"{episode_s:9.2f} {episode_s / steps * 1e3:8.2f} {perturb_s:9.3f}", flush=True)


if __name__ == "__main__":
    main()
