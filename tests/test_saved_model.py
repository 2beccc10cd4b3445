"""saved_model.rewrite: the placed copy loads, computes the same, runs placed; the source is untouched.

Round trips on a Keras model and on a tf.Module with two signatures, on two logical CPU devices:
outputs of every signature are compared, and RunMetadata shows the rewritten signature really
executing on both devices. Bad input raises a typed error and writes nothing.
"""

import hashlib
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.eager import context

import tfplaceto as tp
from tfplaceto import cli
from tfplaceto import saved_model as tsm
from tfplaceto.keras.devices import configure_logical_cpus

configure_logical_cpus(4)  # before TensorFlow initializes (see test_keras.py)

CLUSTER = "local:2"
DEVICES = {f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(2)}


class TwoSignatures(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.random.normal([8, 64], seed=1))
        self.v = tf.Variable(tf.random.normal([64, 4], seed=2))
        self.u = tf.Variable(tf.random.normal([8, 64], seed=3))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def predict(self, x):
        return {"y": (tf.nn.relu(x @ self.w) + tf.tanh(x @ self.u)) @ self.v}

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32), tf.TensorSpec([], tf.float32)])
    def score(self, x, scale):
        return {"z": tf.reduce_sum(tf.nn.relu(x @ self.w), axis=1) * scale}


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("module") / "saved")
    module = TwoSignatures()
    tf.saved_model.save(module, path, signatures={"serving_default": module.predict, "score": module.score})
    return path


@pytest.fixture(scope="module")
def keras_dir(tmp_path_factory):
    # Every layer is named: default names would advance Keras' global counters for later tests.
    inputs = tf.keras.Input((16,), name="features")
    left = tf.keras.layers.Dense(128, activation="relu", name="left")(inputs)
    left = tf.keras.layers.BatchNormalization(name="left_bn")(left)
    right = tf.keras.layers.Dense(128, activation="tanh", name="right")(inputs)
    outputs = tf.keras.layers.Dense(5, name="head")(tf.keras.layers.Concatenate(name="both")([left, right]))
    path = str(tmp_path_factory.mktemp("keras") / "saved")
    tf.saved_model.save(tf.keras.Model(inputs, outputs, name="towers"), path)
    return path


def _fingerprint(directory):
    """path -> sha256 of every file, and the mode of every entry."""
    result = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            digest = ""
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            result[os.path.relpath(path, directory)] = (digest, os.stat(path).st_mode)
    return result


def _inputs(function, batch=6):
    rng = np.random.default_rng(0)
    _, kwargs = function.structured_input_signature
    return {name: tf.constant(rng.standard_normal([batch if d is None else d for d in spec.shape]), spec.dtype)
            for name, spec in kwargs.items()}


def _assert_same_outputs(src, dst):
    original, placed = tf.saved_model.load(src), tf.saved_model.load(dst)
    assert set(original.signatures) == set(placed.signatures)
    for key, function in original.signatures.items():
        inputs = _inputs(function)
        expected, actual = function(**inputs), placed.signatures[key](**inputs)
        assert expected.keys() == actual.keys()
        for name in expected:
            np.testing.assert_allclose(actual[name].numpy(), expected[name].numpy(), rtol=1e-6, atol=1e-6)


def _executed_devices(path, key):
    """Device of every op the runtime ran for one call of signature key of a fresh load."""
    loaded = tf.saved_model.load(path)
    function = loaded.signatures[key]
    context.context().enable_run_metadata()
    try:
        function(**_inputs(function))
        metadata = context.context().export_run_metadata()
    finally:
        context.context().disable_run_metadata()
    return {node.name: (node.op, tp.cluster.canonical_device_name(node.device))
            for graph in metadata.function_graphs for partition in graph.partition_graphs
            for node in partition.node}


def _meta_graph(path):
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return proto.meta_graphs[0]


def _function_devices(meta_graph, name_part):
    return {node.device for function in meta_graph.graph_def.library.function
            if name_part in function.signature.name for node in function.node_def}


def test_keras_round_trip(keras_dir, tmp_path):
    before = _fingerprint(keras_dir)
    dst = str(tmp_path / "placed")
    result = tsm.rewrite(keras_dir, dst, CLUSTER, method="round_robin", batch_size=32)
    assert _fingerprint(keras_dir) == before, "the source SavedModel is never modified"
    assert isinstance(result, tp.OptimizeResult) and set(result.placement.values()) <= DEVICES
    assert len(result.placement.devices) == 2, result.summary()
    assert sorted(os.listdir(dst)) == sorted(os.listdir(keras_dir))
    assert not [n for n in os.listdir(tmp_path) if n != "placed"], "no temporary directory left"
    for name in os.listdir(os.path.join(keras_dir, "variables")):
        with open(os.path.join(keras_dir, "variables", name), "rb") as a, \
                open(os.path.join(dst, "variables", name), "rb") as b:
            assert a.read() == b.read(), "the checkpoint is copied unchanged"
    _assert_same_outputs(keras_dir, dst)

    # The model's forward function carries the placement's devices ...
    assert _function_devices(_meta_graph(dst), "wrapped_model") == DEVICES
    assert _function_devices(_meta_graph(keras_dir), "wrapped_model") == {""}
    # ... and the runtime runs it there: matrix products on both devices.
    executed = _executed_devices(dst, "serving_default")
    products = {device for op, device in executed.values() if op in ("MatMul", "_MklMatMul", "_FusedMatMul")}
    assert products == DEVICES, executed


def test_module_with_two_signatures(module_dir, tmp_path):
    before = _fingerprint(module_dir)
    dst = str(tmp_path / "placed")
    result = tsm.rewrite(module_dir, dst, CLUSTER, method="round_robin", batch_size=32)
    assert _fingerprint(module_dir) == before
    _assert_same_outputs(module_dir, dst)
    assert any(name.startswith("StatefulPartitionedCall/") for name in result.placement), "inlined names"
    meta_graph = _meta_graph(dst)
    for part in ("_predict_", "_score_"):
        devices = _function_devices(meta_graph, part)
        assert devices and devices <= DEVICES, (part, devices)
    # Save and restore functions are not part of any signature: left as they were.
    assert _function_devices(meta_graph, "traced_save") == _function_devices(_meta_graph(module_dir), "traced_save")
    # Variable devices are recorded, and honoured when the loader is asked to.
    recorded = [node.variable.device for node in meta_graph.object_graph_def.nodes
                if node.WhichOneof("kind") == "variable"]
    assert recorded and set(recorded) <= DEVICES
    options = tf.saved_model.LoadOptions(
        experimental_variable_policy=tf.saved_model.experimental.VariablePolicy.SAVE_VARIABLE_DEVICES)
    loaded = tf.saved_model.load(dst, options=options)
    assert sorted(tp.cluster.canonical_device_name(v.device) for v in (loaded.w, loaded.v, loaded.u)) == \
        sorted(recorded)
    inputs = _inputs(loaded.signatures["serving_default"])
    np.testing.assert_allclose(loaded.signatures["serving_default"](**inputs)["y"].numpy(),
                               tf.saved_model.load(module_dir).signatures["serving_default"](**inputs)["y"].numpy(),
                               rtol=1e-6, atol=1e-6)


def test_only_the_chosen_signature_is_placed(module_dir, tmp_path):
    dst = str(tmp_path / "placed")
    result = tsm.rewrite(module_dir, dst, CLUSTER, method="round_robin", signature_keys="score", batch_size=4)
    assert any("Sum" in name for name in result.placement), "the result is the score signature's"
    meta_graph = _meta_graph(dst)
    assert _function_devices(meta_graph, "_score_") <= DEVICES
    assert _function_devices(meta_graph, "_predict_") == {""}
    _assert_same_outputs(module_dir, dst)


def test_placing_for_gpus_this_machine_lacks_still_loads_and_computes_the_same(module_dir, tmp_path):
    dst = str(tmp_path / "placed")
    result = tsm.rewrite(module_dir, dst, "4xV100", method="round_robin", batch_size=32)
    assert all("GPU" in d or "CPU:0" in d for d in result.placement.values())
    _assert_same_outputs(module_dir, dst)  # soft placement runs GPU ops on the CPU here


@pytest.mark.parametrize("case", ["missing", "not_a_saved_model", "dst_not_empty", "dst_inside_src",
                                  "unknown_signature", "bad_cluster", "bad_method", "dst_is_a_file"])
def test_bad_input_raises_a_typed_error_and_writes_nothing(case, module_dir, tmp_path):
    src, dst = module_dir, str(tmp_path / "out")
    kwargs = {}
    expected = tp.errors.InvalidGraphError
    if case == "missing":
        src = str(tmp_path / "nowhere")
    elif case == "not_a_saved_model":
        src = str(tmp_path / "plain")
        os.makedirs(src)
        with open(os.path.join(src, "model.h5"), "wb") as f:
            f.write(b"not a SavedModel")
    elif case == "dst_not_empty":
        os.makedirs(dst)
        with open(os.path.join(dst, "keep.txt"), "w") as f:
            f.write("mine")
        expected = tp.errors.TfplacetoError
    elif case == "dst_inside_src":
        dst = os.path.join(module_dir, "placed")
        expected = tp.errors.TfplacetoError
    elif case == "unknown_signature":
        kwargs["signature_keys"] = ["serving_default", "nope"]
    elif case == "bad_cluster":
        kwargs["cluster"] = "3xQ100"
        expected = tp.errors.InvalidClusterError
    elif case == "bad_method":
        kwargs["method"] = "fastest"
        expected = tp.errors.InvalidMethodError
    elif case == "dst_is_a_file":
        with open(dst, "w") as f:
            f.write("mine")
        expected = tp.errors.TfplacetoError
    src_before = _fingerprint(module_dir)
    listing = sorted(os.listdir(tmp_path))
    dst_before = _fingerprint(dst) if os.path.isdir(dst) else None
    with pytest.raises(expected):
        tsm.rewrite(src, dst, kwargs.pop("cluster", CLUSTER), **{"method": "round_robin", **kwargs})
    assert sorted(os.listdir(tmp_path)) == listing, "nothing written next to dst"
    assert _fingerprint(module_dir) == src_before
    if dst_before is not None:
        assert _fingerprint(dst) == dst_before
    elif case != "dst_is_a_file":
        assert not os.path.exists(dst)


def test_an_empty_existing_destination_is_filled(module_dir, tmp_path):
    dst = tmp_path / "empty"
    dst.mkdir()
    tsm.rewrite(module_dir, str(dst), CLUSTER, method="single", batch_size=32)
    assert (dst / "saved_model.pb").exists()


def test_a_failure_while_writing_leaves_no_partial_destination(module_dir, tmp_path, monkeypatch):
    def broken(export_dir):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tsm, "_write_fingerprint", broken)
    with pytest.raises(OSError):
        tsm.rewrite(module_dir, str(tmp_path / "out"), CLUSTER, method="single", batch_size=32)
    assert os.listdir(tmp_path) == []


def test_cli_rewrite_saved_model(module_dir, tmp_path, capsys):
    dst = str(tmp_path / "placed")
    assert cli.main(["rewrite-saved-model", module_dir, dst, "--cluster", CLUSTER, "--method", "round_robin",
                     "--batch-size", "32"]) == 0
    assert "chosen" in capsys.readouterr().out
    _assert_same_outputs(module_dir, dst)

    before = _fingerprint(dst)
    assert cli.main(["rewrite-saved-model", module_dir, dst, "--cluster", CLUSTER]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not empty" in err and "Traceback" not in err
    assert _fingerprint(dst) == before

    assert cli.main(["rewrite-saved-model", module_dir, str(tmp_path / "other"), "--cluster", "9xZ1"]) == 2
    assert capsys.readouterr().err.startswith("tfplaceto: error: unknown cluster preset")
    assert not os.path.exists(tmp_path / "other")
