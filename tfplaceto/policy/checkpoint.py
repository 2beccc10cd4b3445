"""Saving and loading a trained Placeto policy (its network config and weights).

`save_policy` writes a directory (replaced as a whole, so a reader never sees half of one);
`load_policy` reads one back, refusing a policy trained on other features. The shipped policy
lives in `pretrained/` beside this file.
"""

import json
import os
import shutil
import warnings

from tfplaceto.policy import features as F

PRETRAINED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pretrained")
_CONFIG = "policy.json"
_WEIGHTS = "weights"
_FEATURES = {"node": F.NODE_FEATURES, "edge": F.EDGE_FEATURES, "device": F.DEVICE_FEATURES}


def save_policy(network, directory: str, notes: dict | None = None) -> None:
    """Writes `network`'s config and weights to `directory` (replaced as a whole)."""
    import tensorflow as tf

    tmp = f"{directory.rstrip(os.sep)}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    tf.train.Checkpoint(network=network).write(os.path.join(tmp, _WEIGHTS))
    with open(os.path.join(tmp, _CONFIG), "w") as f:
        json.dump({"network": network.config, "features": _FEATURES, "notes": notes or {}}, f, indent=1)
    old = f"{directory.rstrip(os.sep)}.old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(directory):
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)


def load_policy(directory: str | None = None):
    """The PlacetoNetwork saved in `directory` (default: the shipped one), or None."""
    import tensorflow as tf

    from tfplaceto.policy.network import PlacetoNetwork

    directory = directory or PRETRAINED_DIR
    path = os.path.join(directory, _CONFIG)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        config = json.load(f)
    if config.get("features") != _FEATURES:
        warnings.warn(f"the policy in {directory} was trained on other features "
                      f"({config.get('features')}, this code has {_FEATURES}); not using it",
                      stacklevel=2)
        return None
    network = PlacetoNetwork(**config["network"])
    network.warm_up(F.observation_spec(F.Dims(nodes=2, edges=1, devices=2)))
    tf.train.Checkpoint(network=network).read(os.path.join(directory, _WEIGHTS)).assert_consumed()
    return network
