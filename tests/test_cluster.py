"""Clusters: presets with real figures, local devices, names, proto round trip, errors."""

import pytest

import tfplaceto as tp
from tfplaceto.cluster import as_cluster, canonical_device_name
from tfplaceto.presets import PRESETS


@pytest.mark.parametrize("name", PRESETS)
def test_presets(name):
    cluster = tp.Cluster.preset(name)
    count = int(name.split("x")[0])
    gpus = [d for d in cluster.devices if d.type == "GPU"]
    assert len(gpus) == count
    assert gpus[0].name == "/job:localhost/replica:0/task:0/device:GPU:0"
    assert "/job:localhost/replica:0/task:0/device:CPU:0" in cluster.device_names
    assert tp.Cluster.from_proto(cluster.to_proto()) == cluster
    assert (cluster.bandwidth[~(cluster.bandwidth == float("inf"))] > 1e9).all()


def test_preset_figures_are_vendor_figures():
    k80, v100, h100 = (tp.Cluster.preset(n).devices[0] for n in ("2xK80", "2xV100", "4xH100"))
    assert k80.memory_bytes == 12 * 10**9 and v100.memory_bytes == 16 * 10**9 and h100.memory_bytes == 80 * 10**9
    v8 = tp.Cluster.preset("8xV100")
    # DGX-1 hybrid cube mesh: GPU0-GPU1 has two NVLinks, GPU0-GPU5 none (PCIe).
    assert v8.bandwidth[0, 1] == 50e9 and v8.bandwidth[0, 5] < v8.bandwidth[0, 2]


def test_local_and_strings():
    local = tp.Cluster.local(cpus=4)
    assert local.device_names[3] == "/job:localhost/replica:0/task:0/device:CPU:3"
    assert as_cluster("local:4") == local
    assert as_cluster("4xV100").num_devices == 5
    assert tp.Cluster.local().devices[0].type == "CPU"
    assert canonical_device_name("/gpu:1") == "/job:localhost/replica:0/task:0/device:GPU:1"


@pytest.mark.parametrize("bad", ["3xV100", "", "local:0", "V100"])
def test_bad_clusters(bad):
    with pytest.raises(tp.errors.InvalidClusterError):
        as_cluster(bad)


def test_bad_devices():
    with pytest.raises(tp.errors.InvalidClusterError, match="bad device name"):
        tp.Cluster([tp.Device("GPU:0", "GPU", 1)])
    with pytest.raises(tp.errors.InvalidClusterError):
        tp.Cluster([])
    name = "/job:localhost/replica:0/task:0/device:GPU:0"
    with pytest.raises(tp.errors.InvalidClusterError, match="duplicate"):
        tp.Cluster([tp.Device(name, "GPU", 1), tp.Device(name, "GPU", 1)])
    with pytest.raises(tp.errors.InvalidClusterError, match="not in cluster"):
        tp.Cluster.preset("2xV100").index("/job:localhost/replica:0/task:0/device:GPU:7")
