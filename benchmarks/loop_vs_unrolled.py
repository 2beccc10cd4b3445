"""The same Keras LSTM model as while loops and unrolled: simulated single-GPU step, side by side.

A Keras LSTM is a while loop unless `unroll=True`; both forms compute the same thing, so their
simulated step times on one GPU should agree. The model is issue 17's: a two-layer LSTM(256)
text classifier (embedding 5000 x 128, sequence 32, batch 32, Adam), training step imported
from Keras, analytical costs for 4xV100, everything on GPU:0. For each form it prints the ops,
the loops and their trip counts, the total GPU compute, the simulated step and peak memory, and
the loop / unrolled ratios. The loop form is the standard implementation (imported without a
cluster); "cudnn" is the same model imported for the cluster, whose GPUs run cuDNN's fused LSTM
ops instead (what TensorFlow runs there). `--ignore-trips` also prints the loop form costed as
before issue 17 (every body op once): the gap the trip counts close.

Run: .venv/bin/python benchmarks/loop_vs_unrolled.py [--units 256] [--steps 32] [--cluster 4xV100]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout without an install
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build_model(unroll: bool, units: int, steps: int, batch: int):
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    layers = tf.keras.layers
    model = tf.keras.Sequential([
        tf.keras.Input((steps,), batch_size=batch, dtype="int32"),
        layers.Embedding(5000, 128),
        layers.LSTM(units, unroll=unroll, return_sequences=True),
        layers.LSTM(units, unroll=unroll),
        layers.Dense(2),
    ])
    model.compile(optimizer="adam",
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--cluster", default="4xV100")
    parser.add_argument("--ignore-trips", action="store_true",
                        help="also simulate the loop form with every body op costed once")
    args = parser.parse_args(argv)

    import tfplaceto as tp

    cluster = tp.Cluster.preset(args.cluster)
    gpu = next(d for d in cluster.devices if d.type == "GPU")
    column = cluster.kinds.index(gpu.kind)
    steps = {}
    for form, unroll, target in (("loop", False, None), ("unrolled", True, None), ("cudnn", False, cluster)):
        graph = tp.import_graph(build_model(unroll, args.units, args.steps, args.batch),
                                batch_size=args.batch, cluster=target)
        costs = tp.profile(graph, cluster, use_cache=False)
        placement = {name: gpu.name for name in graph.names}
        result = tp.simulate(graph, placement, cluster, costs=costs)
        steps[form] = result.step_time_s
        trips = sorted({(loop.trips, loop.source.split(":")[0]) for loop in graph.loops})
        print(f"{form:9s} {graph.num_ops:5d} ops, {len(graph.loops)} loops (trips, source: {trips}); "
              f"GPU compute {costs.compute_s[:, column].sum() * 1e3:.3f} ms; single-GPU step "
              f"{result.step_time_s * 1e3:.3f} ms, peak {result.peak_memory_bytes[gpu.name] / 1e6:.1f} MB",
              flush=True)
        if form == "loop" and args.ignore_trips:
            once = tp.CostProfile(costs.op_names, costs.device_kinds,
                                  costs.compute_s / graph.iterations[:, None])
            steps["loop, body once"] = tp.simulate(graph, placement, cluster, costs=once).step_time_s
            print(f"{'':9s} every body op costed once: single-GPU step "
                  f"{steps['loop, body once'] * 1e3:.3f} ms")
    for form, step in steps.items():
        if form != "unrolled":
            print(f"{form} / unrolled: {step / steps['unrolled']:.2f}")


if __name__ == "__main__":
    main()
