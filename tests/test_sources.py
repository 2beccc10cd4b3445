"""tfplaceto.graph.sources: every kind of source becomes a self-contained, call-free GraphDef.

- GraphDef (copied, never modified), MetaGraphDef (train_op fetches), tf.Graph, and .pb/.pbtxt files
  of either, binary and text.
- ConcreteFunction / tf.function: captured variables become VarHandleOps with their values, nested
  calls are inlined (none left), and the GraphDef run in a Session equals the eager call.
- Keras: a compiled model gives its whole training step (forward, loss, gradients, optimizer update,
  dropout, BatchNorm moving averages) without touching the model's variables or optimizer, and one
  step in a Session equals train_on_batch; an uncompiled model gives its forward pass.
- SavedModel directories (signature_key), and the errors for bad input.
"""

from __future__ import annotations

import collections
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # tfplaceto importable without an install
    sys.path.insert(0, str(ROOT))

from tfplaceto import errors  # noqa: E402
from tfplaceto.graph import sources  # noqa: E402
from tfplaceto.graph.sources import load_source  # noqa: E402
from tfplaceto.measure.session import initialize_variables  # noqa: E402

CALL_OPS = {"PartitionedCall", "StatefulPartitionedCall"}


# -- helpers ----------------------------------------------------------------------------------------

def op_counts(loaded: sources.LoadedGraph) -> collections.Counter:
    return collections.Counter(node.op for node in loaded.graph_def.node)


def run_loaded(loaded: sources.LoadedGraph, feed: dict[str, np.ndarray],
               read_variables: bool = False):
    """Runs the fetches in a fresh Session; optionally also returns every variable's new value
    keyed by its shared_name."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(loaded.graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        initialize_variables(session, graph, loaded.variable_values)
        outputs = session.run([f"{name}:0" for name in loaded.fetches],
                              {f"{name}:0": value for name, value in feed.items()})
        if not read_variables:
            return outputs
        with graph.as_default():
            reads = {}
            for node in loaded.graph_def.node:
                if node.op == "VarHandleOp":
                    handle = graph.get_operation_by_name(node.name).outputs[0]
                    reads[node.attr["shared_name"].s.decode()] = tf.raw_ops.ReadVariableOp(
                        resource=handle, dtype=node.attr["dtype"].type)
        return outputs, session.run(reads)


def tf1_graph() -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        hidden = tf.nn.relu(x * 2.0, name="hidden")
        y = tf.reduce_sum(hidden, axis=1, name="y")
        tf.compat.v1.add_to_collection("train_op", y.op)
    return graph


# -- GraphDef, MetaGraphDef, tf.Graph, files --------------------------------------------------------

def test_graph_def_is_copied_and_never_modified():
    graph_def = tf1_graph().as_graph_def()
    before = graph_def.SerializeToString(deterministic=True)
    loaded = load_source(graph_def, fetches="y:0")
    assert loaded.graph_def is not graph_def
    assert graph_def.SerializeToString(deterministic=True) == before
    assert loaded.fetches == ("y",)
    assert loaded.feeds == (("x", [None, 2], "float32"),)
    assert loaded.variable_values == {}
    # No fetches given: empty, meaning "the sinks".
    assert load_source(graph_def).fetches == ()
    (value,) = run_loaded(loaded, {"x": np.array([[1.0, -1.0]], np.float32)})
    np.testing.assert_allclose(value, [2.0])


def test_meta_graph_def_and_tf_graph_default_to_train_op():
    graph = tf1_graph()
    with graph.as_default():
        meta_graph = tf.compat.v1.train.export_meta_graph(graph=graph)
    assert load_source(meta_graph).fetches == ("y",)
    assert load_source(graph).fetches == ("y",)
    assert load_source(meta_graph, fetches=["hidden"]).fetches == ("hidden",)


@pytest.mark.parametrize("kind", ["graph_def", "meta_graph_def"])
@pytest.mark.parametrize("suffix", [".pb", ".pbtxt"])
def test_files(tmp_path, kind, suffix):
    graph = tf1_graph()
    if kind == "graph_def":
        proto = graph.as_graph_def()
    else:
        with graph.as_default():
            proto = tf.compat.v1.train.export_meta_graph(graph=graph)
    path = tmp_path / f"graph{suffix}"
    if suffix == ".pb":
        path.write_bytes(proto.SerializeToString())
    else:
        path.write_text(str(proto))
    loaded = load_source(str(path))
    assert {node.name for node in loaded.graph_def.node} >= {"x", "hidden", "y"}
    assert loaded.fetches == (("y",) if kind == "meta_graph_def" else ())
    assert str(path) in loaded.description
    assert load_source(path).fetches == loaded.fetches  # a pathlib.Path works too


def test_tf1_while_loop_passes_through_unchanged():
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.disable_control_flow_v2()
        try:
            x = tf.compat.v1.placeholder(tf.float32, [], name="x")
            tf.identity(tf.while_loop(lambda v: v < 10.0, lambda v: v * 2.0, [x])[0], name="out")
        finally:
            tf.compat.v1.enable_control_flow_v2()
    graph_def = graph.as_graph_def()
    loaded = load_source(graph_def)
    assert loaded.graph_def.SerializeToString(deterministic=True) == \
        graph_def.SerializeToString(deterministic=True)
    assert {"Enter", "Exit", "NextIteration", "Merge"} <= set(op_counts(loaded))


# -- ConcreteFunction / tf.function ------------------------------------------------------------------

def make_function():
    """A function with a captured variable, a captured large constant, nested calls (one inside a
    while loop body, one XLA-compiled) and a cond."""
    weights = tf.Variable(tf.random.stateless_normal([3, 3], seed=[1, 2]), name="weights")
    table = tf.constant(np.arange(3000, dtype=np.float32).reshape(1000, 3))

    @tf.function
    def layer(x):
        return tf.tanh(tf.matmul(x, weights))

    @tf.function(jit_compile=True)
    def compiled(x):
        return x * 3.0 + 1.0

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
    def model(x):
        y = layer(x)
        _, y = tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, layer(v)), [0, y])
        z = tf.cond(tf.reduce_sum(x) > 0, lambda: compiled(y), lambda: y - 1.0)
        return {"z": z, "total": tf.reduce_sum(table) + tf.reduce_sum(z)}

    return model, weights


def test_concrete_function_is_inlined_self_contained_and_runs_the_same():
    model, weights = make_function()
    function = model.get_concrete_function()
    loaded = load_source(function)
    counts = op_counts(loaded)
    assert not CALL_OPS & set(counts)
    assert not loaded.graph_def.library.function  # everything inlined, loops lowered
    assert counts["VarHandleOp"] == 1 and counts["MatMul"] >= 2
    assert not [node for node in loaded.graph_def.node
                if node.op == "Placeholder" and node.attr["dtype"].type == tf.resource.as_datatype_enum]
    assert loaded.feeds == (("x", [None, 3], "float32"),)
    assert len(loaded.fetches) == 2
    (name, value), = loaded.variable_values.items()
    np.testing.assert_array_equal(value, weights.numpy())
    handle = next(node for node in loaded.graph_def.node if node.name == name)
    assert handle.op == "VarHandleOp" and handle.attr["shared_name"].s == b"weights"

    x = np.random.RandomState(0).randn(4, 3).astype(np.float32)
    for sign in (1.0, -1.0):  # both branches of the cond
        expected = function(tf.constant(sign * np.abs(x)))
        by_name = dict(zip(loaded.fetches, run_loaded(loaded, {"x": sign * np.abs(x)}), strict=True))
        outputs = {key: by_name[tensor.op.name]
                   for key, tensor in function.structured_outputs.items()}
        np.testing.assert_allclose(outputs["z"], expected["z"].numpy(), rtol=1e-5)
        np.testing.assert_allclose(outputs["total"], expected["total"].numpy(), rtol=1e-5)


def test_tf_function_and_functional_control_flow_kept_on_request():
    model, _ = make_function()
    loaded = load_source(model, lower_control_flow=False)  # tf.function with input_signature
    counts = op_counts(loaded)
    assert not CALL_OPS & set(counts)
    assert counts["While"] == 1 and counts["StatelessIf"] + counts["If"] == 1
    assert "Enter" not in counts
    library = {function.signature.name for function in loaded.graph_def.library.function}
    for function in loaded.graph_def.library.function:  # bodies are call-free too
        assert not [node for node in function.node_def
                    if node.op in CALL_OPS or node.op in library]


def test_tensor_name_fetches_and_unknown_fetch():
    model, _ = make_function()
    function = model.get_concrete_function()
    output = function.outputs[0].name  # "Identity:0"
    assert load_source(function, fetches=[output]).fetches == (output.split(":")[0],)
    with pytest.raises(errors.InvalidGraphError, match="Identiy.*nearby names: 'Identity"):
        load_source(function, fetches="Identiy:0")


# -- Keras ---------------------------------------------------------------------------------------------

def small_cnn(compiled: bool = True, dropout: float = 0.5):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.layers.Input((8, 8, 3)),
        tf.keras.layers.Conv2D(4, 3, activation="relu"),
        tf.keras.layers.BatchNormalization(),
        tf.keras.layers.Dropout(dropout),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(5),
    ])
    if compiled:
        model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_keras_compiled_model_gives_the_whole_training_step_and_leaves_the_model_alone():
    model = small_cnn()
    before = [variable.numpy().copy() for variable in model.variables]
    optimizer = model.optimizer
    loaded = load_source(model)
    counts = op_counts(loaded)
    for op in ("Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "FusedBatchNormV3",
               "FusedBatchNormGradV3", "RandomUniform", "SparseSoftmaxCrossEntropyWithLogits",
               "AssignVariableOp", "AssignSubVariableOp", "VarHandleOp"):
        assert counts[op] >= 1, op
    assert not CALL_OPS & set(counts)
    assert "training step" in loaded.description
    # Keras 2.15 Adam updates its slots with AssignAdd/AssignSub and the weights with
    # AssignSubVariableOp: 6 trainable weights, each with an m and a v slot.
    shared_names = {node.attr["shared_name"].s.decode() for node in loaded.graph_def.node
                    if node.op == "VarHandleOp"}
    assert {"conv2d/kernel", "batch_normalization/moving_mean", "iteration"} <= shared_names
    assert sum(name.startswith(("m/", "v/")) for name in shared_names) == 2 * 6
    assert loaded.feeds == (("x", [None, 8, 8, 3], "float32"), ("y", [None], "int32"))
    # The model and its optimizer are untouched: same values, optimizer not built, fit still works.
    assert model.optimizer is optimizer
    assert not getattr(optimizer, "_built", False)
    for old, variable in zip(before, model.variables, strict=True):
        np.testing.assert_array_equal(old, variable.numpy())
    model.fit(np.zeros((2, 8, 8, 3), np.float32), np.zeros(2, np.int32), verbose=0)


def test_keras_training_step_in_a_session_equals_train_on_batch():
    model = small_cnn(dropout=0.0)  # no randomness, so one step is comparable
    rng = np.random.RandomState(1)
    x = rng.randn(6, 8, 8, 3).astype(np.float32)
    y = rng.randint(0, 5, size=6).astype(np.int32)
    loaded = load_source(model)
    (loss,), variables = run_loaded(loaded, {"x": x, "y": y}, read_variables=True)
    expected_loss = model.train_on_batch(x, y)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-4)
    for variable in model.variables:  # trainable weights and BatchNorm moving statistics
        np.testing.assert_allclose(variables[variable.name[:-2]], variable.numpy(),
                                   rtol=1e-4, atol=1e-6, err_msg=variable.name)


def test_keras_uncompiled_model_gives_the_forward_pass():
    model = small_cnn(compiled=False)
    loaded = load_source(model)
    counts = op_counts(loaded)
    assert counts["Conv2D"] == 1 and "Conv2DBackpropFilter" not in counts
    assert "RandomUniform" not in counts  # inference: no dropout
    assert "forward pass" in loaded.description
    x = np.random.RandomState(2).randn(3, 8, 8, 3).astype(np.float32)
    (value,) = run_loaded(loaded, {"x": x})
    np.testing.assert_allclose(value, model(x, training=False).numpy(), rtol=1e-4, atol=1e-5)


def test_keras_lstm_with_mse_loss_is_inlined():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.layers.Input((4, 3)), tf.keras.layers.LSTM(5),
                                 tf.keras.layers.Dense(2)])
    model.compile(tf.keras.optimizers.legacy.SGD(0.1, momentum=0.9), "mse")
    loaded = load_source(model)
    counts = op_counts(loaded)
    assert not CALL_OPS & set(counts)
    assert {"Enter", "NextIteration", "ResourceApplyKerasMomentum"} <= set(counts)
    assert loaded.feeds[1] == ("y", [None, 2], "float32")
    rng = np.random.RandomState(3)
    x, y = rng.randn(4, 4, 3).astype(np.float32), rng.randn(4, 2).astype(np.float32)
    (loss,) = run_loaded(loaded, {"x": x, "y": y})
    np.testing.assert_allclose(loss, model.train_on_batch(x, y), rtol=1e-4)


# -- SavedModel --------------------------------------------------------------------------------------

class Affine(tf.Module):
    def __init__(self):
        super().__init__()
        self.kernel = tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, name="w")
        self.bias = tf.Variable(np.ones(4, np.float32), name="w")  # same name on purpose

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="inputs")])
    def __call__(self, x):
        return {"y": tf.nn.relu(tf.matmul(x, self.kernel) + self.bias)}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="inputs")])
    def scale(self, x):
        return {"scaled": x * self.bias}


def test_saved_model_directory(tmp_path):
    module = Affine()
    directory = str(tmp_path / "saved")
    tf.saved_model.save(module, directory, signatures={"serving_default": module.__call__,
                                                       "scale": module.scale})
    loaded = load_source(directory)
    counts = op_counts(loaded)
    assert not CALL_OPS & set(counts) and counts["VarHandleOp"] == 2
    assert loaded.feeds == (("inputs", [None, 3], "float32"),)
    shared = sorted(node.attr["shared_name"].s for node in loaded.graph_def.node
                    if node.op == "VarHandleOp")
    assert shared == [b"w", b"w_1"]  # made unique: equal shared names would alias in a Session
    x = np.random.RandomState(4).randn(5, 3).astype(np.float32)
    (value,) = run_loaded(loaded, {"inputs": x})
    np.testing.assert_allclose(value, module(x)["y"].numpy(), rtol=1e-5)

    scaled = load_source(directory, signature_key="scale")
    assert "scale" in scaled.description and scaled.feeds[0][1] == [None, 4]
    assert load_source(os.path.join(directory, "saved_model.pb")).fetches == loaded.fetches
    with pytest.raises(errors.InvalidGraphError, match="no signature 'nope'.*'scale'"):
        load_source(directory, signature_key="nope")


# -- errors --------------------------------------------------------------------------------------------

def test_errors_for_bad_sources(tmp_path):
    garbage = tmp_path / "garbage.pb"
    garbage.write_bytes(np.random.RandomState(5).bytes(300))
    with pytest.raises(errors.InvalidGraphError, match="neither a binary nor a text"):
        load_source(str(garbage))
    unknown_op = tmp_path / "unknown.pbtxt"
    unknown_op.write_text('node { name: "a" op: "NoSuchOpAnywhere" }')
    with pytest.raises(errors.InvalidGraphError, match="NoSuchOpAnywhere.*does not know"):
        load_source(str(unknown_op))
    dangling = tmp_path / "dangling.pbtxt"
    dangling.write_text('node { name: "a" op: "Identity" input: "missing:0" '
                        'attr { key: "T" value { type: DT_FLOAT } } }')
    with pytest.raises(errors.InvalidGraphError, match="reads 'missing:0'"):
        load_source(str(dangling))
    with pytest.raises(errors.InvalidGraphError, match="does not exist"):
        load_source(str(tmp_path / "missing.pb"))
    with pytest.raises(errors.InvalidGraphError, match="not a SavedModel"):
        load_source(str(tmp_path))
    with pytest.raises(errors.InvalidGraphError, match="cannot import a graph from a builtins.int"):
        load_source(3)
    with pytest.raises(errors.InvalidGraphError, match="no_such_graph"):
        load_source("builtin:no_such_graph")
    with pytest.raises(errors.InvalidGraphError, match="fetch 'hiden'.*'hidden'"):
        load_source(tf1_graph().as_graph_def(), fetches=["hiden:0"])
    with pytest.raises(errors.InvalidGraphError, match="no input_signature"):
        load_source(tf.function(lambda x: x + 1))
    with pytest.raises(errors.InvalidGraphError, match="no known input shape"):
        load_source(tf.keras.Sequential([tf.keras.layers.Dense(2)]))


def test_initialize_variables_checks_names():
    graph = tf1_graph()
    with tf.compat.v1.Session(graph=graph) as session:
        with pytest.raises(errors.InvalidGraphError, match="not an op"):
            initialize_variables(session, graph, {"nope": np.zeros(2)})
        with pytest.raises(errors.InvalidGraphError, match="not a VarHandleOp"):
            initialize_variables(session, graph, {"x": np.zeros(2)})
