"""`place_model` / `strip_placement`: a compiled Keras model's training step, placed and restored.

    result = tp.keras.place_model(model, "local:2", batch_size=32)   # an OptimizeResult
    model.fit(x, y, batch_size=32)      # every step runs with the placement
    tp.keras.strip_placement(model)     # the model's own train_step, train function and XLA setting

Map of the file:
  place_model       optimizes the model's training step (`tp.optimize(model)`, or applies a
                    result given) and wraps the model's train_step so that fit, train_on_batch
                    and make_train_function trace it placed.
  strip_placement   undoes place_model; a model not placed is returned as it is.
  place_step        place_model for its callers in the package: returns the whole PlacedStep.
  placement_of      what place_model did to a model (its PlacedStep), or None.
  PlacedStep        the result, the batch size, the device function and how to undo it.
  DeviceChooser     the graph device function that carries the placement into the traced step
                    (op names resolved by `tfplaceto.rewrite.DeviceResolver`).

How the placement is enforced. `fit` runs `model.train_function`, a tf.function whose body calls
`model.train_step(data)`. place_model places the same step, traced the same way
(`tp.optimize(model)`), for the batch size given (else the model input's static one), wraps the
model's `train_step` in a graph device function (`tf.compat.v1.get_default_graph().device(fn)`)
and makes Keras build a new train function, so every op the step creates while it is traced
(forward, loss, gradients, optimizer update) gets `Operation.device` from the placement: the
device of the op of the same name, else the device most ops of its name scope got (say
`model/dense_3/...`), else the placement's most used device. An explicit `tf.device` inside the
model still wins, ops colocated by TensorFlow are left to it, and XLA is turned off while the
model is placed (a compiled cluster would ignore per-op devices). The data pipeline outside
`train_step` stays where Keras puts it; evaluation and prediction are not placed. A placed
model computes what it computes unplaced: only where each op runs changes.

Variables stay where TensorFlow created them (the default device when the model was built: the
first GPU, else CPU:0); ops that read or update a variable run on the variable's device, as TF
requires of resource ops, so the placement of those ops is not applied. A Keras variable cannot
move once created: to put variables elsewhere, build the model under `tf.device(...)`. A variable
on a device outside the cluster is reported with a warning. Compiling the model again keeps the
wrapped train_step (placed for the old optimizer and loss): place it again after a compile.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import tensorflow as tf

from tfplaceto import checks, errors
from tfplaceto.cluster import Cluster, canonical_device_name
from tfplaceto.keras.devices import ensure_devices
from tfplaceto.place import OptimizeResult, check_method, optimize
from tfplaceto.rewrite import DeviceResolver

_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})
_MARK = "_tfplaceto_placed_step"  # attribute of the wrapped train_step holding its PlacedStep


@dataclasses.dataclass
class PlacedStep:
    """What place_model did to a model: `result` (the OptimizeResult applied), `batch_size`
    (placed for), `chooser` (the device function: which traced op got which device) and
    `restore` (gives the model its own train_step, train function and jit_compile back)."""

    result: OptimizeResult
    batch_size: int
    chooser: DeviceChooser
    restore: Callable[[], None]


def place_model(model, cluster: Cluster | str, method: str = "placeto", *, batch_size: int | None = None,
                budget_s: float | None = None, seed: int = 0, costs=None,
                result: OptimizeResult | None = None) -> OptimizeResult:
    """Places a compiled model's training step on cluster; `fit` then trains with the placement.

    Args:
      model: a compiled tf.keras.Model, not run eagerly, built outside any tf.distribute strategy.
      cluster: a Cluster or a name ("local:2", "local"); its devices must exist in this process
        (see ensure_devices).
      method, budget_s, seed, costs: passed to tp.optimize ("placeto", the default, and "auto"
        take the best placement found; another method named is honoured).
      batch_size: the batch the step is placed for; default: the model input's static batch
        dimension (required when it has none: an unknown batch size is never guessed).
      result: an OptimizeResult of this model's training step (same compile, same batch size) to
        apply instead of optimizing again.

    Returns the OptimizeResult applied. The model is changed in place (its train_step wrapped,
    its train function re-made, XLA off) until strip_placement; placing a placed model replaces
    its placement.

    Raises InvalidClusterError for a bad cluster or devices missing here, InvalidGraphError for a
    model that is not compiled or an unknown batch size, TfplacetoError for a model that runs
    eagerly or under a distribution strategy, InvalidMethodError / InvalidArgumentError for bad
    arguments.
    """
    return place_step(model, cluster, method, batch_size=batch_size, budget_s=budget_s, seed=seed, costs=costs,
                      result=result, caller="place_model").result


def strip_placement(model):
    """Gives a model placed by place_model its own train_step, train function and jit_compile
    setting back (the next fit traces it unplaced); returns the model. A model that is not
    placed is returned unchanged."""
    placed = placement_of(model)
    if placed is not None:
        placed.restore()
    return model


def placement_of(model) -> PlacedStep | None:
    """The PlacedStep of a model place_model placed (and strip_placement did not restore), or None."""
    return getattr(vars(model).get("train_step"), _MARK, None)


def place_step(model, cluster, method: str = "placeto", *, batch_size=None, budget_s=None, seed=0, costs=None,
               result=None, caller: str = "place_model") -> PlacedStep:
    """place_model, naming `caller` in its errors; returns the PlacedStep (the callback's entry)."""
    checks.check_batch_size(batch_size)
    budget_s, seed = checks.check_budget(budget_s), checks.check_seed(seed)
    check_method(method)
    cluster = ensure_devices(cluster)
    check_model(model, caller)
    strip_placement(model)
    batch_size = batch_size or static_batch_size(model)
    if batch_size is None:
        raise errors.InvalidGraphError(
            f"{caller} needs the batch size the step runs with: the model's input has no static batch "
            f"dimension; pass batch_size=N")
    if result is None:
        result = optimize(model, cluster=cluster, method=method, costs=costs, budget_s=budget_s, seed=seed,
                          batch_size=batch_size)
    chooser = DeviceChooser(result.placement)
    _warn_about_variables(model, cluster)

    had_own_train_step = "train_step" in vars(model)
    original_train_step = model.train_step
    jit_compile = model.jit_compile

    def placed_train_step(data):
        if tf.executing_eagerly():  # run_eagerly was switched on after the check
            return original_train_step(data)
        with tf.compat.v1.get_default_graph().device(chooser):
            return original_train_step(data)

    def restore() -> None:
        if vars(model).get("train_step") is not placed_train_step:
            return  # already restored (or placed again since)
        if had_own_train_step:
            model.train_step = original_train_step
        else:
            vars(model).pop("train_step", None)
        model.jit_compile = jit_compile  # also drops the placed train function
        model.train_function = None

    placed = PlacedStep(result, batch_size, chooser, restore)
    setattr(placed_train_step, _MARK, placed)
    if jit_compile:
        model.jit_compile = False  # an XLA cluster is compiled for one device
    model.train_step = placed_train_step
    model.make_train_function(force=True)
    return placed


def check_model(model, caller: str) -> None:
    """Raises unless model is a compiled Keras model whose training step can be placed."""
    if model is None or not getattr(model, "_is_compiled", False):
        raise errors.InvalidGraphError(f"{caller} needs a compiled Keras model (model.compile(...) first)")
    if model.run_eagerly or tf.config.functions_run_eagerly():
        raise errors.TfplacetoError(
            f"{caller} places the traced training step, but the model runs eagerly; "
            "compile it with run_eagerly=False")
    if getattr(model, "_distribution_strategy", None) is not None:
        raise errors.TfplacetoError(
            f"{caller} places the ops of one replica and cannot be combined with a "
            "tf.distribute strategy; build the model outside the strategy scope")


def _warn_about_variables(model, cluster: Cluster) -> None:
    devices = set(cluster.device_names)
    outside = sorted({canonical_device_name(v.device) for v in model.variables
                      if v.device and canonical_device_name(v.device) not in devices})
    if outside:
        warnings.warn(f"the model's variables live on {', '.join(outside)}, outside cluster "
                      f"{cluster.name!r}; ops reading them run there too", stacklevel=4)


def static_batch_size(model) -> int | None:
    """The static batch dimension of the model's inputs (the first that has one), or None."""
    return leading_dimension(getattr(model, "inputs", None) or [])


def leading_dimension(tensors) -> int | None:
    """The first static leading dimension among tensors (or specs), or None."""
    for tensor in tensors:
        shape = getattr(tensor, "shape", None)
        if shape is not None and shape.rank and shape[0] is not None:
            return int(shape[0])
    return None


class DeviceChooser:
    """A graph device function: Operation -> device from a placement (see module docstring).

    `assigned`: traced op name -> the device it was given; `by_name` / `by_scope`: the traced
    ops that found their own name in the placement / took their name scope's device.
    """

    def __init__(self, placement):
        self.resolver = DeviceResolver(placement)
        self.device_of = self.resolver.device_of
        self.assigned: dict[str, str] = {}
        self.by_name: set[str] = set()
        self.by_scope: set[str] = set()

    def __call__(self, op) -> str:
        if op.device:
            return op.device  # an explicit tf.device inside the model wins
        if op.type in _VARIABLE_OPS or any(t.dtype == tf.resource for t in op.inputs):
            return ""  # resource ops run where their variable (iterator, table) lives
        device = self.device_of.get(op.name)
        if device is not None:
            self.by_name.add(op.name)
        else:
            self.by_scope.add(op.name)
            device = self.resolver.enclosing_scope_device(op.name)
        self.assigned[op.name] = device
        return device
