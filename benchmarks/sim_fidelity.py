"""How well the simulator's step times track real ones on a 2-task TensorFlow cluster.

For a real model (a small Keras CNN's training step: forward, backward, Adam update; > 300 ops)
and 20+ placements over the two worker tasks of a `LocalTFCluster(2)` (single device, round
robin, random, biased random, topological pipeline splits, layer-wise splits, and every baseline
`tfplaceto.place` has), it prints the simulated and the measured step time of each placement,
then the Spearman rank correlation and the mean absolute (percentage) error.

The simulator gets:
- links calibrated on the same cluster (`calibrate_links`: bandwidth by least squares over
  sized transfers, latency per hop from bounced chains);
- op costs traced on worker task 0 itself (`calibrate_op_costs`: its pinned core, its thread
  pools), and, for comparison, `tfplaceto.costs.profile(..., source="measured")`, which runs the
  ops in this (unpinned) process under the "CPU:host" kind that the worker devices share.
The placement simulated is the one measured: the devices `apply_placement` actually wrote (it
enforces colocation and may move ops a placer left free).

Measured steps run with grappler off, as the op costs are traced (`--grappler` measures with
TensorFlow's default graph optimizations instead). The simulator is not tuned to this machine.

Run: .venv/bin/python benchmarks/sim_fidelity.py [--batch-size 32] [--runs 5] [--rounds 3]
     [--random 6] [--grappler]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # runnable from a checkout without an install
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def build_model(seed: int = 0):
    """A small CNN classifier for 32x32x3 images, compiled: its training step is the graph."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    layers = tf.keras.layers
    model = tf.keras.Sequential([
        tf.keras.Input((32, 32, 3)),
        layers.Conv2D(32, 3, padding="same", activation="relu", name="conv1"),
        layers.Conv2D(32, 3, padding="same", activation="relu", name="conv2"),
        layers.MaxPool2D(name="pool1"),
        layers.Conv2D(64, 3, padding="same", activation="relu", name="conv3"),
        layers.Conv2D(64, 3, padding="same", activation="relu", name="conv4"),
        layers.MaxPool2D(name="pool2"),
        layers.Flatten(name="flatten"),
        layers.Dense(256, activation="relu", name="fc1"),
        layers.Dense(128, activation="relu", name="fc2"),
        layers.Dense(10, name="logits"),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def placements(op_graph, cluster, costs, n_random: int, seed: int = 0) -> dict[str, dict[str, str]]:
    """name -> op placement over the cluster's two devices (see the module docstring)."""
    import tfplaceto as tp
    from tfplaceto import baselines

    names = list(op_graph.names)
    d0, d1 = cluster.device_names[:2]
    rng = np.random.default_rng(seed)
    result: dict[str, dict[str, str]] = {
        "single:task0": dict.fromkeys(names, d0),
        "single:task1": dict.fromkeys(names, d1),
    }
    for method in baselines.available():
        if method in ("single", "random"):
            continue
        budget = 10.0 if method == "local_search" else None
        try:
            result[method] = dict(tp.place(op_graph, cluster, method=method, costs=costs, budget_s=budget))
        except tp.errors.TfplacetoError as e:
            print(f"  (baseline {method} skipped: {e})")
    for s in range(n_random):
        result[f"random:{s}"] = dict(tp.place(op_graph, cluster, method="random", costs=costs, seed=s))
    for p in (0.1, 0.3):  # mostly on task 0: a few stray ops
        result[f"biased_random:{p}"] = {n: d1 if rng.random() < p else d0 for n in names}
    order = [names[i] for i in op_graph.topo_order]
    for fraction in (0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9):  # pipeline: a prefix of the topo order
        cut = int(fraction * len(order))
        result[f"topo_split:{fraction}"] = {n: d0 if k < cut else d1 for k, n in enumerate(order)}
    layers = ("conv1", "conv2", "conv3", "conv4", "fc1", "fc2", "logits")
    for label, second in (("convs|fcs", {"fc1", "fc2", "logits"}),
                          ("alternate_layers", {"conv2", "conv4", "fc2"})):
        placement = {}
        for n in names:
            layer = next((lay for lay in layers if f"/{lay}/" in f"/{n}/"), None)
            placement[n] = d1 if layer in second else d0
        result[f"layers:{label}"] = placement
    return result


def contention_check(tf_cluster, config, runs: int) -> None:
    """Prints how much slower two tasks computing at once are than each alone.

    A chain of 512x512 matmuls on one task, the same chain on the other, and one chain on each
    at the same time. The simulator assumes the last takes as long as the slower single chain.
    """
    import tensorflow as tf

    from tfplaceto.measure import measure

    def chains(count: int):
        graph = tf.Graph()
        with graph.as_default():
            for c in range(count):
                x = tf.constant(np.full((512, 512), 1e-3, np.float32), name=f"chain{c}/x")
                for k in range(20):
                    x = tf.matmul(x, x, name=f"chain{c}/matmul{k}")
        return graph.as_graph_def()

    devices = tf_cluster.devices
    one, two = chains(1), chains(2)
    alone = [measure(one, {n.name: d for n in one.node}, target=tf_cluster, runs=runs, config=config)
             for d in devices[:2]]
    together = measure(two, {n.name: devices[int(n.name[5])] for n in two.node}, target=tf_cluster,
                       runs=runs, config=config)
    slower = max(r.step_time_s for r in alone)
    print(f"contention: one matmul chain alone {alone[0].step_time_s * 1e3:.1f} ms on task 0, "
          f"{alone[1].step_time_s * 1e3:.1f} ms on task 1; one on each at once "
          f"{together.step_time_s * 1e3:.1f} ms = {together.step_time_s / slower:.2f}x the slower "
          "alone (1.00 = the simulator's assumption, 2.00 = no parallel speed-up)")


def effective_placement(op_graph, placement) -> dict[str, str]:
    """The device each op really gets once apply_placement enforced colocation and filled gaps."""
    import tfplaceto as tp

    placed = tp.apply_placement(op_graph.graph_def, placement)
    devices = {n.name: n.device for n in placed.node}
    return {n: devices[n] for n in op_graph.names}


def crossings(op_graph, placement, cluster) -> tuple[int, int]:
    """(tensors sent to another device, control edges between devices) of a placement."""
    device_of = np.array([cluster.index(placement[n]) for n in op_graph.names])
    producer_device = device_of[op_graph.tensor_producer[op_graph.edge_tensor]]
    consumer_device = device_of[op_graph.edge_consumer]
    crossing = producer_device != consumer_device
    sends = len({(int(t), int(d)) for t, d in zip(op_graph.edge_tensor[crossing], consumer_device[crossing])})
    control = int(np.sum(device_of[op_graph.control_senders] != device_of[op_graph.control_receivers]))
    return sends, control


def overlap_s(result) -> float:
    """Seconds during which the simulated schedule computes on both devices at once."""
    busy = []
    for d in range(2):
        mine = result.node_device == d
        order = np.argsort(result.node_start_s[mine])
        busy.append(list(zip(result.node_start_s[mine][order], result.node_end_s[mine][order])))
    total, i, j = 0.0, 0, 0
    (a, b) = busy
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize(label: str, simulated: np.ndarray, measured: np.ndarray) -> None:
    from scipy.stats import spearmanr

    rho, p_value = spearmanr(simulated, measured)
    error = np.abs(simulated - measured)
    print(f"{label}: Spearman {rho:.3f} (p={p_value:.1e}), MAE {error.mean() * 1e3:.2f} ms, "
          f"MAPE {np.mean(error / measured) * 100:.1f}%, mean sim/measured "
          f"{np.mean(simulated / measured):.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5, help="timed steps per placement and round")
    parser.add_argument("--rounds", type=int, default=3, help="measurement rounds over all placements")
    parser.add_argument("--random", type=int, default=6, help="random placements")
    parser.add_argument("--grappler", action="store_true", help="measure with grappler on")
    args = parser.parse_args(argv)

    import tensorflow as tf

    import tfplaceto as tp
    from tfplaceto.measure import LocalTFCluster, measure
    from tfplaceto.measure.calibrate import (
        calibrate_op_costs,
        fit_link,
        fit_transfer_model,
        measure_transfers,
    )

    op_graph = tp.import_graph(build_model(), batch_size=args.batch_size)
    print(f"model: Keras CNN training step, batch {args.batch_size}: {op_graph}")
    config = None
    if not args.grappler:
        config = tf.compat.v1.ConfigProto()
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0

    started = time.perf_counter()
    print(f"host: {os.cpu_count()} cores, load average {_load()} (other processes share these cores)")
    with LocalTFCluster(2) as tf_cluster:
        print(f"cluster: {tf_cluster.description}, cores per task {tf_cluster.core_sets}, "
              f"intra/inter-op threads {tf_cluster.intra_op_threads}/{tf_cluster.inter_op_threads} "
              f"(up in {time.perf_counter() - started:.1f} s)")

        contention_check(tf_cluster, config, args.runs * 2)
        links = []
        print("\ncalibrated links (transfer = step with the transfer - step without; hop latency = "
              "slope of bounced chains over their length):")
        for transfers in measure_transfers(tf_cluster):
            link = fit_link(transfers)
            intercept, _ = fit_transfer_model(transfers)
            links.append(link)
            print(f"  task {_task(link.src)} -> task {_task(link.dst)}: hop latency "
                  f"{link.latency_s * 1e6:.0f} us, bandwidth {link.bandwidth_bytes_per_s / 1e9:.3f} GB/s "
                  f"(fit intercept {intercept * 1e6:.0f} us = latency + fixed cost of a second task)")
            chain = ", ".join(f"{m} hops {s * 1e3:.3f} ms" for m, s in zip(transfers.hops, transfers.hop_seconds))
            print(f"    chains: {chain}")
            for size, seconds in zip(transfers.sizes_bytes, transfers.seconds):
                model = intercept + size / link.bandwidth_bytes_per_s
                print(f"    {size:>10,d} B  measured {seconds * 1e3:8.3f} ms  fit {model * 1e3:8.3f} ms")
        cluster = tf_cluster.cluster(links)

        worker_costs = calibrate_op_costs(op_graph, tf_cluster, cluster=cluster)
        print(f"\nop costs traced on worker task 0: total {worker_costs.compute_s.sum() * 1e3:.1f} ms "
              f"per step ({worker_costs.source})")
        try:
            local_costs = tp.profile(op_graph, cluster, source="measured", use_cache=False)
            how = "tp.profile(source='measured') on this process's CPU:0 (kind CPU:host)"
        except tp.errors.CostProfileError as e:
            print(f"  measured profile for the worker cluster failed ({e}); using local:1")
            local_costs = tp.profile(op_graph, "local:1", source="measured", use_cache=False)
            how = "tp.profile('local:1', source='measured'), kind CPU:host mapped"
        print(f"op costs, {how}: total {local_costs.compute_s.sum() * 1e3:.1f} ms per step")

        chosen = {label: effective_placement(op_graph, p)
                  for label, p in placements(op_graph, cluster, worker_costs, args.random).items()}
        # Rounds in a different order each: a burst of load from elsewhere on the host then
        # spreads over many placements instead of inflating a few.
        samples: dict[str, list[float]] = {label: [] for label in chosen}
        rng = np.random.default_rng(1)
        for r in range(args.rounds):
            for label in rng.permutation(list(chosen)):
                result = measure(op_graph, chosen[label], target=tf_cluster, runs=args.runs, config=config)
                samples[label] += result.step_times_s
            print(f"  measured round {r + 1}/{args.rounds}; load average {_load()}")

        print(f"\n{len(chosen)} placements; times in ms; task1 = share of the simulated compute on "
              "task 1; sends / ctrl = tensors sent and control edges crossing tasks;\nboth = simulated "
              "time both tasks compute at once; sim = simulated with worker-traced op costs, sim(loc) "
              "with in-process ones;\nspread = 10th-90th percentile of the measured steps")
        print(f"  {'placement':<24} {'task1':>5} {'sends':>5} {'ctrl':>5} {'both':>6} {'sim':>8} "
              f"{'sim(loc)':>8} {'measured':>9} {'spread':>13}")
        rows = []
        for label, placement in chosen.items():
            simulated = tp.simulate(op_graph, placement, cluster, worker_costs)
            sim = simulated.step_time_s
            sim_local = tp.simulate(op_graph, placement, cluster, local_costs).step_time_s
            measured = float(np.median(samples[label]))
            on_task1 = simulated.busy_s[cluster.device_names[1]]
            share = on_task1 / sum(simulated.busy_s.values())
            sends, control = crossings(op_graph, placement, cluster)
            both = overlap_s(simulated)
            low, high = np.percentile(samples[label], [10, 90])
            rows.append((sim, sim_local, measured, control, both, on_task1))
            print(f"  {label:<24} {share:5.0%} {sends:5d} {control:5d} {both * 1e3:6.1f} {sim * 1e3:8.2f} "
                  f"{sim_local * 1e3:8.2f} {measured * 1e3:9.2f} {low * 1e3:6.1f}-{high * 1e3:<6.1f}")
    simulated, simulated_local, measured, control, both, on_task1 = (np.array(c, dtype=float)
                                                                     for c in zip(*rows))
    print()
    # Different methods can produce the same placement: their spread is the measurement noise.
    groups: dict[tuple, list[int]] = {}
    for k, placement in enumerate(chosen.values()):
        groups.setdefault(tuple(placement[n] for n in op_graph.names), []).append(k)
    labels = list(chosen)
    for members in (m for m in groups.values() if len(m) > 1):
        times = measured[members]
        print(f"identical placements {', '.join(labels[k] for k in members)}: measured "
              f"{times.min() * 1e3:.1f}-{times.max() * 1e3:.1f} ms (max/min {times.max() / times.min():.2f})")
    summarize("worker-traced op costs", simulated, measured)
    summarize("in-process op costs  ", simulated_local, measured)
    # Where the error comes from (a diagnosis; nothing here feeds back into the simulator):
    # measured - simulated against what the simulator does not model.
    residual = measured - simulated
    factors = {"control edges crossing tasks (charged nothing)": (control, 1e6, "us per edge"),
               "simulated time both tasks compute (contention)": (both, 1.0, "s per s"),
               "simulated compute on task 1 (costs traced on task 0)": (on_task1, 1.0, "s per s")}
    design = np.column_stack([f for f, _, _ in factors.values()] + [np.ones_like(residual)])
    joint = np.linalg.lstsq(design, residual, rcond=None)[0]
    print("measured - simulated against:")
    for (label, (values, scale, unit)), coefficient in zip(factors.items(), joint):
        r = np.corrcoef(residual, values)[0, 1] if np.ptp(values) > 0 else float("nan")
        print(f"  {label:<54} Pearson r {r:5.2f}, joint least-squares {coefficient * scale:7.3f} {unit}")
    print(f"(total {time.perf_counter() - started:.0f} s)")


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _task(device: str) -> str:
    return device.split("/task:")[1].split("/")[0]


if __name__ == "__main__":
    main()
