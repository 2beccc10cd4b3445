"""apply_placement / optimize: a placed graph computes exactly what the original computes.

Each model's graph is run twice on 4 logical CPU devices with soft placement off: as imported,
and with the devices a placer wrote (spread over all four devices so tensors really cross).
Outputs and the variables after one training step must agree.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto.cluster import session_config
from tfplaceto.measure.session import random_feeds, run_graph

CLUSTER = tp.Cluster.local(cpus=4)


def _run(graph_def, op_graph, feeds):
    return run_graph(graph_def, op_graph.fetches, session_config(CLUSTER), op_graph.variable_values, feeds)


def _assert_same_computation(op_graph, method="round_robin"):
    placement = tp.place(op_graph, CLUSTER, method=method, costs="analytical")
    placed = tp.apply_placement(op_graph.graph_def, placement)
    used = {n.device for n in placed.node}
    assert all(n.device for n in placed.node), "every node gets a device"
    assert used <= set(CLUSTER.device_names)
    assert len(used) > 1, "the test is only meaningful if tensors cross devices"
    feeds = random_feeds(op_graph.graph_def, seed=1)
    original = _run(op_graph.graph_def, op_graph, feeds)
    moved = _run(placed, op_graph, feeds)
    for name in original.outputs:
        for a, b in zip(original.outputs[name], moved.outputs[name], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
    assert original.variables.keys() == moved.variables.keys()
    for name in original.variables:
        np.testing.assert_allclose(original.variables[name], moved.variables[name], rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    return placed


def _compiled(model, loss="sparse_categorical_crossentropy"):
    model.compile(optimizer=tf.keras.optimizers.Adam(1e-3), loss=loss)
    return model


def test_mobilenet_training_step_runs_the_same_when_placed():
    model = _compiled(tf.keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None, classes=10,
                                                        alpha=0.35))
    op_graph = tp.import_graph(model, batch_size=4)
    assert op_graph.num_ops > 1000
    _assert_same_computation(op_graph)


def test_recurrent_model_runs_the_same_when_placed():
    inputs = tf.keras.Input((12, 8))
    hidden = tf.keras.layers.LSTM(16, return_sequences=True)(inputs)
    hidden = tf.keras.layers.GRU(16)(hidden)
    model = _compiled(tf.keras.Model(inputs, tf.keras.layers.Dense(5)(hidden)), loss="mse")
    op_graph = tp.import_graph(model, batch_size=3)
    assert {"Enter", "Exit", "NextIteration"} <= set(op_graph.types), "loops are lowered to placeable ops"
    _assert_same_computation(op_graph, method="random")


def test_string_and_int_ops_without_gpu_kernels_run_the_same_and_stay_on_cpu():
    text = tf.keras.Input((), dtype=tf.string)
    ids = tf.keras.layers.Hashing(num_bins=64)(text)
    embedded = tf.keras.layers.Embedding(64, 8)(ids)
    model = _compiled(tf.keras.Model(text, tf.keras.layers.Dense(3)(embedded)))
    op_graph = tp.import_graph(model, batch_size=6)
    string_ops = [i for i, t in enumerate(op_graph.types) if t == "StringToHashBucketFast"]
    assert string_ops and not op_graph.kernels[string_ops[0], 1], "no GPU kernel for string hashing"
    _assert_same_computation(op_graph)
    placement = tp.place(op_graph, "2xV100", method="round_robin", costs="analytical")
    for i in string_ops:
        assert placement[op_graph.names[i]].endswith("CPU:0")


def test_apply_placement_does_not_modify_its_input_and_keeps_colocation():
    model = _compiled(tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3)]))
    op_graph = tp.import_graph(model, batch_size=2)
    before = op_graph.graph_def.SerializeToString(deterministic=True)
    placement = tp.place(op_graph, CLUSTER, method="round_robin", costs="analytical")
    placed = tp.apply_placement(op_graph.graph_def, placement)
    assert op_graph.graph_def.SerializeToString(deterministic=True) == before
    devices = {n.name: n.device for n in placed.node}
    for node in placed.node:
        for inp in node.input:
            src = inp.lstrip("^").split(":")[0]
            if not inp.startswith("^") and placed.node and src in devices and \
                    next(n for n in placed.node if n.name == src).op == "VarHandleOp":
                assert devices[src] == node.device, f"{node.name} reads {src} across devices"


@pytest.mark.parametrize("bad", [{"no_such_op": "/job:localhost/replica:0/task:0/device:CPU:0"}, {}])
def test_apply_placement_rejects_placements_it_cannot_use(bad):
    graph_def = tf.compat.v1.GraphDef()
    graph_def.node.add(name="a", op="NoOp")
    if not bad:
        with pytest.raises(tp.errors.InvalidGraphError):
            tp.apply_placement(graph_def, bad)
    else:
        placed = tp.apply_placement(graph_def, bad)  # unknown ops are ignored; a gets the default
        assert placed.node[0].device.endswith("CPU:0")


def test_device_resolver_by_name_scope_and_default():
    from tfplaceto.rewrite import DeviceResolver

    gpu = "/job:localhost/replica:0/task:0/device:GPU:{}".format
    resolver = DeviceResolver({"a/x": gpu(0), "a/y": gpu(1), "a/b/z": gpu(1), "c": gpu(0), "d": gpu(0)})
    assert resolver.device_of["a/x"] == gpu(0) and resolver.default == gpu(0)
    assert resolver.scope_device("a") == gpu(1)  # two of the three ops under a/
    assert resolver.scope_device("a/b") == gpu(1) and resolver.scope_device("e") is None
    assert resolver.scope_device(None) is None
    assert resolver.enclosing_scope_device("a/b/new") == gpu(1)
    assert resolver.enclosing_scope_device("a/new") == gpu(1)
    assert resolver.enclosing_scope_device("elsewhere/new") == gpu(0)  # the default
    tie = DeviceResolver({"s/p": gpu(1), "s/q": gpu(0)})
    assert tie.scope_device("s") == gpu(1) and tie.default == gpu(1)  # ties: the first placed
