"""tfplaceto.keras: place_model / strip_placement and PlacementCallback on a real model, on
logical CPU devices.

The devices are checked where TensorFlow executed the ops: RunMetadata of the fit collects the
partition graphs of the train function (one per device the runtime used), and every op the
callback gave a device must sit in that device's partition. Placed training must also compute
exactly what unplaced training computes (both are run), and the model must get its own train
step back afterwards.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

import tfplaceto as tp
import tfplaceto.keras as tpk
from tfplaceto.keras.devices import configure_logical_cpus

# Logical CPU devices exist only if TensorFlow hears of them before it initializes; asking here,
# at collection, leaves the context uninitialized for other modules (ensure_devices would not).
configure_logical_cpus(4)

CLUSTER = "local:2"
RESOURCE_OPS = ("ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def _data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 8)).astype("float32")
    y = (x @ rng.standard_normal((8, 1)) + 0.1).astype("float32")
    return x, y


def _model(optimizer="adam", jit_compile=None):
    inputs = tf.keras.Input((8,), name="features")
    left = tf.keras.layers.Dense(256, activation="relu", name="left")(inputs)
    right = tf.keras.layers.Dense(256, activation="tanh", name="right")(inputs)
    # Every layer is named: default names would advance Keras' global counters for later tests.
    hidden = tf.keras.layers.Dense(64, activation="relu", name="mix")(
        tf.keras.layers.Concatenate(name="both")([left, right]))
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="head")(hidden), name="model")
    model.compile(optimizer=optimizer, loss="mse", jit_compile=jit_compile)
    return model


def _fit_traced(model, callback, epochs=3):
    """fit with RunMetadata on; returns (history, the partition graphs of the train function)."""
    x, y = _data()
    context.context().enable_run_metadata()
    try:
        history = model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0, callbacks=[callback])
        metadata = context.context().export_run_metadata()
    finally:
        context.context().disable_run_metadata()
    partitions = [graph for function in metadata.function_graphs
                  if any("left/MatMul" in node.name for p in function.partition_graphs for node in p.node)
                  for graph in function.partition_graphs]
    return history, partitions


def test_fit_runs_the_training_step_on_the_placed_devices(tmp_path):
    model = _model(jit_compile=True)
    callback = tpk.PlacementCallback(CLUSTER, method="round_robin", log_dir=str(tmp_path / "logs"), verbose=0)
    history, partitions = _fit_traced(model, callback)

    result = callback.result
    assert isinstance(result, tp.OptimizeResult)
    placement = result.placement
    # optimize keeps the best of the method and the baselines; two wide parallel branches make
    # splitting the step pay off on any of them.
    assert len(placement.devices) == 2, result.summary()

    # What the traced step asked for: the placement's devices, on more than one device.
    traced_ops = {op.name: op for function in callback.train_function._list_all_concrete_functions()
                  for op in function.graph.get_operations()}
    requested = {name: tp.cluster.canonical_device_name(op.device) for name, op in traced_ops.items() if op.device}
    assert len(set(requested.values())) == 2
    by_name = [name for name in requested if name in placement]
    assert len(by_name) > 100, "most ops of the step are found in the placement by name"
    assert all(requested[name] == placement[name] for name in by_name)
    assert [n for n in by_name if n.startswith("gradient_tape/model/left/")], "gradient ops are placed too"
    assert callback.assigned_devices == requested

    # What ran: each partition graph holds the ops the runtime put on one device.
    executed, executed_type = {}, {}
    for graph in partitions:
        for node in graph.node:
            executed.setdefault(node.name, tp.cluster.canonical_device_name(node.device))
            executed_type.setdefault(node.name, node.op)
    assert len({device for device in executed.values()}) == 2
    # Ops grappler rewrote (a MatMul+BiasAdd fused into one _FusedMatMul named like the BiasAdd,
    # on the MatMul's device) are not the traced op any more: compare the others.
    checked = [name for name in requested if executed_type.get(name) == traced_ops[name].type]
    assert len(checked) > 50
    moved = [name for name in checked if executed[name] != requested[name]]
    assert not moved, f"ops not run where placed: {moved[:5]}"
    per_device = collections.Counter(executed[name] for name in checked)
    assert min(per_device.values()) > 10, per_device
    heavy = {executed[n] for n in checked if traced_ops[n].type in ("MatMul", "BiasAddGrad")}
    assert len(heavy) == 2, "matrix products and gradients run on both devices"
    # Resource ops stay with their variables (created on CPU:0 before fit).
    variable_device = tp.cluster.canonical_device_name(model.variables[0].device)
    readers = [name for name, op in traced_ops.items() if op.type in RESOURCE_OPS and name in executed]
    assert readers and all(executed[name] == variable_device for name in readers)

    losses = history.history["loss"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert len(callback.step_times_s) == 3 * 8
    assert callback.measured_step_time_s > 0

    # The model is handed back as it came: its own train_step, XLA setting, no placed function.
    assert "train_step" not in vars(model)
    assert model.jit_compile is True
    assert model.train_function is None

    events = {value.tag for path in (tmp_path / "logs").iterdir()
              for event in tf.compat.v1.train.summary_iterator(str(path)) for value in event.summary.value}
    assert {"placement/predicted_step_time_ms", "placement/lower_bound_ms",
            "placement/measured_step_time_ms"} <= events


def test_placed_training_computes_what_unplaced_training_computes():
    placed, plain = _model(tf.keras.optimizers.SGD(0.05)), _model(tf.keras.optimizers.SGD(0.05))
    plain.set_weights(placed.get_weights())
    x, y = _data(seed=1)
    callback = tpk.PlacementCallback(CLUSTER, method="round_robin", verbose=0)
    placed_history = placed.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=[callback])
    plain_history = plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(placed_history.history["loss"], plain_history.history["loss"], rtol=1e-5)
    for a, b in zip(placed.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_default_method_and_a_second_fit_without_the_callback():
    model = _model()
    x, y = _data(n=64)
    callback = tpk.PlacementCallback(CLUSTER, verbose=0)  # "placeto": the best baseline until the policy is in
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    assert callback.result.method_used in tp.METHODS
    assert callback.result.step_time_s <= min(callback.result.baselines.values()) + 1e-12
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # retraced, unplaced
    assert np.isfinite(history.history["loss"]).all()
    assert model.train_function is not None and callback.train_function is not model.train_function
    first = callback.result
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    assert callback.result is first, "the same model is not placed twice"


def test_bad_clusters_raise_invalid_cluster_error():
    tpk.ensure_devices("local:4")  # initializes TensorFlow with the four logical CPUs
    with pytest.raises(tp.errors.InvalidClusterError, match="unknown cluster preset"):
        tpk.PlacementCallback("8xQ100")
    with pytest.raises(tp.errors.InvalidClusterError, match=r"call tfplaceto.keras.ensure_devices\('local:64'\) first"):
        tpk.PlacementCallback("local:64")
    if not tf.config.list_physical_devices("GPU"):
        with pytest.raises(tp.errors.InvalidClusterError, match="does not have the devices"):
            tpk.PlacementCallback("4xV100")
    with pytest.raises(tp.errors.InvalidClusterError):
        tpk.PlacementCallback(42)


def test_a_model_that_runs_eagerly_is_refused_at_train_begin():
    model = _model()
    model.compile(optimizer="adam", loss="mse", run_eagerly=True)
    x, y = _data(n=32)
    with pytest.raises(tp.errors.TfplacetoError, match="eagerly"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[tpk.PlacementCallback(CLUSTER, verbose=0)])


# -- place_model / strip_placement --------------------------------------------------------------

def _traced_devices(model) -> dict[str, str]:
    """op name -> canonical device requested, for every op of the model's train function."""
    return {op.name: tp.cluster.canonical_device_name(op.device)
            for function in model.train_function._list_all_concrete_functions()
            for op in function.graph.get_operations() if op.device}


def test_place_model_trains_exactly_as_the_original_and_strip_placement_restores_it():
    placed, plain = _model(tf.keras.optimizers.SGD(0.05)), _model(tf.keras.optimizers.SGD(0.05))
    plain.set_weights(placed.get_weights())
    x, y = _data(seed=2)

    result = tpk.place_model(placed, CLUSTER, method="round_robin", batch_size=32)
    assert isinstance(result, tp.OptimizeResult) and result.method_used == "round_robin"
    assert len(result.placement.devices) == 2
    assert "train_step" in vars(placed) and "train_step" not in vars(plain)

    placed_history = placed.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    plain_history = plain.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    requested = _traced_devices(placed)
    assert len(set(requested.values())) == 2, "the step fit ran is spread over both devices"
    assert all(requested[name] == result.placement[name] for name in requested if name in result.placement)
    # Same data, same initial weights, same kernels: the same numbers, bit for bit.
    np.testing.assert_array_equal(placed_history.history["loss"], plain_history.history["loss"])
    for a, b in zip(placed.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(placed.predict(x, verbose=0), plain.predict(x, verbose=0))

    assert tpk.strip_placement(placed) is placed
    assert "train_step" not in vars(placed) and placed.train_function is None
    placed.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    plain.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    assert not set(_traced_devices(placed).values()) - {""}, "stripped: the step is traced unplaced"
    for a, b in zip(placed.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert tpk.strip_placement(placed) is placed  # not placed: unchanged


def test_place_model_twice_replaces_the_placement_and_restores_xla():
    model = _model(jit_compile=True)
    first = tpk.place_model(model, CLUSTER, method="round_robin", batch_size=16)
    assert model.jit_compile is False, "XLA is off while the model is placed"
    second = tpk.place_model(model, CLUSTER, method="single", batch_size=16)
    assert second.method_used == "single" and second is not first
    x, y = _data(n=32)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert len(set(_traced_devices(model).values())) == 1, "the second placement, not both wrapped"
    tpk.strip_placement(model)
    assert "train_step" not in vars(model) and model.jit_compile is True
    # A result can be applied again without optimizing: the callback's second fit does this.
    assert tpk.place_model(model, CLUSTER, batch_size=16, result=first) is first
    tpk.strip_placement(model)


def test_place_model_refuses_what_it_cannot_place():
    inputs = tf.keras.Input((8,), name="features")
    uncompiled = tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="head")(inputs), name="plain")
    with pytest.raises(tp.errors.InvalidGraphError, match="compiled"):
        tpk.place_model(uncompiled, CLUSTER)
    with pytest.raises(tp.errors.InvalidGraphError, match="batch_size=N"):
        tpk.place_model(_model(), CLUSTER, method="round_robin")  # the input's batch is None
    with pytest.raises(tp.errors.InvalidMethodError):
        tpk.place_model(_model(), CLUSTER, method="nope", batch_size=8)
