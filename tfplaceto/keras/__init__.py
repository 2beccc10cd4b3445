"""Keras integration, in the shape of tensorflow-model-optimization: two verbs on a compiled
model, and a callback that uses them.

    model.compile(...)
    result = tp.keras.place_model(model, "local:2", batch_size=32)   # its training step, placed
    model.fit(x, y, batch_size=32)                                    # trains with the placement
    tp.keras.strip_placement(model)                                   # its own training step back

    model.fit(x, y, callbacks=[tp.keras.PlacementCallback("local:2", log_dir="logs")])

(tensorflow-model-optimization's pairs are `prune_low_magnitude` / `strip_pruning` and
`cluster_weights` / `strip_clustering`; `tp.apply_placement` already names the GraphDef
write-back, so the model's verb is `place_model`.)

Map of the package:
  devices.py      ensure_devices: a cluster's devices usable by eager TensorFlow here, or raises.
  train_step.py   place_model: optimize the model's training step and make its train function
                  run placed (how, in its docstring); strip_placement: the model's own step back.
  callback.py     PlacementCallback: place_model when training begins (or on the first batch,
                  for the batch size fit feeds), step timing, strip_placement when it ends.
  summaries.py    PlacementSummaries: the TensorBoard scalars of a placement and of measured
                  step times (the callback's log_dir); usable beside place_model too.
"""

from __future__ import annotations

from tfplaceto.keras.callback import PlacementCallback
from tfplaceto.keras.devices import ensure_devices
from tfplaceto.keras.train_step import place_model, strip_placement

__all__ = ["PlacementCallback", "ensure_devices", "place_model", "strip_placement"]
