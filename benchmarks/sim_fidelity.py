"""How well the simulator's step times track real ones on a 2-task TensorFlow cluster.

Two real workloads, each a compiled Keras model's training step (forward, backward, Adam update):
a small CNN (convolutions, max pooling, dense layers; > 600 ops) and a small attention model (a
transformer encoder block: multi-head self-attention, layer norms, a feed-forward block). For each,
20+ placements over the two worker tasks of a `LocalTFCluster(2)` (single device, round robin,
random, biased random, topological pipeline splits, layer-wise splits, and every baseline
`tfplaceto.place` has) are measured for real, in `--rounds` interleaved rounds (a new shuffled
order each round, `measure_many`), and simulated twice with the same op costs:

- **calibrated**: the cluster `tfplaceto calibrate` would write for these tasks: links, each
  task's speed factor (`compute_scale`, the reference op chain timed on each task), the
  contention between the tasks (both on one host: a `ContentionGroup`, the chain timed on both at
  once) and the runtime's costs (`tfplaceto.measure.runtime`: what a control edge crossing tasks
  costs, the fixed costs of a step, whether a task's sends wait until it is idle), all measured
  before any placement;
- **uncalibrated**: the same links, no speed factor, no contention (the model before issue 15).

It prints both simulated times and the measured time of each placement with the spread of its
rounds, then per workload and model the Spearman rank correlation and the mean absolute
percentage error, and ends with the lines

  fidelity[cnn]: spearman S mape M (uncalibrated: spearman S0 mape M0)
  fidelity[attention]: ...
  fidelity: spearman S mape M (uncalibrated: spearman S0 mape M0)

the last one the mean over the workloads. Before them, per workload, the calibrated model with
each runtime cost left out in turn (an ablation: which measured figure moves the fidelity). Op
costs are traced on worker task 0 itself (`calibrate_op_costs`: its pinned core, its thread
pools) and scaled so that they sum to the same graph's untraced step on task 0 minus the
measured fixed step cost (`scale_to_untraced`: tracing changes what it times); both models use
these costs, and the ablation shows the traced ones. The placement simulated is the one
measured: the devices `apply_placement` actually wrote (it enforces colocation and may move ops a
placer left free). Measured steps run with grappler off, as the op costs are traced
(`--grappler` measures with TensorFlow's default graph optimizations instead). Nothing is fitted
to the placements: the calibration sees only the reference chain and the transfer graphs.

Run: .venv/bin/python benchmarks/sim_fidelity.py [--batch-size 32] [--runs 5] [--rounds 3]
     [--random 6] [--workloads cnn attention] [--grappler]
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


def build_attention_model(seed: int = 0):
    """A transformer encoder block over 16 tokens of 64 features, classifying the sequence."""
    import tensorflow as tf

    tf.keras.utils.set_random_seed(seed)
    layers = tf.keras.layers
    inputs = tf.keras.Input((16, 64))
    x = layers.Dense(64, name="proj")(inputs)
    attended = layers.MultiHeadAttention(num_heads=4, key_dim=16, name="attn")(x, x)
    x = layers.LayerNormalization(name="norm1")(x + attended)
    hidden = layers.Dense(128, activation="relu", name="ffn1")(x)
    x = layers.LayerNormalization(name="norm2")(x + layers.Dense(64, name="ffn2")(hidden))
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    outputs = layers.Dense(10, name="logits")(x)
    model = tf.keras.Model(inputs, outputs)
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


# name -> (model builder, its layers in order, two layer-wise splits: (label, layers on task 1))
WORKLOADS = {
    "cnn": (build_model, ("conv1", "conv2", "conv3", "conv4", "fc1", "fc2", "logits"),
            (("convs|fcs", {"fc1", "fc2", "logits"}), ("alternate_layers", {"conv2", "conv4", "fc2"}))),
    "attention": (build_attention_model, ("proj", "attn", "norm1", "ffn1", "ffn2", "norm2", "logits"),
                  (("attn|ffn", {"ffn1", "ffn2", "norm2", "logits"}),
                   ("alternate_layers", {"attn", "ffn1", "norm2"}))),
}


def placements(op_graph, cluster, costs, n_random: int, seed: int = 0, layer_names=WORKLOADS["cnn"][1],
               layer_splits=WORKLOADS["cnn"][2]) -> dict[str, dict[str, str]]:
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
    for method in baselines.METHODS:
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
    for label, second in layer_splits:
        placement = {}
        for n in names:
            layer = next((lay for lay in layer_names if f"/{lay}/" in f"/{n}/"), None)
            placement[n] = d1 if layer in second else d0
        result[f"layers:{label}"] = placement
    return result


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


def scores(simulated: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    """(Spearman rank correlation, mean absolute percentage error in %)."""
    from scipy.stats import spearmanr

    return float(spearmanr(simulated, measured)[0]), float(np.mean(np.abs(simulated - measured) / measured) * 100)


def summarize(label: str, simulated: np.ndarray, measured: np.ndarray) -> None:
    from scipy.stats import spearmanr

    rho, p_value = spearmanr(simulated, measured)
    error = np.abs(simulated - measured)
    print(f"{label}: Spearman {rho:.3f} (p={p_value:.1e}), MAE {error.mean() * 1e3:.2f} ms, "
          f"MAPE {np.mean(error / measured) * 100:.1f}%, mean sim/measured "
          f"{np.mean(simulated / measured):.2f}")


def calibrate(tf_cluster, args):
    """(uncalibrated cluster: links only, calibrated cluster: links, speeds, contention)."""
    from tfplaceto.measure.calibrate import (
        calibrate_cluster,
        fit_link,
        fit_transfer_model,
        measure_transfers,
    )
    from tfplaceto.measure.devices import host_groups, measure_devices
    from tfplaceto.measure.runtime import measure_runtime

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
    uncalibrated = tf_cluster.cluster(links)
    groups = host_groups(tf_cluster)
    times = measure_devices(tf_cluster, groups=groups, rounds=args.rounds + 2, runs=args.runs)
    print(f"reference chain ({times.rounds} interleaved rounds of {times.runs} steps; spread = "
          "max - min of the round medians over their median):")
    for device, seconds in times.alone_s.items():
        print(f"  task {_task(device)} alone: {seconds * 1e3:.1f} ms (spread {times.alone_spread[device]:.0%})")
    for group, seconds in times.together_s.items():
        print(f"  tasks {', '.join(_task(d) for d in group)} at once: {seconds * 1e3:.1f} ms (spread "
              f"{times.together_spread[group]:.0%}) = {times.slowdown(group):.2f}x the slowest alone, "
              f"efficiency {times.efficiency(group):.2f}")
    runtime = measure_runtime(tf_cluster, rounds=args.rounds, runs=args.runs)
    print(f"runtime costs ({args.rounds} interleaved rounds of {args.runs} steps, medians): a step running "
          f"one NoOp {runtime.step_overhead_s * 1e6:.0f} us, another task adds {runtime.task_overhead_s * 1e6:.0f} us")
    for (a, b), hop in runtime.control_hop_s.items():
        print(f"  control edges task {_task(a)} -> task {_task(b)}: {hop * 1e6:.1f} us per edge (cross - stay at "
              f"{runtime.edges} edges: {', '.join(f'{x * 1e6:.0f}' for x in runtime.control_times_s[a, b])} us)")
    for device, ratio in runtime.wait_ratio.items():
        print(f"  task {_task(device)}'s sends wait until it is idle: {runtime.sends_wait_idle[device]} "
              f"(dependent - independent chains = {ratio:.2f} x its chain alone)")
    calibrated = calibrate_cluster(tf_cluster, device_times=times, links=links, runtime=runtime)
    print(f"calibrated model: compute_scale {[round(d.compute_scale, 3) for d in calibrated.devices]}, "
          f"contention {[(len(g.devices), round(g.efficiency, 3)) for g in calibrated.contention] or 'none'}")
    return uncalibrated, calibrated


def ablations(calibrated):
    """label -> the calibrated cluster with one runtime cost left out (and with all of them)."""
    import dataclasses

    from tfplaceto.cluster import Cluster, Link

    def variant(hops=True, fixed=True, wait=True):
        links = [Link(k.src, k.dst, k.bandwidth_bytes_per_s, k.latency_s, k.control_hop_s if hops else 0.0)
                 for k in calibrated.links()]
        devices = [dataclasses.replace(d, sends_wait_idle=d.sends_wait_idle and wait) for d in calibrated.devices]
        return Cluster(devices, links, name=calibrated.name, contention=calibrated.contention,
                       step_overhead_s=calibrated.step_overhead_s if fixed else 0.0,
                       task_overhead_s=calibrated.task_overhead_s if fixed else 0.0)

    return {"without control hops": variant(hops=False), "without fixed step costs": variant(fixed=False),
            "without sends waiting for idle": variant(wait=False),
            "without any runtime cost (session 7)": variant(hops=False, fixed=False, wait=False)}


def run_workload(name, tf_cluster, uncalibrated, calibrated, config, args):
    """Measures and simulates one workload; returns (simulated calibrated, uncalibrated, measured)."""
    import warnings

    import tfplaceto as tp
    from tfplaceto.measure import MeasurementWarning, measure_many
    from tfplaceto.measure.calibrate import calibrate_op_costs, scale_to_untraced, untraced_steps
    from tfplaceto.sim import Simulator

    builder, layer_names, layer_splits = WORKLOADS[name]
    op_graph = tp.import_graph(builder(), batch_size=args.batch_size)
    print(f"\n== workload {name}: Keras training step, batch {args.batch_size}: {op_graph}")
    traced = calibrate_op_costs(op_graph, tf_cluster, cluster=uncalibrated)
    steps = untraced_steps(op_graph, tf_cluster, runs=2 * args.runs, cluster=uncalibrated)
    costs = scale_to_untraced(traced, steps, fixed_s=calibrated.step_overhead_s)
    print(f"op costs traced on worker task 0: total {traced.compute_s.sum() * 1e3:.1f} ms per step; untraced "
          f"step {', '.join(f'{s * 1e3:.1f}' for s in steps.values())} ms; scaled total "
          f"{costs.compute_s.sum() * 1e3:.1f} ms ({costs.source})")
    chosen = {label: effective_placement(op_graph, p) for label, p in placements(
        op_graph, uncalibrated, costs, args.random, layer_names=layer_names, layer_splits=layer_splits).items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MeasurementWarning)
        measured_results = measure_many(op_graph, chosen, target=tf_cluster, rounds=args.rounds, runs=args.runs,
                                        config=config, seed=1)
    noisy = [w for w in caught if issubclass(w.category, MeasurementWarning)]
    print(f"measured {len(chosen)} placements in {args.rounds} interleaved rounds; load average {_load()}; "
          f"{len(noisy)} with rounds more than 10% apart")

    print("times in ms; task1 = share of the calibrated simulated compute on task 1; sends / ctrl = "
          "tensors sent and control edges crossing tasks;\nboth = simulated time both tasks compute "
          "at once (calibrated); spread = max - min of the round medians over their median")
    print(f"  {'placement':<24} {'task1':>5} {'sends':>5} {'ctrl':>5} {'both':>6} {'sim':>8} "
          f"{'sim(unc)':>8} {'measured':>9} {'spread':>6}")
    calibrated_sim = Simulator(op_graph, calibrated, costs)
    uncalibrated_sim = Simulator(op_graph, uncalibrated, costs)
    rows = []
    for label, placement in chosen.items():
        simulated = calibrated_sim.result(calibrated_sim.device_array(placement))
        sim = simulated.step_time_s
        sim_unc = uncalibrated_sim.run(uncalibrated_sim.device_array(placement))[0]
        measured = measured_results[label].step_time_s
        on_task1 = simulated.busy_s[calibrated.device_names[1]]
        share = on_task1 / sum(simulated.busy_s.values())
        sends, control = crossings(op_graph, placement, calibrated)
        both = overlap_s(simulated)
        rows.append((sim, sim_unc, measured, control, both, on_task1))
        print(f"  {label:<24} {share:5.0%} {sends:5d} {control:5d} {both * 1e3:6.1f} {sim * 1e3:8.2f} "
              f"{sim_unc * 1e3:8.2f} {measured * 1e3:9.2f} {measured_results[label].spread:6.0%}")
    simulated, simulated_unc, measured, control, both, on_task1 = (np.array(c, dtype=float) for c in zip(*rows))
    groups: dict[tuple, list[int]] = {}
    for k, placement in enumerate(chosen.values()):
        groups.setdefault(tuple(placement[n] for n in op_graph.names), []).append(k)
    labels = list(chosen)
    for members in (m for m in groups.values() if len(m) > 1):
        times = measured[members]
        print(f"identical placements {', '.join(labels[k] for k in members)}: measured "
              f"{times.min() * 1e3:.1f}-{times.max() * 1e3:.1f} ms (max/min {times.max() / times.min():.2f})")
    summarize(f"{name} calibrated  ", simulated, measured)
    summarize(f"{name} uncalibrated", simulated_unc, measured)
    for label, (cluster, profile) in {**{k: (v, costs) for k, v in ablations(calibrated).items()},
                                      "with the traced op costs (not scaled)": (calibrated, traced)}.items():
        ablated = Simulator(op_graph, cluster, profile)
        times = np.array([ablated.run(ablated.device_array(p))[0] for p in chosen.values()])
        rho, mape = scores(times, measured)
        print(f"  calibrated {label:<38} Spearman {rho:.3f}, MAPE {mape:.1f}%")
    # Where the remaining error comes from (a diagnosis; nothing here feeds back).
    residual = measured - simulated
    factors = {"control edges crossing tasks": (control, 1e6, "us per edge"),
               "simulated time both tasks compute": (both, 1.0, "s per s"),
               "simulated compute on task 1": (on_task1, 1.0, "s per s")}
    design = np.column_stack([f for f, _, _ in factors.values()] + [np.ones_like(residual)])
    joint = np.linalg.lstsq(design, residual, rcond=None)[0]
    print("measured - simulated (calibrated) against:")
    for (label, (values, scale, unit)), coefficient in zip(factors.items(), joint):
        r = np.corrcoef(residual, values)[0, 1] if np.ptp(values) > 0 else float("nan")
        print(f"  {label:<48} Pearson r {r:5.2f}, joint least-squares {coefficient * scale:7.3f} {unit}")
    return simulated, simulated_unc, measured


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5, help="timed steps per placement and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved measurement rounds (>= 3)")
    parser.add_argument("--random", type=int, default=6, help="random placements")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--grappler", action="store_true", help="measure with grappler on")
    args = parser.parse_args(argv)

    import tensorflow as tf

    from tfplaceto.measure import LocalTFCluster

    config = None
    if not args.grappler:
        config = tf.compat.v1.ConfigProto()
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        config.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0

    started = time.perf_counter()
    print(f"host: {os.cpu_count()} cores, load average {_load()} (other processes share these cores)")
    results = {}
    with LocalTFCluster(2) as tf_cluster:
        print(f"cluster: {tf_cluster.description}, cores per task {tf_cluster.core_sets}, "
              f"intra/inter-op threads {tf_cluster.intra_op_threads}/{tf_cluster.inter_op_threads} "
              f"(up in {time.perf_counter() - started:.1f} s)")
        uncalibrated, calibrated = calibrate(tf_cluster, args)
        for name in args.workloads:
            results[name] = run_workload(name, tf_cluster, uncalibrated, calibrated, config, args)
    print(f"(total {time.perf_counter() - started:.0f} s, load average {_load()})")
    lines = {}
    for name, (simulated, simulated_unc, measured) in results.items():
        lines[name] = (*scores(simulated, measured), *scores(simulated_unc, measured))
    for name, (rho, mape, rho0, mape0) in lines.items():
        print(f"fidelity[{name}]: spearman {rho:.3f} mape {mape:.1f}% (uncalibrated: spearman {rho0:.3f} "
              f"mape {mape0:.1f}%)")
    rho, mape, rho0, mape0 = np.mean(list(lines.values()), axis=0)
    print(f"fidelity: spearman {rho:.3f} mape {mape:.1f}% (uncalibrated: spearman {rho0:.3f} mape {mape0:.1f}%)")


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _task(device: str) -> str:
    return device.split("/task:")[1].split("/")[0]


if __name__ == "__main__":
    main()
