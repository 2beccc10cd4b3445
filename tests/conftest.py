"""Shared test set-up: quiet TensorFlow, fixed seeds, small helpers."""

import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Cost profiles are cached on disk: tests use their own cache, never the user's.
os.environ["TFPLACETO_CACHE_DIR"] = tempfile.mkdtemp(prefix="tfplaceto-test-cache-")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # bit-stable CPU kernels for equality checks

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _seeded():
    import tensorflow as tf

    np.random.seed(0)
    tf.random.set_seed(0)
    tf.keras.utils.set_random_seed(0)
    yield
