"""TensorBoard logging of a placed Keras training step, apart from the placing itself.

  PlacementSummaries   scalars under "placement/" in a log directory: the predicted (simulated)
                       step time, the lower bound and the baselines at step 0, a text line with
                       the method and the ops per device, the measured step time of each batch.
  ops_per_device       "CPU:0: 120, CPU:1: 96": how a placement spreads its ops.

`PlacementCallback(log_dir=...)` writes through one of these; with `place_model` directly:

    summaries = PlacementSummaries("logs")
    summaries.placement(tp.keras.place_model(model, "local:2", batch_size=32), batch_size=32)
    summaries.step_time(seconds, step=1); summaries.close()
"""

from __future__ import annotations

import collections
import os

import tensorflow as tf

from tfplaceto import errors, outputs


def ops_per_device(result) -> str:
    """How many ops an OptimizeResult's placement put on each device, short device names."""
    counts = collections.Counter(result.placement.values())
    return ", ".join(f"{device.rsplit('/', 1)[-1]}: {n}" for device, n in sorted(counts.items()))


class PlacementSummaries:
    """TensorBoard scalars of a placement and of measured step times, in `log_dir`.

    Raises OutputPathError at construction for a log_dir that is not, and cannot be made, a
    writable directory. The event file is created at the first write.
    """

    def __init__(self, log_dir):
        if not isinstance(log_dir, str | os.PathLike) or not os.fspath(log_dir):
            raise errors.OutputPathError(f"log_dir must be a directory path, got {log_dir!r}")
        if os.path.exists(log_dir) and not os.path.isdir(log_dir):
            raise errors.OutputPathError(f"log_dir {os.fspath(log_dir)!r} exists and is not a directory")
        outputs.check_writable_directory(os.path.abspath(log_dir), f"log_dir {os.fspath(log_dir)!r}")
        self.log_dir = log_dir
        self._writer = None

    def _open(self):
        if self._writer is None:
            try:
                self._writer = tf.summary.create_file_writer(os.fspath(self.log_dir))
            except tf.errors.OpError as error:  # the directory changed since the check
                raise errors.OutputPathError(
                    f"cannot write log_dir {os.fspath(self.log_dir)!r}: {errors.first_line(error)}") from None
        return self._writer

    def placement(self, result, batch_size: int) -> None:
        """The OptimizeResult's figures at step 0: predicted step time, lower bound, baselines (ms)."""
        with self._open().as_default():
            tf.summary.scalar("placement/predicted_step_time_ms", result.step_time_s * 1e3, step=0)
            tf.summary.scalar("placement/lower_bound_ms", result.lower_bound_s * 1e3, step=0)
            for method, step_time in result.baselines.items():
                tf.summary.scalar(f"placement/baseline/{method}_ms", step_time * 1e3, step=0)
            tf.summary.text("placement/summary", f"method {result.method_used}, batch {batch_size}, "
                            f"ops per device: {ops_per_device(result)}", step=0)

    def step_time(self, seconds: float, step: int) -> None:
        """One measured training step, as placement/measured_step_time_ms."""
        with self._open().as_default():
            tf.summary.scalar("placement/measured_step_time_ms", seconds * 1e3, step=step)

    def close(self) -> None:
        """Flushes and closes the event file (a later write opens a new one)."""
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
