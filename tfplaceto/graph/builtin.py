"""Built-in benchmark graphs and graph families: what `"builtin:NAME"` resolves to.

Every entry is a real tf.keras model, compiled with its loss and optimizer, so importing it gives
the whole training step (forward, backward, optimizer update). `tfplaceto.graph.import_graph`
calls `build(NAME)` and imports the model it returns at the batch size it returns.

Map of the file:
  BuiltinModel, MODELS     the registry: name -> builder, default batch size, kind, description.
  build(name)              "inception_v3" -> (compiled model, batch); "cifar10-cells/7" -> family
                           member with seed 7 ("cifar10-cells" alone is seed 0).
  family(name, seed)       one member of a graph family.
  EVALUATION_MEMBERS       the family members the project's figures judge policies on.
  covering_members         family members whose plans together cover the family's choices.
  describe()               (name, description) rows for `tfplaceto models`.
  _fresh_layer_names       auto-generated Keras layer names restart from zero for each build.
The builders: `builtin_models.py` (the benchmark models, and `estimate_memory_bytes`, the
memory estimate quoted in the descriptions) and `builtin_families.py` (the family generators).

Determinism: a name always gives the same graph (same op names, same structure). Weight values
are seeded for the GNMT-style models and random elsewhere (placement does not depend on them).
Random structure choices come from a
local `random.Random(seed)`; global seeds are never touched. Keras numbers auto-generated layer names
with process-wide counters (conv2d_37 ...), so a build runs with fresh counters and merges them
back afterwards (`_fresh_layer_names`): the second build of a name in a process matches the first.
Nothing is downloaded: Keras applications are built with weights=None.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tfplaceto import errors
from tfplaceto.graph import builtin_families, builtin_models
from tfplaceto.graph.builtin_models import GB, estimate_memory_bytes  # noqa: F401 (builtin.GB)


@dataclasses.dataclass(frozen=True)
class BuiltinModel:
    """One registry entry.

    builder: for kind "model", `builder()`; for kind "family", `builder(seed)`; both return a
      compiled tf.keras.Model.
    plan, choices (families): `plan(seed)` is member `seed`'s random choices as a dict, without
      building it; `choices` are its keys that say what kind of member it is (each drawn from a
      few values), what `covering_members` covers.
    """

    name: str
    description: str
    builder: Callable[..., Any]
    batch_size: int
    kind: str = "model"  # "model" or "family"
    plan: Callable[[int], dict] | None = None
    choices: tuple[str, ...] = ()


@contextlib.contextmanager
def _fresh_layer_names() -> Iterator[None]:
    """Auto-generated layer names restart at zero inside; the counters are merged back after.

    Keras keeps process-wide counters per name prefix, so the 2nd InceptionV3 built in a process
    would be named conv2d_94... instead of conv2d...; a benchmark graph must not depend on what
    was built before it. Merging back (max of both counters, union of the observed names) keeps
    names the caller builds later unique, as if nothing had been reset.
    """
    try:
        from keras.src import backend as keras_backend
        uid_maps = keras_backend.PER_GRAPH_OBJECT_NAME_UIDS
        observed = keras_backend.OBSERVED_NAMES
    except (ImportError, AttributeError):  # another Keras: names may depend on history
        yield
        return
    saved_maps = {graph: dict(uids) for graph, uids in uid_maps.items()}
    saved_observed = set(observed)
    uid_maps.clear()
    observed.clear()
    try:
        yield
    finally:
        for graph, uids in saved_maps.items():
            merged = uid_maps.get(graph)
            if merged is None:
                merged = uid_maps[graph] = collections.defaultdict(int)
            for prefix, count in uids.items():
                merged[prefix] = max(merged[prefix], count)
        observed.update(saved_observed)


# -- registry ---------------------------------------------------------------------------------------

def _entry(name: str, description: str, builder, batch_size: int, kind: str = "model", plan=None,
           choices: tuple[str, ...] = ()):
    return name, BuiltinModel(name, description, builder, batch_size, kind, plan, choices)


MODELS: dict[str, BuiltinModel] = dict([
    _entry("inception_v3", "Inception-v3 (299x299 ImageNet, SGD+momentum), batch 32; ~4.4 GB: "
           "fits one K80", builtin_models.inception_v3, 32),
    _entry("nmt_2l", "GNMT-style NMT, 2+2 LSTM layers of 1024 (first bidirectional), attention, "
           "32k vocab, 40 steps unrolled (Adam), batch 128; ~13.3 GB: over one K80, fits 2",
           builtin_models.nmt(2), 128),
    _entry("nmt_2l_loop", "nmt_2l with Keras' default LSTMs, not unrolled: imported for a GPU "
           "cluster, cuDNN's fused LSTM ops (what TensorFlow runs there), else while loops over "
           "the 40 steps (forward and gradient); same weights and batch 128; ~6.0 GB by the "
           "estimate for the loops (no per-step weight gradients held; simulated peaks are higher)",
           builtin_models.nmt_loop(2), 128),
    _entry("nmt_4l", "GNMT-style NMT, 4+4 LSTM layers of 1024 (first bidirectional, residual from "
           "3), attention, 32k vocab, 40 steps unrolled (Adam), batch 128; ~20.3 GB: needs 2 "
           "K80s", builtin_models.nmt(4), 128),
    _entry("nmt_8l", "GNMT-style NMT, 8+8 LSTM layers of 1024 (first bidirectional, residual from "
           "3), attention, 32k vocab, 40 steps unrolled (Adam), batch 128; ~34.1 GB: needs 3+ "
           "K80s", builtin_models.nmt(8), 128),
    _entry("nasnet", "NASNet-A Large (331x331 ImageNet, SGD+momentum), batch 16; ~19.6 GB: does "
           "not fit one 12 GB K80, fits 2 to 4", builtin_models.nasnet_large, 16),
    _entry("nasnet_mobile", "NASNet-A Mobile (224x224 ImageNet, SGD+momentum), batch 128; "
           "~14.2 GB: does not fit one K80, fits 2", builtin_models.nasnet_mobile, 128),
    _entry("cifar10-cells", "family: random ENAS-like CNNs, 3-6 cells of 2-4 nodes (conv, sep-conv, "
           "pool, identity) on 32x32 CIFAR-10 images, batch 64, 1k-2.5k ops; NAME/SEED picks "
           "a member", builtin_families.cifar10_cells, 64, "family", builtin_families.cifar10_cells_plan,
           ("channels", "num_cells")),
    _entry("ptb-cells", "family: random ENAS-like recurrent cells of 3-6 nodes unrolled over "
           "20-35 steps, 10k vocab, batch 64, 1k-2.5k ops; NAME/SEED picks a member",
           builtin_families.ptb_cells, 64, "family", builtin_families.ptb_cells_plan, ("units", "num_nodes")),
    _entry("nmt-variants", "family: GNMT-style models, depth 2-6, width 256-1024, attention or "
           "not, 3-9 unrolled steps, batch 64, 3k-5k ops; NAME/SEED picks a member",
           builtin_families.nmt_variant, 64, "family", builtin_families.nmt_variant_plan,
           ("num_layers", "units", "attention", "vocab")),
])


def _unknown(name: str) -> errors.InvalidGraphError:
    known = ", ".join(f"{n}/SEED" if m.kind == "family" else n for n, m in MODELS.items())
    return errors.InvalidGraphError(
        f"unknown built-in graph {name!r}; known: {known} (`tfplaceto models` describes them)")


def family(name: str, seed: int) -> tuple[Any, int]:
    """Member `seed` of graph family `name`: (compiled tf.keras.Model, batch size)."""
    entry = MODELS.get(name)
    if entry is None or entry.kind != "family":
        raise _unknown(name if entry is None else f"{name}/{seed}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise errors.InvalidGraphError(
            f"the seed of built-in family {name!r} must be an int >= 0, got {seed!r}")
    with _fresh_layer_names():
        return entry.builder(seed), entry.batch_size


# Family members the project's figures judge trained policies on, so nothing trains on them:
# validation members 50-55 (which seed of a command to ship) and held-out members 100-109 (the
# zero-shot figures of record; docs/RESULTS.md). The teacher phase skips them.
EVALUATION_MEMBERS = frozenset(range(50, 56)) | frozenset(range(100, 110))


def covering_members(name: str, count: int, candidates: Iterable[int] = range(50)) -> list[int]:
    """`count` members of family `name`, among `candidates`, that between them take as many
    values of the family's choices as they can (its `BuiltinModel.choices`: e.g. attention or
    not, the width), in the order picked.

    Greedy: each next member is the candidate whose plan adds the most (choice, value) pairs not
    yet taken, the lowest seed among equals; the first is therefore the lowest candidate. The
    first members of a family need not cover it (nmt-variants members 0-2 all have attention);
    a policy trained on them sees no member of the kinds they miss. (Trained on covering members
    instead, the shipped configuration did worse on validation members, those kinds included:
    docs/RESULTS.md, session 29.) The default candidates, 0-49, leave members 50 and above to
    validate and test on.
    """
    entry = MODELS.get(name)
    if entry is None or entry.kind != "family":
        raise _unknown(name)
    plans = {seed: entry.plan(seed) for seed in sorted(set(candidates))}  # lowest first
    if not 1 <= count <= len(plans):
        raise errors.InvalidArgumentError(
            f"cannot pick {count} members of {name!r} among {len(plans)} candidates")

    def pairs(seed: int) -> set:
        return {(key, plans[seed][key]) for key in entry.choices}

    taken: set = set()
    picked: list[int] = []
    for _ in range(count):
        unpicked = [seed for seed in plans if seed not in picked]
        gains = [len(pairs(seed) - taken) for seed in unpicked]
        best = unpicked[gains.index(max(gains))]  # the lowest seed among equals
        picked.append(best)
        taken |= pairs(best)
    return picked


def check_name(name) -> tuple[BuiltinModel, int | None]:
    """(entry, family seed or None) for a built-in name, without building anything.

    Raises InvalidGraphError listing the known names for anything that is not one.
    """
    if not isinstance(name, str):
        raise _unknown(repr(name))
    base, slash, seed_text = name.strip().partition("/")
    entry = MODELS.get(base)
    if entry is None:
        raise _unknown(name)
    if entry.kind == "family":
        if not slash:
            return entry, 0
        if not (seed_text.isascii() and seed_text.isdigit()):
            raise errors.InvalidGraphError(
                f"built-in graph {name!r}: the seed after '/' must be an int >= 0, "
                f"e.g. {base}/7")
        return entry, int(seed_text)
    if slash:
        raise errors.InvalidGraphError(
            f"built-in graph {name!r}: {base!r} is a single model, not a family; use {base!r}")
    return entry, None


def build(name: str) -> tuple[Any, int]:
    """The built-in graph `name`: (compiled tf.keras.Model, default batch size).

    `name` is a model ("nmt_4l"), a family member ("cifar10-cells/7") or a family alone (its
    member 0). Raises InvalidGraphError listing the known names for anything else.
    """
    entry, seed = check_name(name)
    if seed is not None:
        return family(entry.name, seed)
    with _fresh_layer_names():
        return entry.builder(), entry.batch_size


def describe() -> list[tuple[str, str]]:
    """(name, description) of every built-in model and family, for `tfplaceto models`."""
    return [(name, entry.description) for name, entry in MODELS.items()]


__all__ = ["MODELS", "BuiltinModel", "build", "check_name", "covering_members", "describe",
           "estimate_memory_bytes", "family"]
