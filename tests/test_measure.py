"""Real measurement: local logical CPUs, a 2-task LocalTFCluster over gRPC, link calibration.

Fast set: measuring on 2 logical CPUs (GraphDef and OpGraph inputs), typed errors for bad input,
inputs held in variables compute what feeding computes, full worker device names survive
apply_placement, and one LocalTFCluster(2) lifetime that measures a placement spanning both
tasks (also through its ClusterSpec and its grpc:// address), calibrates its links, survives a
graph failing on the workers, and is shut down when a bad placement raises out of its `with`.
Slow (`-m slow`): calibration with the default sizes, op costs traced on a worker, a Keras
training step measured on the cluster, and close() without a `with`.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto import errors
from tfplaceto.measure import LocalTarget, LocalTFCluster, MeasureResult, RemoteTFCluster, measure
from tfplaceto.measure.calibrate import calibrate_links, calibrate_op_costs, calibrated_cluster
from tfplaceto.measure.session import inputs_as_variables, random_feeds, run_graph
from tfplaceto.measure.tf_cluster import as_target

LOCAL = "/job:localhost/replica:0/task:0/device:CPU:{}"
WORKER = "/job:worker/replica:0/task:{}/device:CPU:0"


def _small_graph(failing: bool = False):
    """x -> two matmuls with a variable -> a sum (-> log checked for NaN when failing)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 128], name="x")
        w = tf.Variable(tf.ones([128, 128]) * 0.01, name="w")
        h = tf.nn.relu(tf.matmul(x, w), name="h")
        y = tf.reduce_sum(tf.matmul(h, w), name="y")
        if failing:  # random normal inputs: log of a negative is NaN, which CheckNumerics rejects
            tf.debugging.check_numerics(tf.math.log(x), "log of a negative input", name="checked")
        else:
            tf.identity(y, name="out")
    return graph.as_graph_def()


def _alternating(graph_def, devices):
    return {n.name: devices[i % len(devices)] for i, n in enumerate(graph_def.node)}


# -- local ----------------------------------------------------------------------------------------

def test_local_measurement_on_two_logical_cpus():
    graph_def = _small_graph()
    result = measure(graph_def, _alternating(graph_def, [LOCAL.format(0), LOCAL.format(1)]), runs=3)
    assert isinstance(result, MeasureResult)
    assert result.step_time_s > 0 and len(result.step_times_s) == 3
    assert result.step_time_s == float(np.median(result.step_times_s))
    assert result.devices == (LOCAL.format(0), LOCAL.format(1))
    assert result.target == "local:2"


def test_local_measurement_of_an_op_graph():
    op_graph = tp.import_graph(_small_graph(), fetches=["out"])
    placement = tp.place(op_graph, "local:2", method="round_robin", costs="analytical")
    result = measure(op_graph, placement, target="local:2", runs=2, warmup=1, inputs_on_device=False)
    assert result.step_time_s > 0 and len(result.step_times_s) == 2
    assert set(result.devices) == {LOCAL.format(0), LOCAL.format(1)}


def test_bad_measure_input_raises_typed_errors():
    graph_def = _small_graph()
    on_cpu0 = dict.fromkeys((n.name for n in graph_def.node), LOCAL.format(0))
    with pytest.raises(errors.InvalidGraphError):
        measure("not a graph", on_cpu0)
    with pytest.raises(errors.InvalidGraphError):
        measure(graph_def, {})
    with pytest.raises(errors.TfplacetoError):
        measure(graph_def, on_cpu0, runs=0)
    with pytest.raises(errors.InvalidClusterError, match="task:3"):
        measure(graph_def, dict.fromkeys(on_cpu0, WORKER.format(3)))  # not a device of this process
    for target in ("4xV100-ish", "grpc://no-port", 42):
        with pytest.raises(errors.InvalidClusterError):
            measure(graph_def, on_cpu0, target=target)
    with pytest.raises(errors.InvalidGraphError, match="failed"):
        failing = _small_graph(failing=True)
        measure(failing, dict.fromkeys((n.name for n in failing.node), LOCAL.format(0)), runs=1)


def test_targets_from_strings_and_clusters():
    assert isinstance(as_target(None), LocalTarget) and as_target(None, min_cpus=3).cpus == 3
    assert as_target("local:4").cpus == 4 and as_target(tp.Cluster.local(cpus=2)).cpus == 2
    assert as_target("local:2").devices == (LOCAL.format(0), LOCAL.format(1))
    spec = tf.train.ClusterSpec({"worker": ["localhost:1111", "localhost:2222"]})
    remote = as_target(spec)
    assert isinstance(remote, RemoteTFCluster) and remote.target == "grpc://localhost:1111"
    assert as_target("grpc://h:5").target == "grpc://h:5"
    with pytest.raises(errors.InvalidClusterError):
        RemoteTFCluster({"worker": []})
    with pytest.raises(errors.InvalidClusterError):
        as_target(tp.Cluster([tp.Device(WORKER.format(0), "CPU", 2**30)]))  # a worker device: no server


def test_inputs_held_in_variables_compute_what_feeding_computes():
    graph_def = _small_graph()
    feeds = random_feeds(graph_def, seed=3)
    weights = {"w": np.full((128, 128), 0.01, np.float32)}
    fed = run_graph(graph_def, ["y"], variable_values=weights, feeds=feeds)
    converted, values = inputs_as_variables(graph_def, feeds)
    assert "x" in {n.name for n in converted.node if n.op == "ReadVariableOp"}
    held = run_graph(converted, ["y"], variable_values={**weights, **values}, feeds={})
    np.testing.assert_allclose(fed.outputs["y"][0], held.outputs["y"][0], rtol=1e-6)


def test_full_worker_device_names_pass_through_apply_placement():
    graph_def = _small_graph()
    names = [n.name for n in graph_def.node]
    full = {n: WORKER.format(i % 2) for i, n in enumerate(names)}
    placed = tp.apply_placement(graph_def, full)
    assert {n.device for n in placed.node} == {WORKER.format(0), WORKER.format(1)}
    short = dict.fromkeys(names, "/job:worker/task:1/cpu:0")  # short forms get replica:0, upper case
    assert {n.device for n in tp.apply_placement(graph_def, short).node} == {WORKER.format(1)}


def test_calibrate_links_on_logical_cpus():
    links = calibrate_links("local:2", sizes=(1024, 64 * 1024, 1024 * 1024), runs=2)
    assert {(lk.src, lk.dst) for lk in links} == {(LOCAL.format(0), LOCAL.format(1)),
                                                 (LOCAL.format(1), LOCAL.format(0))}
    assert all(lk.bandwidth_bytes_per_s > 0 and lk.latency_s > 0 for lk in links)


# -- a real 2-task TensorFlow cluster -------------------------------------------------------------

def test_local_tf_cluster_measures_calibrates_and_always_shuts_down():
    graph_def = _small_graph()
    both_tasks = _alternating(graph_def, [WORKER.format(0), WORKER.format(1)])
    with pytest.raises(errors.InvalidClusterError, match="task:5"):
        with LocalTFCluster(2) as cluster:
            processes = cluster.processes
            assert cluster.alive and len(processes) == 2
            assert cluster.devices == (WORKER.format(0), WORKER.format(1))
            assert cluster.target.startswith("grpc://localhost:")
            assert cluster.cluster().device_names == cluster.devices

            result = measure(graph_def, both_tasks, target=cluster, runs=3)
            assert result.step_time_s > 0 and len(result.step_times_s) == 3
            assert result.devices == (WORKER.format(0), WORKER.format(1))
            # The same servers through their ClusterSpec and their master's address.
            assert measure(graph_def, both_tasks, target=cluster.cluster_spec, runs=1).step_time_s > 0
            assert measure(graph_def, both_tasks, target=cluster.target, runs=1).step_time_s > 0

            links = calibrate_links(cluster, sizes=(1024, 256 * 1024, 4 * 1024 * 1024), runs=2)
            assert len(links) == 2 and {lk.src for lk in links} == set(cluster.devices)
            assert all(lk.bandwidth_bytes_per_s > 0 and lk.latency_s > 0 for lk in links)

            failing = _small_graph(failing=True)
            with pytest.raises(errors.InvalidGraphError, match="failed"):
                measure(failing, _alternating(failing, [WORKER.format(1), WORKER.format(0)]),
                        target=cluster, runs=1)
            assert cluster.alive, "a graph failing on the workers leaves the servers up"
            measure(graph_def, dict.fromkeys(both_tasks, WORKER.format(5)), target=cluster)
    assert not any(p.is_alive() for p in processes)
    assert not cluster.alive
    cluster.close()  # idempotent


# -- slow -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_calibrated_cluster_and_traced_op_costs():
    op_graph = tp.import_graph(_small_graph(), fetches=["out"])
    with LocalTFCluster(2) as cluster:
        calibrated = calibrated_cluster(cluster)
        assert calibrated.device_names == cluster.devices
        off_diagonal = ~np.eye(2, dtype=bool)
        assert (calibrated.bandwidth[off_diagonal] > 1e6).all()  # loopback gRPC: far above 1 MB/s
        assert (calibrated.latency[off_diagonal] > 0).all()
        assert (calibrated.latency[off_diagonal] < 0.1).all()
        costs = calibrate_op_costs(op_graph, cluster, cluster=calibrated, runs=2)
        assert costs.device_kinds == ("CPU:host",)
        matmul = op_graph.index_of("MatMul")
        assert costs.compute_s[matmul, 0] > 0
        simulated = tp.simulate(op_graph, _alternating(op_graph.graph_def, cluster.devices), calibrated, costs)
        assert simulated.step_time_s > 0


@pytest.mark.slow
def test_keras_training_step_on_the_cluster_without_with():
    model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    op_graph = tp.import_graph(model, batch_size=8)
    cluster = LocalTFCluster(2)
    try:
        placement = tp.place(op_graph, cluster.cluster(), method="round_robin", costs="analytical")
        result = measure(op_graph, placement, target=cluster, runs=3)
        assert result.step_time_s > 0 and set(result.devices) == set(cluster.devices)
    finally:
        cluster.close()
    assert not any(p.is_alive() for p in cluster.processes)
