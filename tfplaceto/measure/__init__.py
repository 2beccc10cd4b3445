"""Real measurement: run placed graphs on local devices or a TensorFlow cluster.

- `measure.py`: `measure` (`tp.measure`) and `MeasureResult`.
- `tf_cluster.py`: the targets: `LocalTFCluster` (worker tasks it starts), `RemoteTFCluster`
  (servers someone runs), `LocalTarget` (this process), `as_target`.
- `calibrate.py`: `calibrate_links` (latency and bandwidth of every device pair, by least
  squares over timed transfers), `calibrated_cluster`, `calibrate_op_costs` (per-op costs
  traced on the target's own devices).
- `devices.py`: `measure_devices` (each device's speed on a reference op chain, and the
  slowdown of devices sharing a host computing at once), `host_groups`.
- `runtime.py`: `measure_runtime` (the runtime's own costs: a control edge crossing devices, the
  fixed costs of a step, whether a task's sends wait until it is idle).
- `session.py`: running a placed GraphDef in a Session (random feeds, variables, timing).
"""

from tfplaceto.measure.calibrate import (
    calibrate_cluster,
    calibrate_links,
    calibrate_op_costs,
    calibrated_cluster,
)
from tfplaceto.measure.measure import MeasurementWarning, MeasureResult, measure, measure_many
from tfplaceto.measure.tf_cluster import LocalTarget, LocalTFCluster, RemoteTFCluster, TFTarget

__all__ = ["LocalTFCluster", "LocalTarget", "MeasureResult", "MeasurementWarning", "RemoteTFCluster",
           "TFTarget", "calibrate_cluster", "calibrate_links", "calibrate_op_costs", "calibrated_cluster",
           "measure", "measure_many"]
