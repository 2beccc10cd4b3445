"""Measured vs simulated step times of a Keras LSTM's training step, while-loop and unrolled.

A Keras LSTM is a while loop unless `unroll=True`; both forms compute the same thing. For a
two-layer LSTM text classifier (embedding, LSTM, LSTM, dense; Adam) in each form, on the two
logical CPU devices of `local:2`, it measures (`tp.measure`, median of `--runs` steps) and
simulates (`tp.simulate` with measured op costs, `tp.profile(..., source="measured")`) three
placements:
  single       everything on CPU:0;
  layers       the second LSTM layer (forward and gradient) on CPU:1, the rest on CPU:0;
  split_body   the MatMuls of the recurrent steps on CPU:1, everything else on CPU:0: every
               step's tensors cross devices both ways (per loop iteration in the loop form).
and prints, side by side, simulated and measured times, their ratio, and the loop / unrolled
ratio of each. Measured steps run with grappler off, as the op costs are traced.

Run: .venv/bin/python benchmarks/loop_fidelity.py [--steps 32] [--units 128] [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout without an install
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CPU = "/job:localhost/replica:0/task:0/device:CPU:{}"


def build_model(unroll: bool, steps: int, units: int, batch: int, vocab: int = 2000):
    """Embedding -> LSTM -> LSTM -> Dense(2), compiled with Adam: its training step."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    layers = tf.keras.layers
    model = tf.keras.Sequential([
        tf.keras.Input((steps,), batch_size=batch, dtype="int32"),
        layers.Embedding(vocab, units, name="embedding"),
        layers.LSTM(units, unroll=unroll, return_sequences=True, name="lstm_a"),
        layers.LSTM(units, unroll=unroll, name="lstm_b"),
        layers.Dense(2, name="logits"),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def placements(op_graph) -> dict[str, dict[str, str]]:
    """single, layers (lstm_b and its gradient on CPU:1), split_body (recurrent MatMuls on CPU:1)."""
    names, types = op_graph.names, op_graph.types
    # A recurrent step's MatMul: in a loop body (loop form) or reading the recurrent kernel at
    # one of the unrolled steps (unrolled form: named .../MatMul_<k> under an lstm scope).
    recurrent = {n for n, t, it in zip(names, types, op_graph.iterations)
                 if t == "MatMul" and (it > 1 or ("lstm_" in n and "/MatMul" in n))}
    return {
        "single": {n: CPU.format(0) for n in names},
        "layers": {n: CPU.format(int("lstm_b" in n)) for n in names},
        "split_body": {n: CPU.format(int(n in recurrent)) for n in names},
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=32, help="sequence length (loop trips)")
    parser.add_argument("--units", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=10, help="timed steps per placement")
    args = parser.parse_args(argv)

    import tensorflow as tf

    import tfplaceto as tp

    cluster = tp.Cluster.local(cpus=2)
    no_grappler = tf.compat.v1.ConfigProto()
    no_grappler.graph_options.rewrite_options.disable_meta_optimizer = True
    rows = {}
    for form, unroll in (("loop", False), ("unrolled", True)):
        start = time.perf_counter()
        graph = tp.import_graph(build_model(unroll, args.steps, args.units, args.batch),
                                batch_size=args.batch)
        costs = tp.profile(graph, cluster, source="measured", use_cache=False)
        loops = ", ".join(f"{loop['trips']} trips ({loop['source'].split(':')[0]})"
                          for loop in graph.loop_report()) or "none"
        print(f"[{form}] {graph.num_ops} ops, loops: {loops}; import + measured profile "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        for label, placement in placements(graph).items():
            simulated = tp.simulate(graph, placement, cluster, costs=costs)
            measured = tp.measure(graph, placement, target=cluster, runs=args.runs, config=no_grappler)
            rows[(form, label)] = (simulated.step_time_s, measured.step_time_s)
            print(f"  {label:11s} simulated {simulated.step_time_s * 1e3:8.2f} ms  measured "
                  f"{measured.step_time_s * 1e3:8.2f} ms  sim/meas {simulated.step_time_s / measured.step_time_s:5.2f}"
                  f"  ({simulated.transfer_bytes / 1e6:.1f} MB moved)", flush=True)
    print("loop / unrolled:")
    for label in ("single", "layers", "split_body"):
        (sim_loop, meas_loop), (sim_unrolled, meas_unrolled) = rows[("loop", label)], rows[("unrolled", label)]
        print(f"  {label:11s} simulated {sim_loop / sim_unrolled:5.2f}  measured {meas_loop / meas_unrolled:5.2f}")


if __name__ == "__main__":
    main()
