"""Calibrated devices (issue 15): speed factors, contention, cluster files, repeatable measurement.

- The simulator's contention model (processor sharing within a ContentionGroup) against schedules
  worked out by hand, and "efficiency 1 = no contention" on seeded random DAGs.
- compute_scale: a device's column of a CostProfile is its kind's times its scale.
- Cluster files: save / load / as_cluster(path) round trips, presets unchanged, typed errors.
- DeviceTimes arithmetic (scales, efficiency, the contention threshold), host grouping.
- measure_many on real logical CPUs (interleaved rounds, spread), the spread warning.
- `tfplaceto calibrate local:2 --out cluster.pbtxt` for real, then `--cluster cluster.pbtxt`.
- MaxPool / MaxPoolGrad kept together by grouping; the slow test runs both placements for real
  on a 2-task loopback cluster and shows what splitting costs.
- The runtime's costs (session 8): control hops on a link, the fixed costs of a step, sends that
  wait for an idle source, each charged only when the cluster declares it; cluster file round trip.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto import errors
from tfplaceto.cli import main
from tfplaceto.cluster import Cluster, ContentionGroup, Device, Link, as_cluster
from tfplaceto.costs.cost_profile import CostProfile
from tfplaceto.graph.grouping import group, kept_together
from tfplaceto.graph.op_graph import make_op_graph
from tfplaceto.measure.devices import DeviceTimes, _task_host
from tfplaceto.measure.measure import MeasurementWarning, _warn_spread, measure_many
from tfplaceto.measure.targets import open_target
from tfplaceto.sim import Simulator


def gpu(i: int) -> str:
    return f"/job:localhost/replica:0/task:0/device:GPU:{i}"


def cluster_of(n: int, groups=(), scales=None) -> Cluster:
    scales = scales or [1.0] * n
    devices = [Device(gpu(i), "GPU", 1 << 40, compute_scale=scales[i]) for i in range(n)]
    links = [Link(gpu(a), gpu(b), 1e3, 0.5) for a in range(n) for b in range(n) if a != b]
    return Cluster(devices, links, contention=[ContentionGroup(tuple(gpu(i) for i in g), e) for g, e in groups])


def independent(n: int):
    return make_op_graph([f"op{i}" for i in range(n)], ["Op"] * n, [], [], [], [])


# -- the contention model -------------------------------------------------------------------------

def test_two_devices_share_speed_while_both_compute():
    # 1 s and 3 s on two devices of a group at efficiency 0.5: both run at half speed until the
    # first is done (t = 2, 1 s of work each), then the second alone: 2 s left at full speed.
    result = Simulator(independent(2), cluster_of(2, [((0, 1), 0.5)]), np.array([[1.0, 1.0], [3.0, 3.0]])).result(
        np.array([0, 1], np.int32))
    assert result.node_end_s.tolist() == [2.0, 4.0]
    assert result.step_time_s == 4.0
    alone = Simulator(independent(2), cluster_of(2), np.array([[1.0, 1.0], [3.0, 3.0]])).run(np.array([0, 1], np.int32))
    assert alone[0] == 3.0


def test_three_busy_devices_slow_more_than_two_and_others_are_untouched():
    # Efficiency 0.5: one extra busy device adds 1x the solo time, two add 2x.
    compute = np.ones((4, 4))
    cluster = cluster_of(4, [((0, 1, 2), 0.5)])
    result = Simulator(independent(4), cluster, compute).result(np.array([0, 1, 2, 3], np.int32))
    assert result.node_end_s.tolist() == [3.0, 3.0, 3.0, 1.0]  # device 3 is in no group


def test_a_device_running_alone_in_its_group_is_not_slowed():
    chain = make_op_graph(["a", "b"], ["Op"] * 2, [0], [0], [0], [1])
    cluster = cluster_of(2, [((0, 1), 0.25)])
    # a on device 0, then b on device 1 after a zero-byte transfer (latency 0.5): never at once.
    result = Simulator(chain, cluster, np.array([[2.0, 2.0], [1.0, 1.0]])).result(np.array([0, 1], np.int32))
    assert result.node_end_s.tolist() == [2.0, 3.5]


def test_efficiency_one_is_the_uncontended_schedule_on_random_graphs():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, d = int(rng.integers(2, 30)), int(rng.integers(2, 5))
        producers = rng.integers(0, n - 1, size=2 * n)
        consumers = np.minimum(producers + 1 + rng.integers(0, 4, size=2 * n), n - 1)
        graph = make_op_graph([f"op{i}" for i in range(n)], ["Op"] * n, producers, rng.integers(0, 4096, 2 * n),
                              np.arange(2 * n), consumers)
        compute = rng.choice([0.0, 0.5, 1.0, 2.0], size=(n, d))
        device_of = rng.integers(0, d, n).astype(np.int32)
        plain = Simulator(graph, cluster_of(d), compute).result(device_of)
        grouped = Simulator(graph, cluster_of(d, [(tuple(range(d)), 1.0)]), compute).result(device_of)
        contended = Simulator(graph, cluster_of(d, [(tuple(range(d)), 0.5)]), compute).result(device_of)
        assert grouped.node_start_s.tolist() == plain.node_start_s.tolist()
        assert grouped.node_end_s.tolist() == plain.node_end_s.tolist()
        # Every node still gets all its work: at least its solo time, at most d x (efficiency 0.5).
        durations = contended.node_end_s - contended.node_start_s
        solo = compute[np.arange(n), device_of]
        assert np.all(durations >= solo - 1e-9) and np.all(durations <= solo * d + 1e-9)


def test_compute_scale_multiplies_the_kind_column():
    graph = independent(3)
    profile = CostProfile(("op0", "op1", "op2"), ("GPU:generic",), np.array([[1.0], [2.0], [4.0]]), "test")
    cluster = cluster_of(2, scales=[1.0, 1.5])
    np.testing.assert_array_equal(profile.per_device(graph, cluster), [[1.0, 1.5], [2.0, 3.0], [4.0, 6.0]])
    assert tp.simulate(graph, dict.fromkeys(("op0", "op1", "op2"), gpu(1)), cluster, profile).step_time_s == 10.5


# -- the runtime's costs: control hops, fixed step costs, sends that wait for an idle source ---------

def task_cpu(t: int) -> str:
    return f"/job:worker/replica:0/task:{t}/device:CPU:0"


def runtime_cluster(n: int = 3, control_hop: float = 0.0, step: float = 0.0, task: float = 0.0,
                    wait_idle=()) -> Cluster:
    """n one-CPU tasks; every link: latency 0.5 s, 1000 B/s, the given control hop."""
    devices = [Device(task_cpu(t), "CPU", 1 << 40, sends_wait_idle=t in wait_idle) for t in range(n)]
    links = [Link(task_cpu(a), task_cpu(b), 1e3, 0.5, control_hop) for a in range(n) for b in range(n) if a != b]
    return Cluster(devices, links, step_overhead_s=step, task_overhead_s=task)


def control_graph():
    # a -> (control) b, a -> (control) c, a -> (data, 0 bytes) d; every node 1 s.
    return make_op_graph(["a", "b", "c", "d"], ["Op"] * 4, [0], [0], [0], [3], [0, 0], [1, 2])


def test_a_crossing_control_edge_costs_a_hop_only_when_the_link_declares_one():
    graph, compute = control_graph(), np.ones((4, 3))
    local = np.array([0, 0, 0, 0], np.int32)
    crossing = np.array([0, 1, 1, 0], np.int32)  # b and c on task 1: one hop for both
    assert Simulator(graph, runtime_cluster(), compute).result(crossing).node_start_s.tolist() == [0, 1, 2, 1]
    hops = Simulator(graph, runtime_cluster(control_hop=0.25), compute)
    assert hops.run(local)[0] == 4.0  # nothing crosses: as before
    result = hops.result(crossing)
    assert result.node_start_s.tolist() == [0.0, 1.25, 2.25, 1.0]
    assert len(result.transfer_tensor) == 0  # a hop moves no tensor: not listed as a transfer
    # b on task 1 and c on task 2: one hop per destination, each on its own link.
    assert hops.result(np.array([0, 1, 2, 0], np.int32)).node_start_s.tolist() == [0.0, 1.25, 1.25, 1.0]
    # A hop queues on its link behind a transfer ready at the same instant (tensors first): d
    # (0 s here) starts when its tensor arrives at 1.5 s, b when the hop after it ends.
    queued = Simulator(graph, runtime_cluster(control_hop=0.25), np.array([[1.0] * 3] * 3 + [[0.0] * 3]))
    assert queued.result(np.array([0, 1, 0, 1], np.int32)).node_start_s.tolist() == [0.0, 1.75, 1.0, 1.5]
    assert hops.run_batch(np.array([local, crossing]))[0].tolist() == [4.0, 3.25]


def test_fixed_step_costs_are_charged_per_step_and_per_further_task():
    graph, compute = independent(2), np.ones((2, 3))
    sim = Simulator(graph, runtime_cluster(step=0.125, task=0.5), compute)
    placements = np.array([[0, 0], [1, 1], [0, 1], [1, 2]], np.int32)
    expected = [2.125, 2.625, 1.625, 2.125]  # schedule + 0.125 + 0.5 per task other than task 0
    assert [sim.run(p)[0] for p in placements] == expected
    assert sim.run_batch(placements)[0].tolist() == expected
    assert [sim.result(p).step_time_s for p in placements] == expected
    assert Simulator(graph, runtime_cluster(), compute).run(placements[1])[0] == 2.0


def test_sends_wait_until_their_source_task_is_idle_when_it_is_declared():
    # a (1 s) and c (2 s) on task 0; b on task 1 reads a's output (0 bytes, latency 0.5).
    graph = make_op_graph(["a", "b", "c"], ["Op"] * 3, [0], [0], [0], [1])
    compute, placement = np.array([[1.0] * 3, [1.0] * 3, [2.0] * 3]), np.array([0, 1, 0], np.int32)
    free = Simulator(graph, runtime_cluster(), compute).result(placement)
    assert free.node_start_s.tolist() == [0.0, 1.5, 1.0] and free.step_time_s == 3.0
    # Task 0 runs c until 3 s: only then does a's output leave.
    waiting = Simulator(graph, runtime_cluster(wait_idle=(0,)), compute).result(placement)
    assert waiting.node_start_s.tolist() == [0.0, 3.5, 1.0] and waiting.step_time_s == 4.5
    assert waiting.transfer_start_s.tolist() == [3.0]
    # Only the declared source waits: task 1 sending back is not held.
    assert Simulator(graph, runtime_cluster(wait_idle=(1,)), compute).run(placement)[0] == 3.0


def test_runtime_costs_round_trip_through_the_cluster_file(tmp_path):
    cluster = runtime_cluster(control_hop=2.5e-5, step=3e-4, task=2.9e-4, wait_idle=(0, 2))
    for name in ("r.pbtxt", "r.pb"):
        cluster.save(tmp_path / name)
        loaded = Cluster.load(tmp_path / name)
        assert loaded == cluster
        assert (loaded.step_overhead_s, loaded.task_overhead_s) == (3e-4, 2.9e-4)
        assert [d.sends_wait_idle for d in loaded.devices] == [True, False, True]
        np.testing.assert_array_equal(loaded.control_hop, cluster.control_hop)
    assert tp.Cluster.load(tmp_path / "r.pbtxt").control_hop[0, 1] == 2.5e-5
    for bad in (dict(step=-1.0), dict(task=float("nan")), dict(control_hop=-1e-6)):
        with pytest.raises(errors.InvalidClusterError):
            runtime_cluster(**bad)


def test_runtime_costs_apply_to_the_links_and_devices_they_name():
    from tfplaceto.measure.runtime import RuntimeCosts

    cluster = runtime_cluster(2)
    a, b = cluster.device_names
    costs = RuntimeCosts(4e-4, 2e-4, {(a, b): 2.5e-5, (b, a): 3e-5}, {}, (8, 32), {a: 1.0, b: 0.1},
                         {a: True, b: False})
    calibrated = costs.apply(cluster)
    assert calibrated.control_hop[0, 1] == 2.5e-5 and calibrated.control_hop[1, 0] == 3e-5
    assert [d.sends_wait_idle for d in calibrated.devices] == [True, False]
    assert (calibrated.step_overhead_s, calibrated.task_overhead_s) == (4e-4, 2e-4)
    np.testing.assert_array_equal(calibrated.latency, cluster.latency)


def test_runtime_costs_measured_on_logical_cpus():
    from tfplaceto.measure.runtime import measure_runtime

    costs = measure_runtime("local:2", rounds=1, runs=2, warmup=1)
    assert costs.step_overhead_s > 0 and costs.task_overhead_s == 0.0  # one task: nothing further
    assert len(costs.control_hop_s) == 2 and all(h >= 0 for h in costs.control_hop_s.values())
    assert costs.wait_ratio == {} and costs.sends_wait_idle == {}  # no other task to send to
    with pytest.raises(errors.TfplacetoError, match="edge counts"):
        measure_runtime("local:2", edges=(8, 8))


@pytest.mark.slow
def test_runtime_costs_of_a_loopback_cluster():
    """Two one-core tasks: control edges across them cost a hop each, a second task adds to the
    fixed cost, and each task's sends wait for its one inter-op thread (the dependent chains
    take about one chain longer than the independent ones)."""
    from tfplaceto.measure import LocalTFCluster
    from tfplaceto.measure.runtime import measure_runtime

    with LocalTFCluster(2) as target:
        costs = measure_runtime(target, rounds=2, runs=3)
    print(costs)
    assert costs.step_overhead_s > 0 and costs.task_overhead_s > 0
    assert all(h > 1e-6 for h in costs.control_hop_s.values())
    if target.inter_op_threads == 1:
        assert all(costs.sends_wait_idle.values()) and len(costs.sends_wait_idle) == 2


def test_op_costs_scale_to_the_untraced_step_per_kind():
    from tfplaceto.measure.calibrate import scale_to_untraced, untraced_steps

    profile = CostProfile(("op0", "op1"), ("CPU:host", "GPU:x"), np.array([[1.0, 2.0], [3.0, 2.0]]), "traced")
    scaled = scale_to_untraced(profile, {"CPU:host": 2.5}, fixed_s=0.5)  # 4 s traced -> 2 s of ops
    np.testing.assert_allclose(scaled.compute_s, [[0.5, 2.0], [1.5, 2.0]])  # GPU:x not timed: as traced
    assert "CPU:host x0.500" in scaled.source and profile.compute_s[0, 0] == 1.0
    op_graph = tp.import_graph(_small_graph(), fetches=["out"])
    steps = untraced_steps(op_graph, "local:2", runs=2, warmup=1)
    assert list(steps) == ["CPU:host"] and steps["CPU:host"] > 0


# -- cluster files and validation ---------------------------------------------------------------------

def test_cluster_file_round_trips_and_is_accepted_as_a_cluster(tmp_path):
    cluster = cluster_of(3, [((0, 2), 0.6)], scales=[1.0, 1.25, 0.9])
    for name in ("c.pbtxt", "c.pb"):
        path = tmp_path / name
        cluster.save(path)
        assert Cluster.load(path) == cluster
        assert as_cluster(str(path)) == cluster and as_cluster(path) == cluster
    loaded = Cluster.load(tmp_path / "c.pbtxt")
    assert loaded.contention == (ContentionGroup((gpu(0), gpu(2)), 0.6),)
    assert [d.compute_scale for d in loaded.devices] == [1.0, 1.25, 0.9]
    assert "compute_scale" in (tmp_path / "c.pbtxt").read_text()


def test_presets_carry_no_calibration_and_keep_their_serialization():
    preset = Cluster.preset("4xV100")
    assert preset.contention == () and all(d.compute_scale == 1.0 for d in preset.devices)
    # compute_scale 1 is written as the unset 0: uncalibrated clusters serialize (and fingerprint)
    # exactly as before the field existed.
    assert all(d.compute_scale == 0.0 for d in preset.to_proto().devices)
    assert Cluster.from_proto(preset.to_proto()) == preset
    # Nor the runtime's costs: no control hop, no fixed step cost, sends never wait. Fingerprints
    # are those from before these fields existed.
    assert not preset.control_hop.any() and (preset.step_overhead_s, preset.task_overhead_s) == (0.0, 0.0)
    assert not any(d.sends_wait_idle for d in preset.devices)
    assert preset.fingerprint() == "9639d675c8cd630f" and Cluster.preset("8xK80").fingerprint() == "2d143b12db96442f"


@pytest.mark.parametrize("groups, message", [
    ([((0,), 0.5)], "two or more"),
    ([((0, 1), 0.5), ((1, 2), 0.5)], "two contention groups"),
    ([((0, 1), 0.0)], "efficiency"),
    ([((0, 1), 1.5)], "efficiency"),
    ([((0, 1), float("nan"))], "efficiency"),
])
def test_bad_contention_groups_are_typed_errors(groups, message):
    with pytest.raises(errors.InvalidClusterError, match=message):
        cluster_of(3, groups)


def test_bad_compute_scale_and_bad_files_are_typed_errors(tmp_path):
    for scale in (0.0, -1.0, float("inf")):
        with pytest.raises(errors.InvalidClusterError, match="compute_scale"):
            cluster_of(1, scales=[scale])
    with pytest.raises(errors.InvalidClusterError, match="unknown|not in cluster"):
        Cluster([Device(gpu(0), "GPU", 1 << 30), Device(gpu(1), "GPU", 1 << 30)],
                contention=[ContentionGroup((gpu(0), gpu(5)), 0.5)])
    garbage = tmp_path / "garbage.pbtxt"
    garbage.write_text("this is not a cluster {")
    with pytest.raises(errors.InvalidClusterError, match="not a tfplaceto cluster file"):
        Cluster.load(garbage)
    with pytest.raises(errors.InvalidClusterError, match="cannot read"):
        as_cluster(str(tmp_path / "missing.pbtxt"))


# -- device calibration arithmetic and targets --------------------------------------------------------

def test_device_times_give_scales_efficiency_and_drop_noise_level_contention():
    a, b, c = "/job:w/replica:0/task:0/device:CPU:0", "/job:w/replica:0/task:1/device:CPU:0", \
        "/job:w/replica:0/task:2/device:CPU:0"
    times = DeviceTimes({a: 0.02, b: 0.03, c: 0.02}, {a: 0, b: 0, c: 0},
                        {(a, b): 0.045, (a, c): 0.0205}, {(a, b): 0, (a, c): 0}, rounds=3, runs=5)
    assert times.compute_scales(dict.fromkeys((a, b, c), "CPU:host")) == {a: 1.0, b: 1.5, c: 1.0}
    assert times.slowdown((a, b)) == pytest.approx(1.5)
    assert times.efficiency((a, b)) == pytest.approx(1 / 1.5)
    assert [g.devices for g in times.contention()] == [(a, b)]  # 2.5% slower is noise: no group


def test_task_hosts_come_from_the_cluster_spec():
    spec = tf.train.ClusterSpec({"worker": ["hostA:2222", "hostA:2223", "hostB:2222"]})
    assert [_task_host(spec, f"/job:worker/replica:0/task:{i}") for i in range(3)] == ["hostA", "hostA", "hostB"]
    assert _task_host(spec, "/job:ps/replica:0/task:0") is None


def test_calibration_targets_parse_without_connecting(tmp_path):
    with open_target('{"worker": ["localhost:1", "localhost:2"]}') as target:
        assert target.target == "grpc://localhost:1"
    spec = tmp_path / "spec.json"
    spec.write_text('{"cluster": {"worker": ["localhost:3"]}, "task": {"type": "worker", "index": 0}}')
    with open_target(str(spec)) as target:
        assert target.target == "grpc://localhost:3"
    with open_target("grpc://localhost:4,grpc://localhost:5") as target:
        assert target.cluster_spec.as_dict() == {"worker": ["localhost:4", "localhost:5"]}
    with open_target("local:3") as target:
        assert len(target.devices) >= 3
    for bad in ("", "gpu-box", '{"worker": "x"}', "[1, 2]", "grpc://a:1,b:2", str(tmp_path / "no.json")):
        with pytest.raises(errors.InvalidClusterError):
            with open_target(bad):
                pass


# -- repeatable measurement ---------------------------------------------------------------------------

def _small_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.ones((64, 64), np.float32), name="x")
        y = tf.matmul(x, x, name="y")
        tf.reduce_sum(y, name="out")
    return graph.as_graph_def()


def test_measure_many_interleaves_rounds_and_reports_the_spread():
    graph_def = _small_graph()
    cpu = "/job:localhost/replica:0/task:0/device:CPU:"
    placements = {"one": {n.name: cpu + "0" for n in graph_def.node},
                  "two": {"x": cpu + "0", "y": cpu + "1", "out": cpu + "1"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MeasurementWarning)  # a loaded test host may be noisy
        results = measure_many(graph_def, placements, target="local:2", rounds=3, runs=2, warmup=1)
    for result in results.values():
        assert len(result.round_times_s) == 3 and len(result.step_times_s) == 6
        assert result.step_time_s == float(np.median(result.step_times_s))
        assert result.spread == pytest.approx(np.ptp(result.round_times_s) / result.step_time_s)
    assert results["two"].devices == (cpu + "0", cpu + "1")
    single = tp.measure(graph_def, placements["one"], target="local:2", runs=5, max_spread=None)
    assert single.spread >= 0.0


def test_spread_beyond_the_margin_is_warned():
    with pytest.warns(MeasurementWarning, match="differ by 25%"):
        _warn_spread(0.25, 0.10, "3 rounds of placement 'x'", "local:2")
    with warnings.catch_warnings():
        warnings.simplefilter("error", MeasurementWarning)
        _warn_spread(0.05, 0.10, "3 rounds", "local:2")
        _warn_spread(0.50, None, "3 rounds", "local:2")


# -- the calibrate command --------------------------------------------------------------------------

def test_calibrate_command_writes_a_cluster_file_every_command_accepts(tmp_path, capsys):
    out = tmp_path / "cluster.pbtxt"
    assert main(["calibrate", "local:2", "--out", str(out), "--rounds", "2", "--runs", "2"]) == 0
    printed = capsys.readouterr().out
    assert "compute_scale" in printed and "wrote" in printed
    cluster = tp.Cluster.load(out)
    assert cluster.num_devices == 2 and cluster.devices[0].compute_scale == 1.0
    assert cluster.devices[1].compute_scale > 0
    assert cluster.step_overhead_s > 0 and "fixed step cost" in printed  # the runtime's costs too
    # Links were measured, not the defaults of Cluster.local(cpus=2).
    assert cluster.bandwidth[0, 1] != tp.Cluster.local(cpus=2).bandwidth[0, 1]
    graph_file = tmp_path / "g.pb"
    graph_file.write_bytes(_small_graph().SerializeToString())
    placed = tmp_path / "placed.pb"
    assert main(["place", str(graph_file), "--cluster", str(out), "--method", "round_robin", "--out", str(placed)]) == 0
    assert {n.device for n in tf.compat.v1.GraphDef.FromString(placed.read_bytes()).node} <= set(cluster.device_names)
    # An existing output is refused before any measurement, with one line and status 2.
    assert main(["calibrate", "local:2", "--out", str(out)]) == 2
    assert main(["calibrate", "nowhere:7", "--out", str(tmp_path / "x.pbtxt")]) == 2
    assert main(["calibrate", "local:2", "--out", str(tmp_path / "y.pbtxt"), "--rounds", "0"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 3
    assert not (tmp_path / "x.pbtxt").exists() and not (tmp_path / "y.pbtxt").exists()


# -- op pairs that must stay together ------------------------------------------------------------------

def _pool_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.Variable(tf.random.stateless_normal([32, 32, 32, 64], seed=(1, 2)), name="x")
        h = tf.nn.relu(x, name="h")
        y = tf.nn.max_pool2d(h, 2, 2, "VALID", name="pool")
        loss = tf.reduce_sum(y * y, name="loss")
        grad = tf.gradients(loss, [h])[0]
        tf.reduce_sum(grad, name="out")
    return graph.as_graph_def()


def test_maxpool_and_its_gradient_are_kept_together_by_grouping():
    op_graph = tp.import_graph(_pool_graph(), fetches=["out"])
    pairs = kept_together(op_graph)
    assert [(op_graph.types[a], op_graph.types[b]) for a, b in pairs] == [("MaxPool", "MaxPoolGrad")]
    for max_groups in (2, 4, 256):
        grouping = group(op_graph, max_groups=max_groups)
        a, b = grouping.op_to_group[pairs[0]]
        assert grouping.graph.colocation[a] == grouping.graph.colocation[b]
    names = (op_graph.names[pairs[0][0]], op_graph.names[pairs[0][1]])
    for seed in range(5):
        placement = tp.place(op_graph, "2xV100", method="random", seed=seed)
        assert placement[names[0]] == placement[names[1]]


@pytest.mark.slow
def test_splitting_maxpool_from_its_gradient_costs_for_real():
    """Both placements on a 2-task loopback cluster, interleaved: the split one moves the pooling's
    input and output across tasks every step (the gradient re-reads both)."""
    from tfplaceto.measure import LocalTFCluster

    graph_def = _pool_graph()
    with LocalTFCluster(2) as cluster:
        d0, d1 = cluster.devices[:2]
        together = {n.name: d0 for n in graph_def.node}
        split = {n.name: d1 if n.name.startswith("gradients/") or n.name == "out" else d0 for n in graph_def.node}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MeasurementWarning)
            results = measure_many(graph_def, {"together": together, "split": split}, target=cluster,
                                   rounds=3, runs=5)
    ratio = results["split"].step_time_s / results["together"].step_time_s
    print(f"MaxPool/MaxPoolGrad together {results['together'].step_time_s * 1e3:.1f} ms, split "
          f"{results['split'].step_time_s * 1e3:.1f} ms ({ratio:.2f}x)")
    assert ratio > 1.2


def test_calibrate_shows_a_progress_bar_per_stage(tmp_path, capsys):
    from tfplaceto.measure.targets import calibrate_to_file

    cluster = calibrate_to_file("local:2", tmp_path / "c.pb", rounds=1, runs=1, link_runs=1, progress=True)
    err = capsys.readouterr().err
    assert "links (transfers)" in err and "device speed and contention" in err and "100%" in err
    assert tp.Cluster.load(tmp_path / "c.pb") == cluster
