"""The baselines on a graph's while-loop form: placed and simulated as `tfplaceto bench` does.

`tfplaceto bench` imports a graph for each cluster's device type, so on a GPU cluster a Keras
LSTM is cuDNN's fused op and its loops are gone. This places the loop form (the standard
implementation, imported without a cluster: what runs on CPUs, or where cuDNN cannot be used)
on GPU clusters, to see how the placers handle a body whose transfers repeat every iteration.

Run: .venv/bin/python benchmarks/loop_baselines.py [--graph nmt_2l_loop] [--clusters 4xV100]
     [--methods single expert m_etf m_sct heft]
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="nmt_2l_loop")
    parser.add_argument("--clusters", nargs="+", default=["4xV100"])
    parser.add_argument("--methods", nargs="+", default=["single", "expert", "m_etf", "m_sct", "heft"])
    args = parser.parse_args(argv)

    import tfplaceto as tp
    from tfplaceto.place import place_problem
    from tfplaceto.problem import make_problem

    warnings.simplefilter("ignore")  # the standard implementation on a GPU cluster, on purpose
    start = time.perf_counter()
    graph = tp.import_graph(f"builtin:{args.graph}")
    print(f"{args.graph}: {graph.num_ops} ops, {len(graph.loops)} loops, imported in "
          f"{time.perf_counter() - start:.0f} s", flush=True)
    for cluster_name in args.clusters:
        cluster = tp.Cluster.preset(cluster_name)
        problem = make_problem(graph, cluster, tp.profile(graph, cluster))
        simulator = problem.simulator()
        for method in args.methods:
            start = time.perf_counter()
            step, _, oom = simulator.run(place_problem(problem, method, 0))
            print(f"  {cluster_name} {method:8s} {step * 1e3:8.1f} ms{' OOM' if oom else ''}  "
                  f"(placed in {time.perf_counter() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
