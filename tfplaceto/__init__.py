"""tfplaceto: learned, generalizing device placement for TensorFlow graphs (Placeto).

The flow (one direction):
  source -> import_graph -> OpGraph -> group -> profile -> CostProfile
         -> place (baselines or the Placeto policy) -> Placement, evaluated by simulate / measure
         -> apply_placement -> GraphDef with NodeDef.device set.
`optimize` runs all of it in one call; `tfplaceto.keras` (`place_model` / `strip_placement`,
`PlacementCallback`) and `tfplaceto.saved_model.rewrite` wrap it for Keras and SavedModels.
`__all__` lists the public names.

The public names are imported on first use (PEP 562), so `import tfplaceto` alone does not load
TensorFlow: the command line can set TensorFlow's log level first, and `tfplaceto --help` or a
usage error answers without it. `tp.optimize` and friends behave exactly as eager imports would.
"""

import importlib
import sys
import types

# public name -> the module that defines it (a submodule when the name is the module itself).
_EXPORTS = {
    "Cluster": "tfplaceto.cluster", "Device": "tfplaceto.cluster", "Link": "tfplaceto.cluster",
    "ContentionGroup": "tfplaceto.cluster", "calibrate_cluster": "tfplaceto.measure",
    "CostProfile": "tfplaceto.costs", "profile": "tfplaceto.costs",
    "OpGraph": "tfplaceto.graph", "group": "tfplaceto.graph", "import_graph": "tfplaceto.graph",
    "LocalTFCluster": "tfplaceto.measure", "MeasureResult": "tfplaceto.measure",
    "RemoteTFCluster": "tfplaceto.measure", "calibrate_links": "tfplaceto.measure",
    "calibrated_cluster": "tfplaceto.measure", "measure": "tfplaceto.measure",
    "METHODS": "tfplaceto.place", "OptimizeResult": "tfplaceto.place", "optimize": "tfplaceto.place",
    "place": "tfplaceto.place",
    "Placement": "tfplaceto.placement",
    "apply_placement": "tfplaceto.rewrite",
    "SimResult": "tfplaceto.sim", "lower_bound": "tfplaceto.sim", "simulate": "tfplaceto.sim",
    "errors": None, "keras": None, "saved_model": None,
}

__version__ = "0.1.0"


def train(sources, clusters, episodes: int, logdir: str | None, seed: int = 0, actors: int = 0, **config):
    """Trains a Placeto policy on every source on every cluster for `episodes` episodes (seeded),
    resuming from `logdir`'s last checkpoint; returns a `tfplaceto.rl.train.TrainResult` with
    `policy_dir` (usable as `place(..., policy=...)`), `episodes`, `decisions`, `wall_s` and
    `best_step_time_s` (per source and cluster). `config`: arguments of `tfplaceto.rl.train.train`.
    `actors > 0` collects in that many actor processes through a Reverb server on loopback;
    `reverb_address="HOST:PORT"` serves it on PORT for `tfplaceto actor` on other machines too
    (`tfplaceto.rl.learner`). `select_sources=[...]`: graphs (on the same clusters) the exported
    policy is selected on instead of the training graphs. `logdir/summary.json` holds `episodes`,
    `decisions`, `wall_s`, `learner_steps`, `episodes_per_actor` and `policy_dir`.
    """
    from tfplaceto.rl.learner import train_sources  # TF-Agents loads only when training

    return train_sources(sources, clusters, episodes, logdir, seed=seed, actors=actors, **config)


__all__ = sorted([*_EXPORTS, "train"])


def __getattr__(name: str):
    if name in _EXPORTS:
        module = _EXPORTS[name]
        value = importlib.import_module(f"tfplaceto.{name}") if module is None else \
            getattr(importlib.import_module(module), name)
    elif not name.startswith("__"):
        try:  # a submodule not listed above (tp.cluster, tp.bench): as `import tfplaceto.x` would
            value = importlib.import_module(f"tfplaceto.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"tfplaceto.{name}":
                raise
            raise AttributeError(f"module 'tfplaceto' has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module 'tfplaceto' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """The package module. Importing a submodule binds it on its package; `place` and `measure`
    are both a submodule and the public function of that name, and the function must win (as
    the eager `from tfplaceto.place import place` made it)."""

    def __setattr__(self, name: str, value) -> None:
        if (isinstance(value, types.ModuleType) and _EXPORTS.get(name) is not None
                and value.__name__ == f"{__name__}.{name}"):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
