"""A Keras model as one traced step: its whole training step when compiled, else its forward pass.

  is_keras_model      whether a source is a Keras model (without importing Keras).
  traced_step         (ConcreteFunction, description) of the step, inside the lifetime of the
                      optimizer the step uses; `tfplaceto.graph.sources` imports it from there.
  _tracing_optimizer  the optimizer with its slot variables (an unbuilt one cloned for the trace).
  _keras_input_spec, _keras_target_spec  the TensorSpecs the step is traced for.
  _loss_label         a readable name of the compiled loss.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import tensorflow as tf

from tfplaceto import errors


def is_keras_model(source: Any) -> bool:
    # Importing Keras costs seconds: only a process that already imported it can hold a model.
    model_types = tuple(module.Model for module in (sys.modules.get("keras"),
                                                    sys.modules.get("tf_keras"))
                        if module is not None and isinstance(getattr(module, "Model", None), type))
    return bool(model_types) and isinstance(source, model_types)


@contextlib.contextmanager
def traced_step(model) -> Iterator[tuple[Any, str]]:
    """Yields (ConcreteFunction, description): a compiled model's whole training step
    (`model.train_step` on (x, y), or on (x,) when compiled without a loss), else its forward
    pass `model(x, training=False)`. The step's optimizer (possibly a clone, owner of the slot
    variables) lives until the block ends: read the function's variables inside it.
    """
    x_spec = _keras_input_spec(model)
    name = getattr(model, "name", type(model).__name__)
    compiled = (getattr(model, "optimizer", None) is not None
                and getattr(model, "compiled_loss", None) is not None)
    if not compiled:
        forward = tf.function(lambda x: model(x, training=False), jit_compile=False,
                              autograph=True)
        yield forward.get_concrete_function(x_spec), f"Keras model {name!r} forward pass"
        return

    loss = getattr(model, "loss", None)
    # compile() without a loss leaves {} (or None): only add_loss terms, so no targets to feed.
    uses_targets = not (loss is None or (isinstance(loss, (Mapping, list, tuple)) and not loss))
    y_spec = _keras_target_spec(model, x_spec) if uses_targets else None
    with _tracing_optimizer(model) as optimizer:
        if uses_targets:
            def train_step(x, y):
                return model.train_step((x, y))
            step = tf.function(train_step, jit_compile=False)
            function = step.get_concrete_function(x_spec, y_spec)
        else:
            # Compiled without a loss: only the model's own add_loss terms are minimized.
            step = tf.function(lambda x: model.train_step((x,)), jit_compile=False)
            function = step.get_concrete_function(x_spec)
        yield function, (f"Keras model {name!r} training step "
                         f"({type(optimizer).__name__}, loss {_loss_label(model.loss)})")


@contextlib.contextmanager
def _tracing_optimizer(model) -> Iterator[Any]:
    """Yields the optimizer the traced train step uses, with its slot variables created.

    An optimizer that already has slots (the model was trained) is used as is: tracing adds no
    state to it. An unbuilt one is cloned from its config and swapped in for the trace only, so the
    user's optimizer is not built for today's trainable variables (which would make it reject a
    later fit after, say, unfreezing layers). If it cannot be cloned, it is built, as fit would.
    """
    optimizer = model.optimizer
    if _optimizer_is_built(optimizer):
        yield optimizer
        return
    try:
        clone = type(optimizer).from_config(optimizer.get_config())
    except Exception:  # custom optimizers may not round-trip their config
        clone = None
    if clone is None:
        _build_optimizer(optimizer, model.trainable_variables)
        yield optimizer
        return
    _build_optimizer(clone, model.trainable_variables)
    model.optimizer = clone
    try:
        yield clone
    finally:
        model.optimizer = optimizer


def _optimizer_is_built(optimizer) -> bool:
    inner = getattr(optimizer, "inner_optimizer", None)  # LossScaleOptimizer wraps the real one
    if inner is not None:
        return _optimizer_is_built(inner)
    if hasattr(optimizer, "_create_all_weights"):  # legacy OptimizerV2: slots made on first use
        return bool(getattr(optimizer, "_slots", None))
    return bool(getattr(optimizer, "_built", False))  # Keras 2.11+ optimizer


def _build_optimizer(optimizer, variables) -> None:
    inner = getattr(optimizer, "inner_optimizer", None)
    with tf.init_scope():
        if inner is not None:
            _build_optimizer(inner, variables)
        elif hasattr(optimizer, "_create_all_weights"):
            optimizer._create_all_weights(variables)
        else:
            optimizer.build(variables)


def _keras_input_spec(model) -> Any:
    """TensorSpecs (batch dim unknown) with the structure the model is called with."""
    def spec(tensor):
        shape = tf.TensorShape(tensor.shape)
        if shape.rank:
            shape = tf.TensorShape([None, *shape.as_list()[1:]])
        return tf.TensorSpec(shape, tensor.dtype)

    if getattr(model, "_is_graph_network", False):
        return tf.nest.map_structure(spec, model._nested_inputs)
    save_spec = model.save_spec(dynamic_batch=True) if hasattr(model, "save_spec") else None
    if save_spec and save_spec[0]:
        return tf.nest.map_structure(spec, save_spec[0][0])
    raise errors.InvalidGraphError(
        f"Keras model {getattr(model, 'name', '')!r} has no known input shape; give it an Input "
        "layer, or call it once on a batch (or model.build(shape)) before importing")


def _keras_target_spec(model, x_spec) -> Any:
    """TensorSpecs for y: the outputs' shapes; int32 without the last dim for sparse losses."""
    if getattr(model, "_is_graph_network", False):
        outputs = model._nested_outputs
    else:
        forward = tf.function(lambda x: model(x, training=False), jit_compile=False)
        outputs = forward.get_concrete_function(x_spec).structured_outputs
    flat_outputs = tf.nest.flatten(outputs)
    if isinstance(outputs, Mapping):
        names = sorted(outputs)  # tf.nest flattens a dict in sorted key order
    else:
        names = list(getattr(model, "output_names", None) or [])
    names = (names + [None] * len(flat_outputs))[:len(flat_outputs)]
    losses = model.loss
    if isinstance(losses, Mapping):
        per_output = [losses.get(name) for name in names]
    elif isinstance(losses, (list, tuple)) and len(losses) == len(flat_outputs):
        per_output = list(losses)
    else:
        per_output = [losses] * len(flat_outputs)

    specs = []
    for output, loss in zip(flat_outputs, per_output, strict=True):
        shape = tf.TensorShape(output.shape)
        if shape.rank:
            shape = tf.TensorShape([None, *shape.as_list()[1:]])
        if _is_sparse_categorical(loss) and shape.rank:
            specs.append(tf.TensorSpec(shape[:-1], tf.int32))
        else:
            specs.append(tf.TensorSpec(shape, tf.float32))
    return tf.nest.pack_sequence_as(outputs, specs)


def _is_sparse_categorical(loss) -> bool:
    if loss is None:
        return False
    names = [loss] if isinstance(loss, str) else [
        type(loss).__name__, getattr(loss, "__name__", ""), getattr(loss, "name", "") or "",
        getattr(getattr(loss, "fn", None), "__name__", "")]
    return any(isinstance(name, str) and "sparse" in name.lower()
               and "categorical" in name.lower() for name in names)


def _loss_label(loss) -> str:
    if isinstance(loss, str):
        return loss
    if isinstance(loss, Mapping):
        return "{" + ", ".join(f"{k}: {_loss_label(v)}" for k, v in loss.items()) + "}"
    if isinstance(loss, (list, tuple)):
        return "[" + ", ".join(_loss_label(item) for item in loss) + "]"
    return getattr(loss, "name", None) or getattr(loss, "__name__", None) or type(loss).__name__
