"""The preset clusters' figures (`Cluster.preset`, `"4xV100"` wherever a cluster is accepted).

  PRESETS   2xK80 4xK80 8xK80 2xV100 4xV100 8xV100 4xH100 8xH100.
  figures   the devices (GPUs and the host CPU) and links of a preset as plain values, which
            `Cluster.preset` turns into Devices, Links and a Cluster (this module is data: it
            imports nothing of the cluster module, which imports it).

Preset figures are vendor specifications: memory per device, FP32 peak, HBM/GDDR bandwidth, and
link figures for PCIe 3.0/5.0 x16 (~12/~50 GB/s achievable), NVLink 2.0 (25 GB/s per link and
direction, DGX-1 hybrid cube-mesh topology) and NVLink 4 through NVSwitch (450 GB/s per direction).
The grappler fields (`num_cores`, `frequency_mhz`, `architecture`) make grappler's analytical cost
model compute the same FP32 peak (SMs x clock x cores per SM x 2).
"""

from __future__ import annotations

import re

from tfplaceto import errors

GB = 10**9  # vendor figures are decimal
GIB = 2**30
PRESETS = ("2xK80", "4xK80", "8xK80", "2xV100", "4xV100", "8xV100", "4xH100", "8xH100")


def figures(name: str, host: str) -> tuple[list[dict], list[tuple[str, str, float, float]]]:
    """(devices, links) of preset `name`: devices as Device keyword arguments (the GPUs, then the
    host CPU named `host`), links as (src, dst, bandwidth bytes/s, latency s) for every pair.
    Raises InvalidClusterError naming the presets for any other name."""
    match = re.fullmatch(r"(\d+)x(\w+)", name or "")
    if not match or name not in PRESETS:
        raise errors.InvalidClusterError(
            f"unknown cluster preset {name!r}; known presets: {', '.join(PRESETS)}, "
            f"'local' and 'local:N'")
    count, model = int(match[1]), match[2]
    memory, gflops, hbm, sms, mhz, arch, gpu_link, host_link, host_memory = _GPU_SPECS[model]
    gpus = [dict(name=f"/job:localhost/replica:0/task:0/device:GPU:{i}", type="GPU", memory_bytes=memory,
                 model=model, peak_gflops=gflops, memory_bandwidth_gbs=hbm, num_cores=sms, frequency_mhz=mhz,
                 architecture=arch) for i in range(count)]
    cpu = dict(name=host, type="CPU", memory_bytes=host_memory, model="host", peak_gflops=1500.0,
               memory_bandwidth_gbs=100.0, num_cores=40, frequency_mhz=2200.0)
    links = []
    for i, a in enumerate(gpus):
        links += [(a["name"], host, *host_link), (host, a["name"], *host_link)]
        for j, b in enumerate(gpus):
            if i == j:
                continue
            bandwidth, latency = gpu_link
            if model == "V100":
                nvlinks = _dgx1_nvlinks(i, j)
                bandwidth, latency = (nvlinks * bandwidth, latency) if nvlinks else (10 * GB, 15e-6)
            links.append((a["name"], b["name"], bandwidth, latency))
    return gpus + [cpu], links


# name -> (GPU memory, peak GFLOPS, HBM GB/s, SMs, boost MHz, compute capability,
#          GPU-GPU link, host link, host memory)
_GPU_SPECS = {
    # Tesla K80: figures per GK210 die (a K80 board is two of them): 12 GB GDDR5, 240 GB/s,
    # 13 SMX at 875 MHz boost x 192 cores x 2 = 4.37 TFLOPS. Dies talk over the PCIe 3.0 switch.
    "K80": (12 * GB, 4368.0, 240.0, 13, 875.0, "3.7", (10 * GB, 15e-6), (12 * GB, 10e-6), 256 * GIB),
    # Tesla V100 SXM2 16 GB: 900 GB/s HBM2, 80 SMs at 1530 MHz x 64 x 2 = 15.7 TFLOPS.
    "V100": (16 * GB, 15667.0, 900.0, 80, 1530.0, "7.0", (25 * GB, 5e-6), (12 * GB, 10e-6), 512 * GIB),
    # H100 SXM5 80 GB: 3.35 TB/s HBM3, NVLink 4 via NVSwitch, PCIe 5.0 to the host.
    "H100": (80 * GB, 66900.0, 3350.0, 132, 1980.0, "9.0", (450 * GB, 3e-6), (50 * GB, 5e-6), 2048 * GIB),
}


def _dgx1_nvlinks(i: int, j: int) -> int:
    """NVLink count between V100s i and j in a DGX-1 hybrid cube-mesh (0 = via PCIe/QPI)."""
    if i // 4 == j // 4:  # fully connected quad; the ring neighbours have a double link
        return 2 if (i - j) % 4 in (1, 3) and {i % 4, j % 4} in ({0, 1}, {2, 3}) else 1
    return 1 if i % 4 == j % 4 else 0
