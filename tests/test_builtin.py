"""Tests of the built-in benchmark graphs and graph families (`tfplaceto.graph.builtin`).

Fast (~40 s on 2 cores): the registry and `describe()`, name parsing and its errors, `nmt_2l` built
and checked layer by layer (not imported: tracing its 15k-op training step alone takes ~30 s),
one member of each family built and imported (no control-flow ops; same seed -> same
fingerprint, another seed -> another graph), and the layer-name counters being restored.
Slow (`-m slow`): every model builds with its stated memory estimate, and imports without
control flow (the `_loop` models with their while loops, every trip count static).
"""

from __future__ import annotations

import re

import pytest

tf = pytest.importorskip("tensorflow")

from tfplaceto import errors  # noqa: E402
from tfplaceto.graph import builtin, builtin_families, builtin_models, import_graph  # noqa: E402

# Ops of a TF loop or conditional, functional or lowered: none may be left in a built-in graph.
CONTROL_FLOW_OPS = {"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
                    "Enter", "Exit", "Merge", "Switch", "NextIteration", "LoopCond"}
MODEL_NAMES = [name for name, entry in builtin.MODELS.items() if entry.kind == "model"]
FAMILY_NAMES = [name for name, entry in builtin.MODELS.items() if entry.kind == "family"]


def structure(model) -> list[tuple]:
    """What a graph's shape depends on, per layer (cheap to compare: no import)."""
    rows = []
    for layer in model.layers:
        config = {k: v for k, v in layer.get_config().items() if k != "name"}
        rows.append((layer.name, type(layer).__name__, repr(sorted(config.items(), key=str))))
    return rows


def stated_estimate_gb(name: str) -> float:
    match = re.search(r"~([0-9.]+) GB", builtin.MODELS[name].description)
    assert match, f"the description of {name} states no memory estimate"
    return float(match.group(1))


def control_edges(op_graph) -> list[tuple[str, str]]:
    return sorted((op_graph.names[a], op_graph.names[b])
                  for a, b in zip(op_graph.control_senders, op_graph.control_receivers))


def assert_no_control_flow(op_graph) -> None:
    found = CONTROL_FLOW_OPS.intersection(op_graph.types)
    assert not found, f"control-flow ops in the graph: {sorted(found)}"


# -- registry and names ------------------------------------------------------------------------------

def test_registry_lists_models_and_families():
    assert {"inception_v3", "nmt_2l", "nmt_4l", "nmt_8l", "nasnet"} <= set(MODEL_NAMES)
    assert set(FAMILY_NAMES) == {"cifar10-cells", "ptb-cells", "nmt-variants"}
    for name, entry in builtin.MODELS.items():
        assert entry.name == name and entry.kind in ("model", "family")
        assert entry.batch_size > 0 and entry.description
    assert builtin.describe() == [(n, e.description) for n, e in builtin.MODELS.items()]
    for name in MODEL_NAMES:
        stated_estimate_gb(name)


def test_batch_sizes_make_one_model_not_fit_one_k80():
    over = [name for name in MODEL_NAMES if stated_estimate_gb(name) > 12]
    assert "nasnet" in over
    assert all(stated_estimate_gb(name) < 4 * 12 for name in MODEL_NAMES)


@pytest.mark.parametrize("name", ["nope", "NMT_2L", "nmt_2l/3", "cifar10-cells/x",
                                  "cifar10-cells/-1", "ptb", ""])
def test_bad_names_raise_invalid_graph_error_listing_known_names(name):
    with pytest.raises(errors.InvalidGraphError) as raised:
        builtin.build(name)
    message = str(raised.value)
    assert repr(name) in message or "seed" in message
    if "unknown" in message:
        assert all(known in message for known in builtin.MODELS)


def test_family_rejects_models_and_bad_seeds():
    with pytest.raises(errors.InvalidGraphError):
        builtin.family("nmt_2l", 0)
    with pytest.raises(errors.InvalidGraphError):
        builtin.family("cifar10-cells", -3)
    with pytest.raises(errors.InvalidGraphError):
        import_graph("builtin:no_such_model")


# -- nmt_2l (built, not imported) -----------------------------------------------------------------

@pytest.fixture(scope="module")
def nmt_2l():
    return builtin.build("nmt_2l")


def test_nmt_2l_structure(nmt_2l):
    model, batch = nmt_2l
    assert batch == 128
    names = {layer.name for layer in model.layers}
    assert {"encoder_embedding", "decoder_embedding", "encoder_lstm_1", "encoder_lstm_2",
            "decoder_lstm_1", "decoder_lstm_2", "attention", "softmax"} <= names
    assert not any("residual" in name for name in names)  # residuals start at layer 3
    assert isinstance(model.get_layer("encoder_lstm_1"), tf.keras.layers.Bidirectional)
    assert [tuple(t.shape) for t in model.inputs] == [(None, 40), (None, 40)]
    assert tuple(model.output.shape) == (None, 40, 32000)
    lstms = [layer for layer in model.layers if isinstance(layer, tf.keras.layers.LSTM)]
    lstms += [half for layer in model.layers if isinstance(layer, tf.keras.layers.Bidirectional)
              for half in (layer.forward_layer, layer.backward_layer)]
    assert len(lstms) == 5 and all(lstm.unroll for lstm in lstms)  # unrolled: no While loop
    assert isinstance(model.optimizer, tf.keras.optimizers.Adam)
    estimate = builtin.estimate_memory_bytes(model, batch) / builtin.GB
    assert estimate == pytest.approx(stated_estimate_gb("nmt_2l"), abs=0.051)


def test_gnmt_residuals_from_layer_3_and_attention_is_optional():
    # The deep models differ from nmt_2l only in depth: a tiny one shows the layer plan.
    model = builtin_models.gnmt("tiny", 3, units=8, vocab=50, steps=3)
    names = {layer.name for layer in model.layers}
    assert {"encoder_residual_3", "decoder_residual_3"} <= names
    assert not {"encoder_residual_2", "decoder_residual_2"} & names
    plain = builtin_models.gnmt("tiny_plain", 2, units=8, vocab=50, steps=3, attention=False)
    assert "attention" not in {layer.name for layer in plain.layers}


# -- families --------------------------------------------------------------------------------------

def test_cifar10_cells_member_imports_deterministically():
    # Seeds 2 and 6 are small members (~1000 and ~1300 ops): quick to import.
    model, batch = builtin.build("cifar10-cells/2")
    assert batch == 64 and model.name == "cifar10_cells_2"
    assert tuple(model.input.shape) == (None, 32, 32, 3) and tuple(model.output.shape) == (None, 10)
    assert any(name.startswith("cell0_node0_") for name in (layer.name for layer in model.layers))
    first = import_graph(model, batch_size=batch)
    again = import_graph("builtin:cifar10-cells/2")
    other = import_graph("builtin:cifar10-cells/6")
    assert_no_control_flow(first)
    assert 200 < first.num_ops < 6000
    assert first.names == again.names and first.types == again.types
    assert first.edge_tensor.tolist() == again.edge_tensor.tolist()
    assert control_edges(first) == control_edges(again)
    assert first.fingerprint() == again.fingerprint(), (
        "same graph, same control edges, but in another order: the OpGraph builder must list "
        "control edges in a deterministic order (GraphDef '^' input order, not "
        "Operation.control_inputs)")
    assert first.fingerprint() != other.fingerprint()


# Seeds with small members: nmt-variants/2 is depth 2, width 256, 8k vocabulary, 8 steps.
@pytest.mark.parametrize("name", ["ptb-cells/2", "nmt-variants/2"])
def test_family_member_imports_small_and_without_control_flow(name):
    op_graph = import_graph(f"builtin:{name}")
    assert_no_control_flow(op_graph)
    assert 200 < op_graph.num_ops < 6000


@pytest.mark.parametrize("family", ["cifar10-cells", "ptb-cells"])
def test_family_seeds(family):
    first, batch = builtin.build(f"{family}/5")
    again, _ = builtin.family(family, 5)
    assert batch == builtin.MODELS[family].batch_size
    assert structure(first) == structure(again)
    assert structure(builtin.family(family, 6)[0]) != structure(first)
    assert builtin.build(family)[0].name.endswith("_cells_0")  # no seed: member 0


def test_cifar10_cells_plan_is_what_is_built():
    for seed in (1, 5):
        model, _ = builtin.build(f"cifar10-cells/{seed}")
        plan = builtin_families.cifar10_cells_plan(seed)
        assert model.get_layer("stem_conv").filters == plan["channels"]
        assert {layer.name.split("_")[0] for layer in model.layers if layer.name.startswith("cell")} == {
            f"cell{cell}" for cell in range(plan["num_cells"])}


@pytest.mark.parametrize("family", ["cifar10-cells", "ptb-cells", "nmt-variants"])
def test_covering_members_take_more_kinds_of_member_than_the_first_ones(family):
    entry = builtin.MODELS[family]

    def taken(members):
        return {(key, entry.plan(seed)[key]) for seed in members for key in entry.choices}

    for count in (1, 3, 6):
        members = builtin.covering_members(family, count)
        assert len(set(members)) == count and members[0] == 0 and max(members) < 50
        assert len(taken(members)) >= len(taken(range(count)))
        # Greedy: no member left out would have added more than the last one picked did.
        before = taken(members[:-1])
        gain = len(taken(members) - before)
        assert all(len(taken([seed]) - before) <= gain for seed in range(50) if seed not in members)
    assert builtin.covering_members(family, 3) == builtin.covering_members(family, 6)[:3]
    assert builtin.covering_members(family, 2, candidates=[7, 3, 7]) == [3, 7]  # the lowest first
    with pytest.raises(errors.InvalidArgumentError):
        builtin.covering_members(family, 51)


def test_covering_members_of_nmt_variants_take_both_with_and_without_attention():
    # Members 0-2 all have attention: a policy trained on them sees no model without it.
    assert {builtin_families.nmt_variant_plan(seed)["attention"] for seed in range(3)} == {True}
    assert {builtin_families.nmt_variant_plan(seed)["attention"]
            for seed in builtin.covering_members("nmt-variants", 3)} == {True, False}
    with pytest.raises(errors.InvalidGraphError):
        builtin.covering_members("inception_v3", 3)


def test_nmt_variant_plans():
    # Building deep variants is slow; their structure is the plan `gnmt` gets (tested above).
    plans = [builtin_families.nmt_variant_plan(seed) for seed in range(40)]
    assert plans[7] == builtin_families.nmt_variant_plan(7)
    choices = {tuple(sorted((k, v) for k, v in plan.items() if k != "name")) for plan in plans}
    assert len(choices) > len(plans) // 2
    assert {plan["num_layers"] for plan in plans} == {2, 3, 4, 5, 6}
    assert {plan["attention"] for plan in plans} == {True, False}
    for plan in plans:
        assert 256 <= plan["units"] <= 1024
        assert (2 * plan["num_layers"] + 1) * plan["steps"] <= 48 or plan["steps"] == 3


def test_ptb_cell_is_unrolled_random_dag():
    model, _ = builtin.build("ptb-cells/2")
    rnn = model.get_layer("rnn")
    assert rnn.unroll and 20 <= model.input.shape[1] <= 35
    cell = rnn.cell
    plan = builtin_families.ptb_cells_plan(2)  # what was built, without building it
    assert (plan["steps"], plan["units"]) == (model.input.shape[1], cell.units)
    assert (plan["node_inputs"], plan["node_activations"]) == (list(cell.node_inputs), list(cell.node_activations))
    assert 3 <= len(cell.node_activations) <= 6
    assert set(cell.node_activations) <= set(builtin_families.RNN_ACTIVATIONS)
    assert all(0 <= source < i for i, source in enumerate(cell.node_inputs) if i)


def test_builds_restart_layer_names_and_keep_later_names_unique():
    before = tf.keras.layers.Dense(1)
    with builtin._fresh_layer_names():
        inside = [tf.keras.layers.Dense(1) for _ in range(3)]
    after = tf.keras.layers.Dense(1)
    assert inside[0].name == "dense"
    assert after.name not in {before.name, *(layer.name for layer in inside)}
    # ... and a build does not depend on what was built before it.
    assert structure(builtin.build("cifar10-cells/1")[0]) == structure(
        builtin.build("cifar10-cells/1")[0])


# -- every model (slow) ----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_builds_with_its_stated_memory(name):
    model, batch = builtin.build(name)
    assert batch == builtin.MODELS[name].batch_size
    assert model.optimizer is not None and model.loss is not None
    estimate = builtin.estimate_memory_bytes(model, batch) / builtin.GB
    assert estimate == pytest.approx(stated_estimate_gb(name), abs=0.051)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_imports_without_control_flow(name):
    op_graph = import_graph(f"builtin:{name}")
    if name.endswith("_loop"):  # Keras' while-loop LSTMs, on purpose: static trip counts
        assert op_graph.loops and {(loop.trips, loop.source.split(":")[0])
                                   for loop in op_graph.loops} == {(40, "static")}
    else:
        assert_no_control_flow(op_graph)
    assert 1000 < op_graph.num_ops < 60000
