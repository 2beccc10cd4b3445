"""tfplaceto: learned, generalizing device placement for TensorFlow graphs (Placeto).

The flow (one direction):
  source -> import_graph -> OpGraph -> group -> profile -> CostProfile
         -> place (baselines or the Placeto policy) -> Placement, evaluated by simulate / measure
         -> apply_placement -> GraphDef with NodeDef.device set.
`optimize` runs all of it in one call; `tfplaceto.keras.PlacementCallback` and
`tfplaceto.saved_model.rewrite` wrap it for Keras and SavedModels. Names: shared/API.md.
"""

from tfplaceto import errors, keras, saved_model
from tfplaceto.cluster import Cluster, Device, Link
from tfplaceto.costs import CostProfile, profile
from tfplaceto.graph import OpGraph, group, import_graph
from tfplaceto.measure import (
                               LocalTFCluster,
                               MeasureResult,
                               RemoteTFCluster,
                               calibrate_links,
                               calibrated_cluster,
                               measure,
)
from tfplaceto.place import METHODS, OptimizeResult, optimize, place
from tfplaceto.placement import Placement
from tfplaceto.rewrite import apply_placement
from tfplaceto.sim import SimResult, lower_bound, simulate

__version__ = "0.1.0"


def train(sources, clusters, episodes: int, logdir: str | None, seed: int = 0, actors: int = 0, **config):
    """Trains a Placeto policy on every source on every cluster for `episodes` episodes (seeded),
    resuming from `logdir`'s last checkpoint; returns a `tfplaceto.rl.train.TrainResult` with
    `policy_dir` (usable as `place(..., policy=...)`), `episodes`, `decisions`, `wall_s` and
    `best_step_time_s` (per source and cluster). `config`: arguments of `tfplaceto.rl.train.train`.
    """
    from tfplaceto.rl.train import train_sources  # TF-Agents loads only when training

    return train_sources(sources, clusters, episodes, logdir, seed=seed, actors=actors, **config)
__all__ = ["METHODS", "Cluster", "CostProfile", "Device", "Link", "LocalTFCluster", "MeasureResult", "OpGraph",
           "OptimizeResult", "Placement", "RemoteTFCluster", "SimResult", "apply_placement", "calibrate_links",
           "calibrated_cluster", "errors", "group", "keras", "import_graph", "lower_bound", "measure", "optimize",
           "place", "profile", "saved_model", "simulate", "train"]
