"""Cost profiles: analytical magnitudes, measured times, files, the cache, and errors.

- analytical: a MatMul and a Conv2D cost what their FLOPs say on V100, K80 and the host CPU
  (within 3x of FLOPs / peak; V100 < K80 < CPU), also when their shapes are computed in the
  graph; sub-microsecond ops keep their cost; big placeholders are not materialized; profiles
  are aligned with the graph, and ops grappler leaves out are estimated and counted;
- measured: on "local:2" the heavy ops take time, an op that never runs takes 0, presets with
  GPUs this machine lacks are refused;
- a profile survives save/load and loads as `source=path`; the cache returns identical arrays
  without recomputing, and a corrupted cache file is recomputed and rewritten;
- bad input raises CostProfileError: garbage files, profiles of other graphs or device kinds,
  grouped graphs, devices without throughput figures.
"""

from __future__ import annotations

import pathlib
import sys
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # tfplaceto importable without an install
    sys.path.insert(0, str(ROOT))

import tensorflow as tf  # noqa: E402

from tfplaceto import errors  # noqa: E402
from tfplaceto.cluster import Cluster, Device  # noqa: E402
from tfplaceto.costs import (  # noqa: E402
    CostProfile,
    analytical,
    analytical_profile,
    measured_profile,
    profile,
)
from tfplaceto.graph import group, op_graph_from_graph_def  # noqa: E402

N = 4096  # MatMul size: 2 * N^3 = 137 GFLOP
CONV_BATCH, CONV_HW, CONV_C = 32, 56, 64  # 3x3 SAME conv, 64 -> 64 channels: 7.4 GFLOP


def _matmul_conv_graph(batch: int = N):
    """MatMul [batch, N] x [N, N] and Conv2D [32, 56, 56, 64] * [3, 3, 64, 64], summed."""
    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [None, N], name="a")
        b = tf.Variable(tf.zeros([N, N]), name="b")
        product = tf.matmul(a, b, name="matmul")
        x = tf.compat.v1.placeholder(tf.float32, [CONV_BATCH, CONV_HW, CONV_HW, CONV_C], name="x")
        w = tf.Variable(tf.zeros([3, 3, CONV_C, CONV_C]), name="w")
        conv = tf.nn.conv2d(x, w, strides=1, padding="SAME", name="conv")
        tf.add(tf.reduce_sum(product), tf.reduce_sum(conv), name="total")
    return op_graph_from_graph_def(graph.as_graph_def(), ["total"], batch_size=batch)


def _small_graph(with_dead_branch: bool = True, width: int = 256):
    """A MatMul + Relu step on [128, width] (and an op on a branch that never runs)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, width], name="x")
        w = tf.Variable(tf.random.normal([width, width]), name="w")
        h = tf.matmul(x, w, name="matmul")
        if with_dead_branch:
            taken, not_taken = tf.raw_ops.Switch(data=h, pred=tf.constant(False, name="pred"),
                                                 name="switch")
            h = tf.raw_ops.Merge(inputs=[tf.math.negative(not_taken, name="never_runs"),
                                         tf.nn.relu(taken, name="relu")], name="merge")[0]
        else:
            h = tf.nn.relu(h, name="relu")
        tf.reduce_sum(h, name="loss")
    return op_graph_from_graph_def(graph.as_graph_def(), ["loss"], batch_size=128)


@pytest.fixture(scope="module")
def matmul_conv():
    return _matmul_conv_graph()


@pytest.fixture(scope="module")
def small():
    return _small_graph()


def _flop_seconds(flops: float, cluster: Cluster, kind: str) -> float:
    device = next(d for d in cluster.devices if d.kind == kind)
    return flops / (device.peak_gflops * 1e9)


# -- analytical ------------------------------------------------------------------------------------

def test_analytical_matmul_and_conv_match_their_flops(matmul_conv):
    matmul_flops = 2.0 * N**3
    conv_flops = 2.0 * CONV_BATCH * CONV_HW * CONV_HW * CONV_C * CONV_C * 9
    seconds = {}
    for name in ("2xV100", "2xK80"):
        cluster = Cluster.preset(name)
        costs = analytical_profile(matmul_conv, cluster)
        assert costs.device_kinds == cluster.kinds
        assert costs.compute_s.shape == (matmul_conv.num_ops, len(cluster.kinds))
        assert costs.op_names == matmul_conv.names
        assert costs.graph_fingerprint == matmul_conv.fingerprint()
        assert costs.source == "analytical"
        for kind in cluster.kinds:
            k = costs.device_kinds.index(kind)
            for op, flops in (("matmul", matmul_flops), ("conv", conv_flops)):
                got = costs.compute_s[matmul_conv.index_of(op), k]
                expected = _flop_seconds(flops, cluster, kind)
                assert expected / 3 < got < expected * 3, (name, kind, op, got, expected)
                seconds[kind, op] = got
    # A 4096^3 MatMul on a V100 is ~2 * 4096^3 / 15.7 TFLOPS = 8.8 ms.
    assert 0.006 < seconds["GPU:V100", "matmul"] < 0.013
    for op in ("matmul", "conv"):
        assert seconds["GPU:V100", op] < seconds["GPU:K80", op] < seconds["CPU:host", op]


def test_analytical_accepts_a_cluster_name(matmul_conv):
    costs = analytical_profile(matmul_conv, "local:2")
    assert costs.device_kinds == ("CPU:host",)
    assert costs.compute_s[matmul_conv.index_of("matmul"), 0] > 0.01


def test_analytical_does_not_materialize_placeholders():
    # grappler's item builder fills a tensor for every Placeholder; a 1.6 GB input took seconds
    # before placeholders were replaced by variable reads for costing.
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2048, 56, 56, 64], name="x")
        tf.nn.relu(x, name="relu")
    op_graph = op_graph_from_graph_def(graph.as_graph_def(), ["relu"])
    start = time.perf_counter()
    costs = analytical_profile(op_graph, "2xV100")
    assert time.perf_counter() - start < 3.0
    relu = costs.compute_s[op_graph.index_of("relu")]
    # Relu reads and writes 1.6 GB: ~3.6 ms at 900 GB/s on a V100, far longer on the host.
    assert 0.002 < relu[0] < 0.006 and relu[1] > relu[0]
    assert costs.compute_s[op_graph.index_of("x")].tolist() == [0.0, 0.0]


def test_shapes_computed_in_the_graph_are_known_to_the_cost_model():
    # Built with an unknown batch, Tensordot reshapes through Shape -> GatherV2 -> Prod -> Pack
    # and zeros of the batch size go through Shape -> StridedSlice -> Pack -> Fill: grappler's
    # shape inference alone leaves those dimensions unknown and costs them as 1.
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 32, 256], name="x")
        w = tf.Variable(tf.zeros([256, 1000]), name="w")
        projected = tf.tensordot(x, w, axes=1, name="projection")
        state = tf.zeros(tf.stack([tf.shape(x)[0], 256]), name="state")
        recurrent = tf.matmul(state, w, name="recurrent")
        tf.add(tf.reduce_sum(projected), tf.reduce_sum(recurrent), name="total")
    op_graph = op_graph_from_graph_def(graph.as_graph_def(), ["total"], batch_size=64)
    cluster = Cluster.preset("2xV100")
    costs = analytical_profile(op_graph, cluster)
    matmuls = {name: costs.compute_s[i, 0] for i, name in enumerate(op_graph.names)
               if op_graph.types[i] == "MatMul"}
    assert len(matmuls) == 2
    for name, flops in ((next(n for n in matmuls if n.startswith("projection")), 2 * 64 * 32 * 256 * 1000),
                        ("recurrent", 2 * 64 * 256 * 1000)):
        expected = _flop_seconds(flops, cluster, "GPU:V100")
        assert expected / 3 < matmuls[name] < expected * 3, (name, matmuls[name], expected)


def test_sub_microsecond_ops_keep_their_cost(small):
    # grappler reports whole microseconds; a Relu of [128, 256] floats on a V100 takes ~0.29 us
    # (read + write 256 KB at 900 GB/s) and must not round to 0.
    costs = analytical_profile(small, "2xV100")
    relu = costs.compute_s[small.index_of("relu"), 0]
    assert relu == pytest.approx(2 * 128 * 256 * 4 / 900e9, rel=0.05)


def test_ops_grappler_leaves_out_are_estimated_and_counted(small, monkeypatch):
    real = analytical._grappler_op_costs

    def drop_some(item, device):
        costs = real(item, device)
        costs.pop("matmul")  # real work: estimated from its output bytes
        costs.pop("pred")  # a Const: free
        return costs

    monkeypatch.setattr(analytical, "_grappler_op_costs", drop_some)
    cluster = Cluster.preset("2xV100")
    costs = analytical_profile(small, cluster)
    assert costs.source == "analytical (2 ops estimated)"
    matmul = costs.compute_s[small.index_of("matmul")]
    output_bytes = small.output_bytes[small.index_of("matmul")]
    assert output_bytes == 128 * 256 * 4
    assert matmul[0] == pytest.approx(output_bytes / 900e9)
    assert matmul[1] == pytest.approx(output_bytes / 100e9)
    assert costs.compute_s[small.index_of("pred")].tolist() == [0.0, 0.0]


def test_device_without_throughput_figures_is_an_error(small):
    device = Device("/job:localhost/replica:0/task:0/device:GPU:0", "GPU", 2**30, model="mystery")
    with pytest.raises(errors.CostProfileError, match="throughput"):
        analytical_profile(small, Cluster([device]))


# -- measured -------------------------------------------------------------------------------------

def test_measured_profile_on_local_cpus(small):
    costs = measured_profile(small, "local:2", runs=3, warmup=1)
    assert costs.device_kinds == ("CPU:host",)
    assert costs.op_names == small.names
    times = dict(zip(small.names, costs.compute_s[:, 0]))
    assert times["matmul"] > 0 and times["relu"] > 0 and times["loss"] > 0
    assert times["matmul"] < 1.0
    assert times["never_runs"] == 0.0  # on the branch the Switch does not take
    assert costs.source == "measured (median of 3 runs, 1 ops not traced)"


def test_measured_profile_uses_known_variable_values():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
        w = tf.Variable(tf.zeros([8, 8]), name="w")
        tf.reduce_sum(tf.matmul(x, w, name="matmul"), name="loss")
    values = {"w": np.ones((8, 8), np.float32)}
    op_graph = op_graph_from_graph_def(graph.as_graph_def(), ["loss"], batch_size=4,
                                       variable_values=values)
    costs = measured_profile(op_graph, "local:1", runs=1, warmup=0)
    assert costs.compute_s[op_graph.index_of("matmul"), 0] > 0


def test_measured_profile_needs_the_devices(small):
    with pytest.raises(errors.CostProfileError, match="source='analytical'"):
        profile(small, "2xV100", source="measured", use_cache=False)


# -- files and cache ------------------------------------------------------------------------------

def test_save_load_round_trip(small, tmp_path):
    costs = analytical_profile(small, "2xK80")
    path = tmp_path / "costs.pb"
    costs.save(path)
    loaded = CostProfile.load(path)
    assert loaded.op_names == costs.op_names and loaded.device_kinds == costs.device_kinds
    np.testing.assert_array_equal(loaded.compute_s, costs.compute_s)
    assert (loaded.source, loaded.graph_fingerprint) == (costs.source, costs.graph_fingerprint)
    # As a profile source, columns follow the cluster's kinds (only the host here).
    host_only = Cluster([d for d in Cluster.preset("2xK80").devices if d.type == "CPU"])
    from_path = profile(small, host_only, source=str(path))
    assert from_path.device_kinds == ("CPU:host",)
    np.testing.assert_array_equal(from_path.compute_s[:, 0], costs.compute_s[:, 1])


def test_cache_hit_returns_identical_arrays_without_recomputing(small, tmp_path, monkeypatch):
    first = profile(small, "2xV100", cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.pb"))) == 1

    def fail(*args, **kwargs):
        raise AssertionError("grappler ran although the profile was cached")

    monkeypatch.setattr(analytical, "_grappler_op_costs", fail)
    second = profile(small, "2xV100", cache_dir=tmp_path)
    np.testing.assert_array_equal(second.compute_s, first.compute_s)
    assert second.op_names == first.op_names and second.source == first.source
    with pytest.raises(AssertionError):  # a different cluster is a different cache entry
        profile(small, "2xK80", cache_dir=tmp_path)


def test_default_cache_dir_is_taken_from_the_environment(small, tmp_path, monkeypatch):
    monkeypatch.setenv("TFPLACETO_CACHE_DIR", str(tmp_path))
    profile(small, "2xV100")
    assert len(list(tmp_path.glob("*-analytical-*.pb"))) == 1


def test_corrupted_cache_is_recomputed_and_rewritten(small, tmp_path):
    expected = profile(small, "2xV100", cache_dir=tmp_path)
    (path,) = tmp_path.glob("*.pb")
    path.write_bytes(b"\x0a\xff\xff garbage, not a CostProfile")
    recovered = profile(small, "2xV100", cache_dir=tmp_path)
    np.testing.assert_array_equal(recovered.compute_s, expected.compute_s)
    np.testing.assert_array_equal(CostProfile.load(path).compute_s, expected.compute_s)


def test_unwritable_cache_only_warns(small, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    with pytest.warns(UserWarning, match="cache"):
        costs = profile(small, "2xV100", cache_dir=blocker / "cache")
    assert costs.compute_s.shape == (small.num_ops, 2)


# -- errors ---------------------------------------------------------------------------------------

def test_garbage_file_is_an_error(small, tmp_path):
    path = tmp_path / "garbage.pb"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(errors.CostProfileError):
        profile(small, "2xV100", source=str(path))


def test_missing_file_or_unknown_source_is_an_error(small, tmp_path):
    with pytest.raises(errors.CostProfileError, match="'analytical'"):
        profile(small, "2xV100", source=str(tmp_path / "missing.pb"))
    with pytest.raises(errors.CostProfileError):
        profile(small, "2xV100", source="grappler")


def test_profile_of_another_graph_is_an_error(small, tmp_path):
    path = tmp_path / "other.pb"
    analytical_profile(_small_graph(with_dead_branch=False), "2xV100").save(path)
    with pytest.raises(errors.CostProfileError, match="profile this graph"):
        profile(small, "2xV100", source=str(path))


def test_profile_lacking_a_device_kind_is_an_error(small, tmp_path):
    path = tmp_path / "v100.pb"
    analytical_profile(small, "2xV100").save(path)
    with pytest.raises(errors.CostProfileError, match="GPU:K80"):
        profile(small, "2xK80", source=str(path))


def test_grouped_graph_is_an_error_that_points_to_grouped(small):
    grouped = group(small, max_groups=3).graph
    for source in ("analytical", "measured"):
        with pytest.raises(errors.CostProfileError, match="CostProfile.grouped"):
            profile(grouped, "local:2", source=source, use_cache=False)
