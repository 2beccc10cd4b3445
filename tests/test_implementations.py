"""The kernel TensorFlow would run: a Keras LSTM/GRU imported for a GPU cluster is cuDNN's fused
op (CudnnRNN, CudnnRNNBackprop), for a CPU-only cluster the standard while loop, and the choice is
reported (OpGraph, report.json) and costed (cuDNN's ops by their FLOPs: grappler has no model)."""

import warnings

import numpy as np
import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto import errors

GPU = "/job:localhost/replica:0/task:0/device:GPU:{}"
STEPS, BATCH, FEATURES, UNITS = 8, 8, 64, 128


def _rnn_model():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.Input((STEPS,), batch_size=BATCH, dtype="int32"),
        tf.keras.layers.Embedding(100, FEATURES),
        tf.keras.layers.LSTM(UNITS, return_sequences=True, name="lstm"),
        tf.keras.layers.GRU(UNITS, name="gru"),
        tf.keras.layers.Dense(2)], name="rnn")
    model.compile(optimizer="adam",
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.fixture(scope="module")
def graphs():
    return {cluster: tp.import_graph(_rnn_model(), batch_size=BATCH, cluster=cluster)
            for cluster in ("2xV100", "local:2")}


def _of_type(graph, kind):
    return [i for i, t in enumerate(graph.types) if t == kind]


def test_gpu_cluster_imports_the_cudnn_kernel_cpu_cluster_the_loop(graphs):
    gpu, cpu = graphs["2xV100"], graphs["local:2"]
    # GPU: one fused op per layer and one for its gradient; no loop left.
    assert len(_of_type(gpu, "CudnnRNN")) == 2 and len(_of_type(gpu, "CudnnRNNBackprop")) == 2
    assert not gpu.loops
    fused = _of_type(gpu, "CudnnRNN") + _of_type(gpu, "CudnnRNNBackprop")
    assert not gpu.kernels[fused, 0].any() and gpu.kernels[fused, 1].all()  # GPU kernels only
    # CPU: the standard implementation, a forward and a gradient loop per layer.
    assert not any(t.startswith("Cudnn") for t in cpu.types)
    assert len(cpu.loops) == 4 and all(loop.trips == STEPS for loop in cpu.loops)
    for graph, device_type, kernel in ((gpu, "GPU", "cuDNN"), (cpu, "CPU", "standard")):
        report = graph.implementation_report()
        assert [r["layer"] for r in report] == ["rnn/gru", "rnn/lstm"]
        assert {(r["device_type"], r["kernel"], r["calls"]) for r in report} == {(device_type, kernel, 2)}
        assert all(r["api"].startswith(("lstm_", "gru_")) for r in report)


def test_cudnn_ops_are_costed_by_their_products(graphs):
    gpu = graphs["2xV100"]
    cluster = tp.Cluster.preset("2xV100")
    costs = tp.profile(gpu, cluster, use_cache=False)
    column = list(costs.device_kinds).index(cluster.devices[0].kind)
    peak = cluster.devices[0].peak_gflops * 1e9
    for layer, gates in (("lstm", 4), ("gru", 3)):
        forward = next(i for i in _of_type(gpu, "CudnnRNN") if f"/{layer}/" in gpu.names[i])
        products = STEPS * BATCH * gates * UNITS * 2 * (FEATURES + UNITS) / peak
        # At least the layer's matrix products at the GPU's peak (grappler alone charges the
        # op's bytes only, less than the LSTM's products here), plus its memory traffic (the
        # recurrent weights read every step): not wildly more.
        assert products < costs.compute_s[forward, column] < 10 * products
    backward = costs.compute_s[_of_type(gpu, "CudnnRNNBackprop"), column]
    forward = costs.compute_s[_of_type(gpu, "CudnnRNN"), column]
    assert 1.5 * forward.sum() < backward.sum() < 3 * forward.sum()


def test_cudnn_step_is_faster_than_the_loop_on_one_gpu(graphs):
    # The same training step as TensorFlow runs it on a GPU (fused) and as the standard loop
    # would run there: the fused layers are cheaper, but the rest of the step is the same.
    steps = {}
    for name, graph in graphs.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", errors.ImplementationWarning)
            placement = {op: GPU.format(0) for op in graph.names}
            steps[name] = tp.simulate(graph, placement, "2xV100").step_time_s
    assert steps["local:2"] / 10 < steps["2xV100"] < steps["local:2"]


def test_profile_warns_when_the_other_implementation_was_imported(graphs):
    with pytest.warns(errors.ImplementationWarning, match=r"rnn/gru, rnn/lstm.*cluster='2xV100'"):
        tp.profile(graphs["local:2"], "2xV100", use_cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.ImplementationWarning)
        tp.profile(graphs["2xV100"], "2xV100", use_cache=False)
        tp.profile(graphs["local:2"], "local:2", use_cache=False)


def test_optimize_places_the_cudnn_kernel_and_reports_it():
    result = tp.optimize(_rnn_model(), cluster="2xV100", method="m_topo", batch_size=BATCH)
    graph = result.op_graph
    fused = [graph.names[i] for i in _of_type(graph, "CudnnRNN") + _of_type(graph, "CudnnRNNBackprop")]
    assert len(fused) == 4 and all("GPU" in result.placement[name] for name in fused)
    report = result.summary()["implementations"]
    assert {(r["layer"], r["kernel"], r["device_type"]) for r in report} == {
        ("rnn/lstm", "cuDNN", "GPU"), ("rnn/gru", "cuDNN", "GPU")}
    devices = {node.device for node in result.graph_def.node if node.op.startswith("Cudnn")}
    assert devices and all("GPU" in d for d in devices)
    assert np.isfinite(result.step_time_s)


def test_a_layer_called_inside_another_function_is_swapped_too():
    # A SavedModel's signature, or a tf.function calling a model's tf.function: the layer's call
    # is inside another function's body, out of reach of grappler's selector at the top.
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((STEPS,), batch_size=BATCH, dtype="int32"),
                                 tf.keras.layers.Embedding(100, 16), tf.keras.layers.LSTM(32, name="lstm")])
    inner = tf.function(lambda x: model(x, training=False))
    outer = tf.function(lambda x: inner(x) * 2.0, input_signature=[tf.TensorSpec([BATCH, STEPS], tf.int32)])
    for cluster, device_type, kernel in (("2xV100", "GPU", "cuDNN"), ("local:2", "CPU", "standard")):
        graph = tp.import_graph(outer.get_concrete_function(), cluster=cluster)
        [choice] = graph.implementation_report()
        assert (choice["kernel"], choice["device_type"]) == (kernel, device_type)
        assert choice["layer"].endswith("lstm/PartitionedCall")
        assert ("CudnnRNN" in graph.types) == (kernel == "cuDNN")
        assert bool(graph.loops) == (kernel == "standard")
