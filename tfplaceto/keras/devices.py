"""`ensure_devices`: makes a cluster's devices usable by eager TensorFlow in this process.

  ensure_devices           creates the logical CPUs of a "local:N" cluster (TensorFlow can only
                           do it before it initializes) and checks every device is visible.
  configure_logical_cpus   asks TensorFlow for N logical CPU devices while it still can.
"""

from __future__ import annotations

import tensorflow as tf

from tfplaceto import errors
from tfplaceto.cluster import Cluster, as_cluster, canonical_device_name


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
        configure_logical_cpus(max(local_cpus) + 1)
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


def configure_logical_cpus(count: int) -> None:
    """Splits the CPU into `count` logical devices if TensorFlow has not initialized yet (and
    has fewer); otherwise does nothing (ensure_devices then reports what is missing)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if count <= (len(current) if current else 1):
        return
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:
        pass  # TensorFlow is initialized: ensure_devices reports what is missing
