"""`PlacementCallback`: train a Keras model with its training step placed by tfplaceto.

    callback = tp.keras.PlacementCallback("local:2", log_dir="logs")
    model.fit(x, y, callbacks=[callback])
    callback.result            # the OptimizeResult: placement, predicted step time, baselines

A thin user of `place_model` / `strip_placement` (train_step.py, where the placing is explained):
on_train_begin places the step for the batch size fit feeds (the callback's `batch_size`, else
the model input's static one, else read from the first batch: then the placing happens inside the
first step), the batch hooks time the steps, on_train_end strips the placement (the model gets
its own train_step, train function and jit_compile setting back; `callback.train_function` keeps
the placed one). A second fit of the same compiled model at the same batch size reuses the
placement. TensorBoard scalars go through `summaries.PlacementSummaries`.
"""

from __future__ import annotations

import statistics
import time

import tensorflow as tf

from tfplaceto import checks, errors
from tfplaceto.cluster import Cluster
from tfplaceto.keras import summaries, train_step
from tfplaceto.keras.devices import ensure_devices
from tfplaceto.place import OptimizeResult, check_method


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
        self._summaries = summaries.PlacementSummaries(log_dir) if log_dir is not None else None
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
        self._chooser = None
        self._placed_for = None
        self._cleanup = None  # undoes what on_train_begin did to the model, if on_train_end does not run
        self._logging = False
        self._batch_start = 0.0
        self._steps_per_batch = 1

    # -- training begins: place, then re-make the train function with the placement --------------
    def on_train_begin(self, logs=None) -> None:
        model = self.model
        if self._cleanup is not None:  # a previous fit raised before on_train_end
            self._cleanup()
        ensure_devices(self.cluster)
        train_step.check_model(model, "PlacementCallback")
        self.step_times_s = []
        batch_size = self.batch_size or train_step.static_batch_size(model)
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
            count = _steps_per_execution(model)
            batches = [next(iterator)]  # OutOfRange / StopIteration: fit ends the epoch as usual
            for _ in range(count - 1):
                try:
                    batches.append(next(iterator))
                except (StopIteration, tf.errors.OutOfRangeError):
                    break
            batch_size = train_step.leading_dimension(tf.nest.flatten(batches[0]))  # x, (x, y), dicts ...
            if batch_size is None:
                raise errors.InvalidGraphError(
                    "PlacementCallback cannot read the batch size from fit's data; pass "
                    "PlacementCallback(..., batch_size=N)")
            self._place(model, batch_size)
            data = tf.data.Dataset.from_tensors(batches[0])
            for batch in batches[1:]:
                data = data.concatenate(tf.data.Dataset.from_tensors(batch))
            return self.train_function(iter(data))

        def cleanup() -> None:  # fit ended before its first batch: nothing was placed
            if model.train_function is first_call:
                model.train_function = None
            self._cleanup = None

        model.train_function = first_call
        self._cleanup = cleanup

    def _place(self, model, batch_size: int) -> None:
        # Another fit of the same compiled model reuses the placement (same step, same graph).
        key = (id(model), id(model.optimizer), id(getattr(model, "compiled_loss", None)), batch_size)
        reuse = self.result if key == self._placed_for else None
        placed = train_step.place_step(model, self.cluster, self.method, batch_size=batch_size,
                                       budget_s=self.budget_s, seed=self.seed, costs=self.costs, result=reuse,
                                       caller="PlacementCallback")
        self.result, self._placed_for = placed.result, key
        self.placed_batch_size = batch_size
        self._chooser = placed.chooser
        self.train_function = model.train_function
        self._steps_per_batch = _steps_per_execution(model)

        def cleanup() -> None:
            if train_step.placement_of(model) is placed:
                train_step.strip_placement(model)
            self._cleanup = None

        self._cleanup = cleanup
        self._log_placement(batch_size)

    def _log_placement(self, batch_size: int) -> None:
        result = self.result
        if self.verbose:
            print(f"PlacementCallback: {len(result.placement)} ops placed on {self.cluster.name} by "
                  f"{result.method_used} (batch {batch_size}; {summaries.ops_per_device(result)}); predicted "
                  f"step time {result.step_time_s * 1e3:.3f} ms, lower bound {result.lower_bound_s * 1e3:.3f} ms")
        if self._summaries is not None:
            self._summaries.placement(result, batch_size)
            self._logging = True

    # -- measured step times ----------------------------------------------------------------------
    def on_train_batch_begin(self, batch, logs=None) -> None:
        self._batch_start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None) -> None:
        # Keras hands numpy logs to callbacks that do not declare tf-log support, so the step has
        # finished by the time this hook runs: the wall time is the step's.
        elapsed = (time.perf_counter() - self._batch_start) / self._steps_per_batch
        self.step_times_s.append(elapsed)
        if self._logging:
            self._summaries.step_time(elapsed, step=len(self.step_times_s))

    @property
    def assigned_devices(self) -> dict[str, str]:
        return dict(self._chooser.assigned) if self._chooser is not None else {}

    @property
    def measured_step_time_s(self) -> float | None:
        """Median wall time of a training step, without the first (it includes tracing)."""
        times = self.step_times_s[1:] or self.step_times_s
        return statistics.median(times) if times else None

    def on_train_end(self, logs=None) -> None:
        if self._cleanup is not None:
            self._cleanup()
        measured = self.measured_step_time_s
        if self.verbose and measured is not None and self.result is not None:
            chooser = self._chooser
            print(f"PlacementCallback: measured step time {measured * 1e3:.3f} ms (median of "
                  f"{max(len(self.step_times_s) - 1, 1)} steps); predicted "
                  f"{self.result.step_time_s * 1e3:.3f} ms; {len(chooser.by_name)} traced ops placed "
                  f"by name, {len(chooser.by_scope)} by name scope")
        if self._summaries is not None:
            self._summaries.close()
        self._logging = False


def _steps_per_execution(model) -> int:
    spe = getattr(model, "_steps_per_execution", None)
    return max(1, int(spe.numpy())) if spe is not None else 1

