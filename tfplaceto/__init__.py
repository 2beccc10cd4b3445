"""tfplaceto: learned, generalizing device placement for TensorFlow graphs (Placeto).

The flow (one direction):
  source -> import_graph -> OpGraph -> group -> profile -> CostProfile
         -> place (baselines or the Placeto policy) -> Placement, evaluated by simulate / measure
         -> apply_placement -> GraphDef with NodeDef.device set.
`optimize` runs all of it in one call; `tfplaceto.keras.PlacementCallback` and
`tfplaceto.saved_model.rewrite` wrap it for Keras and SavedModels. Names: shared/API.md.
"""

from tfplaceto import errors
from tfplaceto.cluster import Cluster, Device, Link
from tfplaceto.costs.cost_profile import CostProfile
from tfplaceto.graph import OpGraph, group, import_graph
from tfplaceto.place import METHODS, OptimizeResult, optimize, place
from tfplaceto.placement import Placement
from tfplaceto.rewrite import apply_placement


def profile(op_graph, cluster, source="analytical", **kwargs):
    """Per-op compute seconds on each device kind of cluster (see tfplaceto.costs.profile)."""
    from tfplaceto.costs import profile as _profile

    return _profile(op_graph, cluster, source=source, **kwargs)


def simulate(op_graph, placement, cluster, costs=None):
    """Simulates one step of op_graph placed by placement (see tfplaceto.sim.simulate)."""
    from tfplaceto.sim import simulate as _simulate

    return _simulate(op_graph, placement, cluster, costs)


def lower_bound(op_graph, cluster, costs=None) -> float:
    """The step time no placement can beat (see tfplaceto.sim.lower_bound)."""
    from tfplaceto.sim import lower_bound as _lower_bound

    return _lower_bound(op_graph, cluster, costs)


__version__ = "0.1.0"
__all__ = ["METHODS", "Cluster", "CostProfile", "Device", "Link", "OpGraph", "OptimizeResult", "Placement",
           "apply_placement", "errors", "group", "import_graph", "lower_bound", "optimize", "place",
           "profile", "simulate"]
