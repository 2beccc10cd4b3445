"""How much of a cost estimate rests on unknown shapes, and the warning that says so.

An op whose output shapes TensorFlow cannot infer gets guessed bytes and, from the analytical
model, a cost near 0: a tf.function's graph exported with `as_graph_def()` has its variables as
shapeless resource placeholders, and then nearly every op of a training step is costed 0. A
placement planned on such costs is planned on the few ops that are known. `unknown_shapes`
measures it; `warn_if_unknown` warns (`errors.UnknownShapesWarning`) naming what to pass instead.

- `UnknownShapes`: compute ops with unknown shapes, all compute ops, and the share of the
  estimated compute (fastest device per op) those ops account for.
- `count_unknown_shapes(op_graph, compute_s)`: the figures; ops that do no work (NO_OP_TYPES) are left
  out of both counts.
- `warn_if_unknown(figures)`: the warning, when any compute op has an unknown shape.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from tfplaceto import errors
from tfplaceto.costs.analytical import NO_OP_TYPES
from tfplaceto.graph.op_graph import OpGraph


@dataclasses.dataclass(frozen=True)
class UnknownShapes:
    """ops of compute_ops have an output of unknown shape; compute_share of the estimate is theirs."""

    ops: int
    compute_ops: int
    compute_share: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def message(self) -> str:
        return (f"{self.ops} of {self.compute_ops} compute ops have unknown shapes, so their costs are "
                f"guesses (they make up {self.compute_share:.1%} of the estimated compute); the "
                "placement is planned on partial costs. Pass the source that knows the shapes: the "
                "ConcreteFunction or tf.function (not its graph's GraphDef), the SavedModel, the Keras "
                "model, or batch_size= for an unknown batch dimension")


def count_unknown_shapes(op_graph: OpGraph, compute_s: np.ndarray) -> UnknownShapes:
    """The figures for op_graph (ops, not groups) and its (ops, devices) compute seconds."""
    compute = np.asarray([t not in NO_OP_TYPES for t in op_graph.types], bool)
    unknown = compute & np.asarray(op_graph.unknown_shapes, bool)
    fastest = np.asarray(compute_s, float).min(axis=1) if len(op_graph.names) else np.zeros(0)
    total = float(fastest[compute].sum())
    share = float(fastest[unknown].sum()) / total if total > 0 else float(unknown.any())
    return UnknownShapes(int(unknown.sum()), int(compute.sum()), share)


def warn_if_unknown(figures: UnknownShapes, stacklevel: int = 3) -> None:
    if figures.ops:
        warnings.warn(figures.message(), errors.UnknownShapesWarning, stacklevel=stacklevel)
