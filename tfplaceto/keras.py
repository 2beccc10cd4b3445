"""`PlacementCallback`: train a Keras model with its training step placed by tfplaceto.

    callback = tp.keras.PlacementCallback("local:2", log_dir="logs")
    model.fit(x, y, callbacks=[callback])
    callback.result            # the OptimizeResult: placement, predicted step time, baselines

Map of the file:
  ensure_devices       makes a cluster's devices usable by eager TensorFlow here, or raises.
  PlacementCallback    on_train_begin: optimize the model's training step and make fit run it
                       placed; batch hooks: time the steps; on_train_end: report and restore.
  _DeviceChooser       the device function that carries the placement into the traced step
                       (op names resolved by `tfplaceto.rewrite.DeviceResolver`).

How the placement is enforced. `fit` runs `model.train_function`, a tf.function whose body calls
`model.train_step(data)`. At on_train_begin the callback places the same step, traced the same
way (`tp.optimize(model)`) for the batch size fit feeds (the callback's `batch_size`, else the
model input's static one, else read from the first batch: then the placing happens inside the
first step), wraps the model's `train_step` in a graph device function
(`tf.compat.v1.get_default_graph().device(fn)`) and forces Keras to make a new train function, so
every op the step creates while it is traced (forward, loss, gradients, optimizer update) gets
`Operation.device` from the placement: the device of the op of the same name, else the device
most ops of its name scope got (say `model/dense_3/...`), else the placement's most used device.
An explicit `tf.device` inside the model still wins, ops colocated by TensorFlow are left to it,
and XLA is turned off for the run (a compiled cluster would ignore per-op devices). The data
pipeline outside `train_step` stays where Keras puts it. At on_train_end the model gets its own
train_step, train function and jit_compile setting back; `callback.train_function` keeps the
placed one.

Variables stay where TensorFlow created them (the default device when the model was built: the
first GPU, else CPU:0); ops that read or update a variable run on the variable's device, as TF
requires of resource ops, so the placement of those ops is not applied. A Keras variable cannot
move once created: to put variables elsewhere, build the model under `tf.device(...)`. A variable
on a device outside the cluster is reported with a warning.
"""

from __future__ import annotations

import collections
import os
import statistics
import time
import warnings

import tensorflow as tf

from tfplaceto import checks, errors, outputs
from tfplaceto.cluster import Cluster, as_cluster, canonical_device_name
from tfplaceto.place import OptimizeResult, check_method
from tfplaceto.rewrite import DeviceResolver

_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})


def ensure_devices(cluster: Cluster | str) -> Cluster:
    """Makes every device of cluster usable by eager TensorFlow in this process, or raises.

    A "local:N" cluster needs N logical CPU devices; TensorFlow can only create them before it
    initializes (before the first op or variable), so call this (or construct the callback) before
    building the model. Other devices (GPUs, remote tasks) must already be visible.

    Raises InvalidClusterError for an unknown cluster or a device this process cannot use.
    """
    cluster = as_cluster(cluster)
    names = [canonical_device_name(device.name) for device in cluster.devices]
    local_cpus = [tf.DeviceSpec.from_string(name) for name in names]
    local_cpus = [spec.device_index for spec in local_cpus
                  if spec.job == "localhost" and spec.device_type == "CPU"]
    if local_cpus:
        _configure_logical_cpus(max(local_cpus) + 1)
    visible = {canonical_device_name(device.name) for device in tf.config.list_logical_devices()}
    missing = [name for name in names if name not in visible]
    if missing:
        have = ", ".join(sorted(name.rsplit("/", 1)[-1] for name in visible))
        if local_cpus and all("device:CPU:" in name and name.startswith("/job:localhost/") for name in missing):
            raise errors.InvalidClusterError(
                f"call tfplaceto.keras.ensure_devices({cluster.name!r}) first, before building the model: "
                f"cluster {cluster.name!r} needs {max(local_cpus) + 1} logical CPU devices, which TensorFlow can "
                f"only create before it initializes, and this process already has (it sees {have})")
        raise errors.InvalidClusterError(
            f"device {missing[0]} of cluster {cluster.name!r} is not visible to TensorFlow in this "
            f"process (it sees {have}); this machine does not have the devices of {cluster.name!r}; "
            "train on 'local' or 'local:N', or use tp.optimize to plan a placement for that cluster")
    return cluster


def _configure_logical_cpus(count: int) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if count <= (len(current) if current else 1):
        return
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:
        pass  # TensorFlow is initialized: ensure_devices reports what is missing


class PlacementCallback(tf.keras.callbacks.Callback):
    """Places the model's training step before `fit` trains, and trains with that placement.

    Args:
      cluster: a Cluster or a name ("local:2", "local"); its devices must exist in this process
        (see ensure_devices).
      method: a placement method (tp.METHODS) or "auto"; "placeto" (the default: the policy's
        search, never worse than the best baseline) and "auto" take the best placement found,
        another method named is honoured (see tp.optimize).
      budget_s: search / fine-tuning budget passed to tp.optimize.
      log_dir: if given, TensorBoard scalars under "placement/": the predicted (simulated) step
        time, the lower bound and the baselines at step 0, the measured step time of every batch.
      batch_size: the batch the step is placed for; default: the model input's static batch
        dimension, else the batch `fit` feeds: the callback then places on the first batch (its
        shape read from the data), and that first step also traces the placed function.
      seed: passed to tp.optimize.
      costs: passed to tp.optimize (default: measured for local clusters).
      verbose: 0 silences the console lines (placement chosen; measured step time at the end).

    Attributes:
      result: the OptimizeResult (None until the step is placed: training begins, or its first
        batch when the batch size comes from the data).
      placed_batch_size: the batch size the step was placed for.
      step_times_s: wall time of every training batch of the last fit (the first includes tracing).
      measured_step_time_s: their median, without the first batch.
      assigned_devices: op name -> device, for every op of the traced step the callback placed
        (ops it left to TensorFlow, such as variable reads, are not in it).
      train_function: the placed tf.function fit ran.

    Raises InvalidClusterError at construction for a bad cluster or devices missing here,
    OutputPathError for a log_dir that cannot be written, InvalidArgumentError (InvalidGraphError
    for batch_size) for a bad number.
    """

    def __init__(self, cluster: Cluster | str, method: str = "placeto", budget_s: float | None = None,
                 log_dir: str | None = None, *, batch_size: int | None = None, seed: int = 0,
                 costs=None, verbose: int = 1):
        super().__init__()
        checks.check_batch_size(batch_size)
        budget_s, seed = checks.check_budget(budget_s), checks.check_seed(seed)
        check_method(method)
        if log_dir is not None:
            _check_log_dir(log_dir)
        self.cluster = ensure_devices(cluster)
        self.method = method
        self.budget_s = budget_s
        self.log_dir = log_dir
        self.batch_size = batch_size
        self.seed = seed
        self.costs = costs
        self.verbose = verbose
        self.result: OptimizeResult | None = None
        self.placed_batch_size: int | None = None
        self.step_times_s: list[float] = []
        self.train_function = None
        self._chooser: _DeviceChooser | None = None
        self._writer = None
        self._restore = None
        self._placed_for = None
        self._batch_start = 0.0
        self._steps_per_batch = 1

    # -- training begins: place, then re-make the train function with the placement --------------
    def on_train_begin(self, logs=None) -> None:
        model = self.model
        if self._restore is not None:  # a previous fit raised before on_train_end
            self._restore()
            self._restore = None
        ensure_devices(self.cluster)
        self._check_model(model)
        self.step_times_s = []
        batch_size = self.batch_size or _static_batch_size(model)
        if batch_size is None:
            self._place_on_first_batch(model)
        else:
            self._place(model, batch_size)

    def _place_on_first_batch(self, model) -> None:
        """fit calls `model.train_function(iterator)` for every step, reading the attribute each
        time: until the first call, it is a function that takes that step's batches from the
        iterator, places the step for the batch size they have, and runs them with the placed
        train function (which replaces it for the rest of fit)."""
        unplaced = model.train_function

        def first_call(iterator):
            if model.train_function is not first_call:  # a fit that ended before its first batch
                return unplaced(iterator)
            spe = getattr(model, "_steps_per_execution", None)
            count = max(1, int(spe.numpy())) if spe is not None else 1
            batches = [next(iterator)]  # OutOfRange / StopIteration: fit ends the epoch as usual
            for _ in range(count - 1):
                try:
                    batches.append(next(iterator))
                except (StopIteration, tf.errors.OutOfRangeError):
                    break
            batch_size = _batch_size_of(batches[0])
            if batch_size is None:
                raise errors.InvalidGraphError(
                    "PlacementCallback cannot read the batch size from fit's data; pass "
                    "PlacementCallback(..., batch_size=N)")
            self._place(model, batch_size)
            data = tf.data.Dataset.from_tensors(batches[0])
            for batch in batches[1:]:
                data = data.concatenate(tf.data.Dataset.from_tensors(batch))
            return self.train_function(iter(data))

        def restore() -> None:  # fit ended before its first batch: nothing was placed
            if model.train_function is first_call:
                model.train_function = None

        model.train_function = first_call
        self._restore = restore

    def _place(self, model, batch_size: int) -> None:
        # Another fit of the same compiled model reuses the placement (same step, same graph).
        key = (id(model), id(model.optimizer), id(getattr(model, "compiled_loss", None)), batch_size)
        if self.result is None or key != self._placed_for:
            from tfplaceto.place import optimize

            self.result = optimize(model, cluster=self.cluster, method=self.method, costs=self.costs,
                                   budget_s=self.budget_s, seed=self.seed, batch_size=batch_size)
            self._placed_for = key
        self.placed_batch_size = batch_size
        self._chooser = _DeviceChooser(self.result.placement)
        self._warn_about_variables(model)

        had_own_train_step = "train_step" in vars(model)
        original_train_step = model.train_step
        jit_compile = model.jit_compile
        chooser = self._chooser

        def placed_train_step(data):
            if tf.executing_eagerly():  # run_eagerly was switched on after we checked
                return original_train_step(data)
            with tf.compat.v1.get_default_graph().device(chooser):
                return original_train_step(data)

        def restore() -> None:
            if had_own_train_step:
                model.train_step = original_train_step
            else:
                vars(model).pop("train_step", None)
            model.jit_compile = jit_compile  # also drops the placed train function
            model.train_function = None

        self._restore = restore
        if jit_compile:
            model.jit_compile = False  # an XLA cluster is compiled for one device
        model.train_step = placed_train_step
        self.train_function = model.make_train_function(force=True)
        spe = getattr(model, "_steps_per_execution", None)
        self._steps_per_batch = max(1, int(spe.numpy())) if spe is not None else 1
        self._log_placement(batch_size)

    def _check_model(self, model) -> None:
        if model is None or not getattr(model, "_is_compiled", False):
            raise errors.InvalidGraphError("PlacementCallback needs a compiled model in fit()")
        if model.run_eagerly or tf.config.functions_run_eagerly():
            raise errors.TfplacetoError(
                "PlacementCallback places the traced training step, but the model runs eagerly; "
                "compile it with run_eagerly=False")
        if getattr(model, "_distribution_strategy", None) is not None:
            raise errors.TfplacetoError(
                "PlacementCallback places the ops of one replica and cannot be combined with a "
                "tf.distribute strategy; build the model outside the strategy scope")

    def _warn_about_variables(self, model) -> None:
        devices = set(self.cluster.device_names)
        outside = sorted({canonical_device_name(v.device) for v in model.variables
                          if v.device and canonical_device_name(v.device) not in devices})
        if outside:
            warnings.warn(f"the model's variables live on {', '.join(outside)}, outside cluster "
                          f"{self.cluster.name!r}; ops reading them run there too", stacklevel=3)

    def _log_placement(self, batch_size: int) -> None:
        result = self.result
        counts = collections.Counter(result.placement.values())
        spread = ", ".join(f"{device.rsplit('/', 1)[-1]}: {n}" for device, n in sorted(counts.items()))
        if self.verbose:
            print(f"PlacementCallback: {len(result.placement)} ops placed on {self.cluster.name} by "
                  f"{result.method_used} (batch {batch_size}; {spread}); predicted step time "
                  f"{result.step_time_s * 1e3:.3f} ms, lower bound {result.lower_bound_s * 1e3:.3f} ms")
        if self.log_dir is None:
            return
        try:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        except tf.errors.OpError as error:  # the directory changed since the callback was made
            raise errors.OutputPathError(f"cannot write log_dir {self.log_dir!r}: {errors.first_line(error)}") from None
        with self._writer.as_default():
            tf.summary.scalar("placement/predicted_step_time_ms", result.step_time_s * 1e3, step=0)
            tf.summary.scalar("placement/lower_bound_ms", result.lower_bound_s * 1e3, step=0)
            for method, step_time in result.baselines.items():
                tf.summary.scalar(f"placement/baseline/{method}_ms", step_time * 1e3, step=0)
            tf.summary.text("placement/summary",
                            f"method {result.method_used}, batch {batch_size}, ops per device: {spread}",
                            step=0)

    # -- measured step times ----------------------------------------------------------------------
    def on_train_batch_begin(self, batch, logs=None) -> None:
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None) -> None:
        # Keras hands numpy logs to callbacks that do not declare tf-log support, so the step has
        # finished by the time this hook runs: the wall time is the step's.
        elapsed = (time.perf_counter() - self._batch_start) / self._steps_per_batch
        self.step_times_s.append(elapsed)
        if self._writer is not None:
            with self._writer.as_default():
                tf.summary.scalar("placement/measured_step_time_ms", elapsed * 1e3,
                                  step=len(self.step_times_s))

    @property
    def assigned_devices(self) -> dict[str, str]:
        return dict(self._chooser.assigned) if self._chooser is not None else {}

    @property
    def measured_step_time_s(self) -> float | None:
        """Median wall time of a training step, without the first (it includes tracing)."""
        times = self.step_times_s[1:] or self.step_times_s
        return statistics.median(times) if times else None

    def on_train_end(self, logs=None) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None
        measured = self.measured_step_time_s
        if self.verbose and measured is not None and self.result is not None:
            chooser = self._chooser
            print(f"PlacementCallback: measured step time {measured * 1e3:.3f} ms (median of "
                  f"{max(len(self.step_times_s) - 1, 1)} steps); predicted "
                  f"{self.result.step_time_s * 1e3:.3f} ms; {len(chooser.by_name)} traced ops placed "
                  f"by name, {len(chooser.by_scope)} by name scope")
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


class _DeviceChooser:
    """A graph device function: Operation -> device from a placement (see module docstring)."""

    def __init__(self, placement):
        self.resolver = DeviceResolver(placement)
        self.device_of = self.resolver.device_of
        self.assigned: dict[str, str] = {}  # traced op name -> the device it was given
        self.by_name: set[str] = set()  # traced ops that found their own name in the placement
        self.by_scope: set[str] = set()  # traced ops that took their name scope's device

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


def _check_log_dir(log_dir) -> None:
    """OutputPathError unless log_dir is, or can be made, a writable directory."""
    if not isinstance(log_dir, str | os.PathLike) or not os.fspath(log_dir):
        raise errors.OutputPathError(f"log_dir must be a directory path, got {log_dir!r}")
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        raise errors.OutputPathError(f"log_dir {os.fspath(log_dir)!r} exists and is not a directory")
    outputs.check_writable_directory(os.path.abspath(log_dir), f"log_dir {os.fspath(log_dir)!r}")


def _batch_size_of(batch) -> int | None:
    """The leading dimension of the first tensor of a batch (x, (x, y), dicts ...)."""
    for tensor in tf.nest.flatten(batch):
        shape = getattr(tensor, "shape", None)
        if shape is not None and shape.rank and shape[0] is not None:
            return int(shape[0])
    return None


def _static_batch_size(model) -> int | None:
    for tensor in getattr(model, "inputs", None) or []:
        shape = getattr(tensor, "shape", None)
        if shape is not None and shape.rank and shape[0] is not None:
            return int(shape[0])
    return None


__all__ = ["PlacementCallback", "ensure_devices"]
