"""Shared test set-up: quiet TensorFlow, fixed seeds, small helpers.

  _seeded           every test starts from the same numpy / TensorFlow seeds.
  write_mlp_graph   writes the TF1 test graph: a 4-layer MLP on x [batch, 64] with a train op.
  gpus, layered     small clusters and problems (V100-like GPUs; a random layered DAG).
  ROOT, load_script the checkout's root; a script of tools/ or benchmarks/ (not packages) as a
                    module: `from conftest import load_script`.
"""

import importlib.util
import os
import pathlib
import sys
import tempfile
from types import ModuleType

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Cost profiles are cached on disk: tests use their own cache, never the user's.
os.environ["TFPLACETO_CACHE_DIR"] = tempfile.mkdtemp(prefix="tfplaceto-test-cache-")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # bit-stable CPU kernels for equality checks

import numpy as np  # noqa: E402
import pytest  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


def load_script(path: str) -> ModuleType:
    """Imports the script at `path` (relative to the checkout's root, e.g. "tools/gen_build.py")."""
    name = "_script_" + path.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _no_gin_bindings():
    """Every test ends with no gin bindings: a `tfplaceto train` command a test runs leaves its
    configuration parsed in the process, and a later test's `train()` would take it (a CLI test
    with train.gin made test_rl's zero-learning-rate control learn)."""
    yield
    import gin

    gin.clear_config()


@pytest.fixture(autouse=True)
def _seeded():
    import tensorflow as tf

    np.random.seed(0)
    tf.random.set_seed(0)
    tf.keras.utils.set_random_seed(0)
    yield


@pytest.fixture(scope="session")
def write_mlp_graph():
    """write(path, train_op="train", batch_size=None): writes the TF1 test graph as a GraphDef
    .pb at path (placeholder x [batch_size, 64], None: unknown; four resource-variable matmul +
    relu layers; a gradient-descent op named train_op) and returns the path as a str."""
    def write(path, train_op: str = "train", batch_size: int | None = None) -> str:
        import tensorflow as tf

        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [batch_size, 64], name="x")
            h = x
            for i in range(4):
                w = tf.compat.v1.get_variable(f"w{i}", [64, 64], use_resource=True)
                h = tf.nn.relu(tf.matmul(h, w))
            tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(h), name=train_op)
        with open(path, "wb") as f:
            f.write(graph.as_graph_def().SerializeToString())
        return str(path)

    return write


def gpus(count, memory=16 * 10**9):
    """`count` V100-like GPUs of `memory` bytes each."""
    import tfplaceto as tp

    return [tp.Device(f"/job:localhost/replica:0/task:0/device:GPU:{i}", "GPU", memory, model="V100")
            for i in range(count)]


def with_gpu_memory(preset: str, memory_bytes: int):
    """The preset cluster with `memory_bytes` on each GPU (its host and links as they are)."""
    import dataclasses

    import tfplaceto as tp

    cluster = tp.Cluster.preset(preset)
    devices = [dataclasses.replace(d, memory_bytes=int(memory_bytes)) if d.type == "GPU" else d
               for d in cluster.devices]
    return tp.Cluster(devices, cluster.links(), name=f"{preset} with {int(memory_bytes)} B a GPU")


def layered(seed=0, width=4, depth=5, devices=3, cpu_only=()):
    """A random layered DAG with uneven costs; `cpu_only` nodes may only go on the last device."""
    import tfplaceto as tp
    from tfplaceto.graph.op_graph import make_op_graph
    from tfplaceto.problem import Problem, allowed_devices

    rng = np.random.default_rng(seed)
    n = width * depth
    producers, consumers = [], []
    for layer in range(1, depth):
        for j in range(width):
            for parent in rng.choice(width, size=2, replace=False):
                producers.append((layer - 1) * width + parent)
                consumers.append(layer * width + j)
    kernels = np.ones((n, 2), bool)
    for node in cpu_only:
        kernels[node, 1] = False
    graph = make_op_graph([f"n{i}" for i in range(n)], ["MatMul"] * n, producers,
                          rng.integers(1, 50, len(producers)) * 10**5, np.arange(len(producers)),
                          consumers, kernels=kernels)
    host = tp.Device("/job:localhost/replica:0/task:0/device:CPU:0", "CPU", 64 * 10**9, model="host")
    cluster = tp.Cluster(gpus(devices - 1) + [host], name="layered")
    compute = rng.uniform(0.5, 3.0, (n, 1)) * 1e-3 * np.array([1.0] * (devices - 1) + [4.0])
    return Problem(graph, cluster, compute, allowed_devices(graph, cluster))
