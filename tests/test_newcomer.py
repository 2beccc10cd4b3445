"""What a new user hits first (issue 14): the README's order, batch sizes, named methods, files
that `place` writes being accepted by `simulate`, fast answers, readable placements.

CLI cases go through the real entry point (`tfplaceto.cli.main`, or `python -m tfplaceto` in a
subprocess where the process state matters: TensorFlow not imported, devices not yet created).
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto import errors
from tfplaceto.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_cnn(name: str = "cnn") -> tf.keras.Model:
    """A compiled CNN whose input has an unknown batch dimension (weights seeded)."""
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((16, 16, 3), name="images")
    x = tf.keras.layers.Conv2D(8, 3, activation="relu", name="conv")(inputs)
    x = tf.keras.layers.Conv2D(8, 3, activation="relu", name="conv2")(x)
    x = tf.keras.layers.GlobalAveragePooling2D(name="pool")(x)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(4, name="logits")(x), name=name)
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _run(args: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": REPO, **(env or {})})


@pytest.fixture(scope="module")
def files(tmp_path_factory, write_mlp_graph):
    """A Keras file, a SavedModel and a TF1 .pb with a [None, 64] input and a train op."""
    root = tmp_path_factory.mktemp("newcomer")
    model = small_cnn()
    model.save(str(root / "cnn.keras"))
    tf.saved_model.save(model, str(root / "exported"))
    write_mlp_graph(root / "model.pb", train_op="train_op")
    return {"root": root, "keras": str(root / "cnn.keras"), "saved_model": str(root / "exported"),
            "pb": str(root / "model.pb")}


# -- 1. the Keras snippet in the natural order ---------------------------------------------------

def test_model_built_first_then_local_n_callback_says_in_one_line_what_to_call_first():
    code = ("import tensorflow as tf, tfplaceto as tp\n"
            "model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])\n"
            "try:\n"
            "    tp.keras.PlacementCallback('local:2')\n"
            "except tp.errors.InvalidClusterError as e:\n"
            "    print('ERROR', e)\n")
    out = _run(["-c", code]).stdout.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("ERROR call tfplaceto.keras.ensure_devices('local:2') first"), out


def test_ensure_devices_first_then_model_then_callback_works():
    code = ("import numpy as np, tensorflow as tf, tfplaceto as tp\n"
            "tp.keras.ensure_devices('local:2')\n"
            "model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])\n"
            "model.compile('sgd', 'mse')\n"
            "cb = tp.keras.PlacementCallback('local:2', method='round_robin', costs='analytical', verbose=0)\n"
            "model.fit(np.zeros((8, 4), 'f'), np.zeros((8, 2), 'f'), batch_size=4, verbose=0, callbacks=[cb])\n"
            "print('DEVICES', sorted(set(cb.assigned_devices.values())))\n")
    result = _run(["-c", code])
    assert "DEVICES" in result.stdout and "CPU:1" in result.stdout, result.stderr[-2000:]


def test_a_remote_tasks_missing_cpu_is_not_a_local_n_problem():
    remote = tp.Cluster([tp.Device("/job:worker/replica:0/task:1/device:CPU:0", "CPU", 2**30, peak_gflops=10.0)])
    with pytest.raises(errors.InvalidClusterError, match="does not have the devices"):
        tp.keras.ensure_devices(remote)


# -- 2. unknown batch size: one rule everywhere --------------------------------------------------

def test_import_and_optimize_of_a_keras_model_need_batch_size_and_say_so():
    model = small_cnn()
    for call in (lambda: tp.import_graph(model), lambda: tp.optimize(model, cluster="2xV100", method="single")):
        with pytest.raises(errors.InvalidGraphError, match=r"batch_size=N \(--batch-size N"):
            call()
    assert tp.import_graph(model, batch_size=4).num_ops > 0


@pytest.mark.parametrize("command", ["place", "rewrite-saved-model", "simulate"])
def test_cli_unknown_batch_is_an_error_naming_batch_size(files, tmp_path, capsys, command):
    out = tmp_path / "out"
    args = {"place": ["place", files["saved_model"], "--cluster", "2xV100", "--out", str(out)],
            "rewrite-saved-model": ["rewrite-saved-model", files["saved_model"], str(out), "--cluster", "2xV100"],
            "simulate": ["simulate", files["saved_model"], "--cluster", "2xV100", "--placement", files["pb"]]}
    assert main([*args[command], "--method", "single"] if command != "simulate" else args[command]) == 2
    err = capsys.readouterr().err
    assert "--batch-size" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_rewrite_with_batch_size_places_for_that_batch(files, tmp_path):
    result = tp.saved_model.rewrite(files["saved_model"], str(tmp_path / "placed"), "2xV100", method="single",
                                    batch_size=4)
    assert _image_batches(result.op_graph) == {4}


def _image_batches(op_graph) -> set[int]:
    """The leading dimension of every 4-d placeholder (the images) of an imported graph."""
    shapes = [[d.size for d in n.attr["shape"].shape.dim] for n in op_graph.graph_def.node if n.op == "Placeholder"]
    return {shape[0] for shape in shapes if len(shape) == 4}


def test_callback_places_for_the_batch_fit_uses():
    model = small_cnn("fit_batch")
    callback = tp.keras.PlacementCallback("local", method="single", costs="analytical", verbose=0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(24, 16, 16, 3)).astype("float32"), rng.integers(0, 4, 24)
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=[callback])
    assert callback.placed_batch_size == 8
    assert _image_batches(callback.result.op_graph) == {8}
    assert len(history.history["loss"]) == 2 and len(callback.step_times_s) == 6  # every batch trained
    # Another fit with another batch size places again, for that one.
    model.fit(x, y, batch_size=12, epochs=1, verbose=0, callbacks=[callback])
    assert callback.placed_batch_size == 12 and len(callback.step_times_s) == 2


def test_callback_trains_the_same_as_without_it():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(16, 16, 16, 3)).astype("float32"), rng.integers(0, 4, 16)
    placed, plain = small_cnn("placed_same"), small_cnn("plain_same")
    callback = tp.keras.PlacementCallback("local", method="single", costs="analytical", verbose=0)
    a = placed.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[callback]).history["loss"]
    b = plain.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
    np.testing.assert_allclose(a, b, rtol=1e-5)


# -- 3. a method named is the method used -------------------------------------------------------

@pytest.mark.parametrize("method", ["single", "m_sct"])
def test_named_method_is_honoured_and_the_baselines_are_shown(files, tmp_path, capsys, method):
    out = tmp_path / "placed.pb"
    assert main(["place", files["pb"], "--cluster", "2xK80", "--fetch", "train_op", "--batch-size", "64",
                 "--method", method, "--out", str(out)]) == 0
    table = capsys.readouterr().out
    chosen = [line for line in table.splitlines() if "<- chosen" in line]
    assert len(chosen) == 1 and chosen[0].split()[0] == method, table
    assert "m_etf" in table  # the others' figures beside it
    op_graph = tp.import_graph(files["pb"], fetches="train_op", batch_size=64)
    result = tp.optimize(op_graph, cluster="2xK80", method=method)
    assert result.method_used == method
    expected = tp.place(op_graph, "2xK80", method=method)
    assert dict(result.placement) == dict(expected)


def test_default_and_auto_stay_best_of():
    op_graph = tp.import_graph("builtin:cifar10-cells/0", batch_size=8)
    auto = tp.optimize(op_graph, cluster="2xV100", method="auto")
    assert auto.step_time_s == min(auto.baselines.values())


# -- 4. simulate takes what place writes --------------------------------------------------------

def test_simulate_accepts_the_placed_graph_def_and_the_placement_proto(files, tmp_path, capsys):
    out, proto = tmp_path / "placed.pb", tmp_path / "placement.pb"
    common = ["--cluster", "2xK80", "--fetch", "train_op", "--batch-size", "64"]
    assert main(["place", files["pb"], *common, "--method", "m_etf", "--out", str(out),
                 "--placement-out", str(proto)]) == 0
    capsys.readouterr()
    assert main(["simulate", files["pb"], *common, "--placement", str(out)]) == 0
    from_graph = capsys.readouterr().out
    assert main(["simulate", files["pb"], *common, "--placement", str(proto)]) == 0
    assert capsys.readouterr().out == from_graph
    assert "GiB" in from_graph or "MiB" in from_graph or "KiB" in from_graph
    assert " MB " not in from_graph and " GB " not in from_graph
    # A text GraphDef written by `place --out placed.pbtxt` too.
    text = tmp_path / "placed.pbtxt"
    assert main(["place", files["pb"], *common, "--method", "m_etf", "--out", str(text)]) == 0
    capsys.readouterr()
    assert main(["simulate", files["pb"], *common, "--placement", str(text)]) == 0
    assert capsys.readouterr().out == from_graph


def test_simulate_with_an_unplaced_file_says_which_kinds_it_takes(files, capsys):
    assert main(["simulate", files["pb"], "--cluster", "2xK80", "--fetch", "train_op", "--batch-size", "64",
                 "--placement", files["pb"]]) == 2
    err = capsys.readouterr().err
    assert "Placement proto" in err and "place --out" in err, err


# -- 5. fast answers, progress ------------------------------------------------------------------

def test_help_and_version_answer_without_tensorflow():
    for argv in (["--help"], ["--version"], ["place", "--help"], ["simulate", "--help"]):
        code = ("import sys\nfrom tfplaceto.cli import main\n"
                f"try:\n    main({argv!r})\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
                "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n")
        result = _run(["-c", code], timeout=60)
        assert result.returncode == 0 and result.stderr == "", (argv, result.stderr)
    begin = time.perf_counter()
    result = _run(["-m", "tfplaceto", "--version"], timeout=60)
    assert result.stdout.strip() == f"tfplaceto {tp.__version__}" and time.perf_counter() - begin < 10


def test_progress_lines_on_stderr_when_asked_and_not_otherwise(files, tmp_path, capsys, monkeypatch):
    args = ["place", files["pb"], "--cluster", "2xK80", "--fetch", "train_op", "--batch-size", "8",
            "--method", "random", "--out"]
    monkeypatch.setenv("TFPLACETO_PROGRESS", "1")
    assert main([*args, str(tmp_path / "a.pb")]) == 0
    err = capsys.readouterr().err
    stages = [line for line in err.splitlines() if line.startswith("tfplaceto: [")]
    assert [s.split("] ")[1].split()[0] for s in stages] == ["importing", "profiling", "baselines:", "method"], err
    monkeypatch.delenv("TFPLACETO_PROGRESS")  # pytest's stderr is not a terminal: quiet
    assert main([*args, str(tmp_path / "b.pb")]) == 0
    assert "tfplaceto: [" not in capsys.readouterr().err


# -- 6. bench, .keras, help ---------------------------------------------------------------------

def test_bench_labels_built_in_family_members_by_name():
    from tfplaceto import bench

    rows = [bench.BenchRow(graph, "2xK80", "single", 1e-3, 5e-4, False, {}, 0.1)
            for graph in ("cifar10-cells/1", "builtin:ptb-cells/2", "inception_v3", "/some/dir/model.pb")]
    labels = [line.split()[0] for line in bench.format_table(rows).splitlines()[2:]]
    assert labels == ["cifar10-cells/1", "ptb-cells/2", "inception_v3", "model"]


def test_bench_takes_batch_size_and_fetch_for_a_graph_file(files, tmp_path, capsys):
    out = tmp_path / "bench.json"
    base = ["bench", "--graphs", files["pb"], "--clusters", "2xK80", "--methods", "single", "m_etf",
            "--out", str(out)]
    assert main(base) == 2 and "--batch-size" in capsys.readouterr().err and not out.exists()
    assert main([*base, "--batch-size", "16", "--fetch", "train_op"]) == 0
    rows = json.loads(out.read_text())
    assert [r["method"] for r in rows] == ["single", "m_etf"] and all(r["step_time_s"] > 0 for r in rows)
    assert capsys.readouterr().out.splitlines()[2].startswith("model ")


def test_place_a_keras_file(files, tmp_path, capsys):
    out = tmp_path / "placed.pb"
    assert main(["place", files["keras"], "--cluster", "2xV100", "--batch-size", "8", "--method", "m_etf",
                 "--out", str(out)]) == 0
    placed = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    assert any("gradient" in n.name.lower() for n in placed.node)  # compiled when saved: its training step
    assert all(n.device for n in placed.node)
    bad = tmp_path / "broken.keras"
    bad.write_bytes(b"not a zip")
    assert main(["place", str(bad), "--cluster", "2xV100", "--batch-size", "8", "--out", str(out),
                 "--overwrite"]) == 2
    assert "cannot load the Keras model" in capsys.readouterr().err


def test_every_option_has_help_and_defaults_are_shown():
    from tfplaceto import cli

    parser = cli._parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, sub in commands.items():
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
    place_help = commands["place"].format_help()
    assert "(default: placeto)" in place_help and "(default: 0)" in place_help


# -- 8. memory in one unit system, per device in report.json, Gantt legend -------------------------

def test_report_has_peak_memory_per_device_and_explain_prints_layers(files, tmp_path, capsys):
    out, report = tmp_path / "placed.pb", tmp_path / "report.json"
    assert main(["place", files["keras"], "--cluster", "2xV100", "--batch-size", "8", "--method", "round_robin",
                 "--out", str(out), "--report", str(report), "--explain"]) == 0
    text = capsys.readouterr().out
    memory = json.loads(report.read_text())["memory"]
    assert set(memory) == set(tp.Cluster.preset("2xV100").device_names)
    for figures in memory.values():
        assert figures["peak_gib"] == round(figures["peak_bytes"] / 2**30, 4) and figures["limit_bytes"] > 0
    assert sum(f["peak_bytes"] for f in memory.values()) > 0
    header = next(line for line in text.splitlines() if line.startswith("layer "))
    assert "device" in header and "compute ms" in header
    for layer in ("cnn/conv", "cnn/conv2", "cnn/logits"):
        assert any(line.startswith(layer + " ") for line in text.splitlines()), text
    assert "peak memory per device" in text


def test_device_scopes_map_layers_to_cluster_devices():
    model = small_cnn("scoped")
    result = tp.optimize(model, cluster="2xV100", method="round_robin", batch_size=8)
    scopes = result.device_scopes()
    devices = set(tp.Cluster.preset("2xV100").device_names)
    assert {"scoped/conv", "scoped/conv2", "scoped/pool", "scoped/logits"} <= set(scopes)
    assert set(scopes.values()) <= devices
    assert "scoped/conv" in result.explain()
    with tf.Graph().as_default():  # usable as written in the README
        with tf.device(scopes["scoped/conv"]):
            op = tf.constant(1.0)
        assert op.device == scopes["scoped/conv"]


def test_gantt_legend_explains_colours_and_uses_binary_units(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    op_graph = tp.import_graph("builtin:cifar10-cells/0", batch_size=8)
    sim = tp.simulate(op_graph, tp.place(op_graph, "2xV100", method="round_robin"), "2xV100")
    texts = []
    savefig = Figure.savefig

    def capture(self, *args, **kwargs):
        for ax in self.axes:
            legend = ax.get_legend()
            texts.extend(t.get_text() for t in legend.get_texts())
            texts.append(ax.get_title())
        return savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", capture)
    sim.plot_gantt(str(tmp_path / "g.png"))
    joined = "\n".join(texts)
    assert "coloured by" in joined and "producer's colour" in joined
    peak = errors.format_bytes(max(sim.peak_memory_bytes.values()))
    assert peak in joined and " GB" not in joined and " MB" not in joined


def test_progress_is_on_for_a_terminal_unless_turned_off(monkeypatch):
    from tfplaceto import progress

    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    monkeypatch.delenv(progress.ENV, raising=False)
    assert progress.wanted(Stream(True)) and not progress.wanted(Stream(False))
    monkeypatch.setenv(progress.ENV, "0")
    assert not progress.wanted(Stream(True))
    monkeypatch.setenv(progress.ENV, "1")
    assert progress.wanted(Stream(False))

