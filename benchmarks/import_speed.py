"""How long the front of the pipeline takes on Inception-V3: import, group, analytical profile.

Times, separately and in total, for the Inception-V3 training graph (batch 32) on the 4xV100
preset (target: under 10 s together):
1. import: `import_graph("builtin:inception_v3")` (building the Keras model, tracing its training
   step, inlining, shape inference, the OpGraph arrays). Falls back to a Keras InceptionV3 compiled
   with SGD + sparse categorical crossentropy imported at batch 32 when the built-in registry is
   missing.
2. group: `tfplaceto.graph.group(op_graph)`.
3. profile: `tfplaceto.costs.profile(op_graph, "4xV100", source="analytical")` with a fresh
   temporary cache directory, so grappler really runs (one pass per device kind); its
   cached second call is printed too.
TensorFlow's own import time is printed apart and not counted. Each stage shows wall seconds (what
the target is about) and this process's CPU seconds (less sensitive to a busy machine).

Run: .venv/bin/python benchmarks/import_speed.py [--batch-size N] [--cluster 4xV100]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout without an install
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TARGET_S = 10.0


def _import_inception(batch_size: int):
    """(op_graph, how it was built)."""
    from tfplaceto.graph import import_graph

    return import_graph("builtin:inception_v3", batch_size=batch_size), "builtin:inception_v3"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--cluster", default="4xV100")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    import tensorflow as tf  # noqa: F401

    from tfplaceto.cluster import as_cluster
    from tfplaceto.costs import profile
    from tfplaceto.graph import group

    print(f"(TensorFlow + tfplaceto import: {time.perf_counter() - start:.2f} s, not counted)")
    cluster = as_cluster(args.cluster)

    stages: dict[str, tuple[float, float]] = {}  # stage -> (wall s, process CPU s)

    def timed(stage: str, fn):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        stages[stage] = (time.perf_counter() - wall, time.process_time() - cpu)
        return result

    op_graph, built_from = timed("import", lambda: _import_inception(args.batch_size))
    grouping = timed("group", lambda: group(op_graph))
    with tempfile.TemporaryDirectory(prefix="tfplaceto-bench-") as cache_dir:
        costs = timed("profile", lambda: profile(op_graph, cluster, source="analytical",
                                                 cache_dir=cache_dir))
        start = time.perf_counter()
        profile(op_graph, cluster, source="analytical", cache_dir=cache_dir)
        cached_s = time.perf_counter() - start

    total = sum(wall for wall, _ in stages.values())
    print(f"Inception-V3 training graph ({built_from}), batch {args.batch_size}, cluster "
          f"{cluster.name}: {op_graph.num_ops} ops, {op_graph.num_edges} edges, "
          f"{grouping.num_groups} groups")
    for stage, (wall, cpu) in stages.items():
        print(f"  {stage:<8} {wall:7.2f} s   (process CPU {cpu:6.2f} s)")
    print(f"  {'total':<8} {total:7.2f} s   (target < {TARGET_S:.0f} s: "
          f"{'met' if total < TARGET_S else 'MISSED'})")
    if os.getloadavg()[0] > (os.cpu_count() or 1):
        print(f"  note: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: wall times "
              "include waiting for other processes")
    print(f"  profile from cache: {cached_s:.3f} s; profile source: {costs.source!r}")
    for k, kind in enumerate(costs.device_kinds):
        print(f"  sum of op costs on one {kind}: {costs.compute_s[:, k].sum() * 1e3:.1f} ms")
    return 0 if total < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
