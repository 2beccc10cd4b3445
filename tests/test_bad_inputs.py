"""The bad-input campaign of issue 13, as a table: every row through the API and the CLI.

A row names the defect it covers (D1..D25 of the issue; S for the smaller list and the silent
wrong answer; X for other entry points found on the way). The rules asserted (README, Errors):
- API: the typed error from tfplaceto.errors, and nothing written (no temporaries either).
- CLI: exit status 2, exactly one line on stderr starting "tfplaceto: error:", no traceback,
  nothing written at the outputs or beside them. Rows that are not errors (a graph with a lower
  bound of 0, --overwrite) exit 0 and write every output.
- Hangs (a NaN link, local:100000) run in a subprocess under a timeout, so a regression fails
  instead of stalling the suite; so does the TensorFlow-log check (the first import decides it).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto import errors, outputs
from tfplaceto.cli import main

GPU0 = "/job:localhost/replica:0/task:0/device:GPU:0"
GPU1 = "/job:localhost/replica:0/task:0/device:GPU:1"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- inputs ------------------------------------------------------------------------------------------

def _mlp_graph_def():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        w = tf.compat.v1.get_variable("w", [16, 16], use_resource=True)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(tf.matmul(x, w)), name="train")
    return graph.as_graph_def()


def _relu_graph_def():
    """Placeholder -> Relu on [8, 8]: too small for the cost model, so the lower bound is 0 (D3)."""
    graph = tf.Graph()
    with graph.as_default():
        tf.nn.relu(tf.compat.v1.placeholder(tf.float32, [8, 8], name="x"), name="y")
    return graph.as_graph_def()


class _TrainingStep(tf.Module):
    """A tf.function training step (dense layer, Adam); the module keeps its variables alive."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.random.normal([256, 256], seed=1), name="w")
        self.optimizer = tf.keras.optimizers.Adam()

    @tf.function(input_signature=[tf.TensorSpec([64, 256])])
    def step(self, x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.nn.relu(tf.matmul(x, self.w)))
        self.optimizer.apply_gradients([(tape.gradient(loss, self.w), self.w)])
        return loss


class _Module(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.ones([4, 4]), name="w")

    @tf.function(input_signature=[tf.TensorSpec([2, 4])])
    def serve(self, x):
        return {"y": tf.matmul(x, self.w)}

    @tf.function(input_signature=[])
    def constant(self):
        return {"c": tf.constant([1.0, 2.0])}


@functools.cache
def _step() -> _TrainingStep:
    # Made on first use, not at import: a variable initializes TensorFlow's devices, and other test
    # modules configure logical CPUs when they are imported.
    return _TrainingStep()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    files = {"root": str(root)}
    for name, graph_def in (("mlp", _mlp_graph_def()), ("relu", _relu_graph_def()),
                            ("shapeless", _step().step.get_concrete_function().graph.as_graph_def())):
        path = root / f"{name}.pb"
        path.write_bytes(graph_def.SerializeToString())
        files[name] = str(path)
    module = _Module()
    files["sm"] = str(root / "sm")
    tf.saved_model.save(module, files["sm"], signatures={"serving_default": module.serve})
    files["const_sm"] = str(root / "const_sm")
    tf.saved_model.save(module, files["const_sm"], signatures={"serving_default": module.constant})
    placement = tp.place(tp.import_graph(files["mlp"], batch_size=8, fetches="train"), "2xV100",
                         method="round_robin")
    files["placement"] = str(root / "placement.pb")
    placement.save(files["placement"])
    return files


def _listing(*directories: str) -> list[str]:
    """Every path under the directories, hidden ones included (temporaries would show here)."""
    found = []
    for directory in directories:
        for root, dirs, names in os.walk(directory):
            found += [os.path.join(root, n) for n in dirs + names]
    return sorted(found)


@pytest.fixture
def work(tmp_path, inputs):
    """A fresh output directory holding a plain file (for `file.txt/x` paths) and the inputs."""
    (tmp_path / "file.txt").write_text("not a directory")
    (tmp_path / "existing.pb").write_bytes(b"keep me")
    return {**inputs, "dir": str(tmp_path), "file": str(tmp_path / "file.txt"),
            "existing": str(tmp_path / "existing.pb")}


# -- the table ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Row:
    id: str
    cli: list[str] | None = None  # argv with {placeholders}; None: no CLI form
    api: Callable | None = None  # f(files) that must raise `error`; None: no API form
    error: type[Exception] = errors.TfplacetoError
    expect: str = ""  # a word the message must contain


def _place(*extra: str) -> list[str]:
    return ["place", "{mlp}", "--cluster", "2xV100", "--method", "round_robin", "--batch-size", "8",
            "--fetch", "train", "--out", "{dir}/o.pb", *extra]


def _device(**fields):
    return tp.Device(GPU0, "GPU", **{"memory_bytes": 10**9, **fields})


def _linked(bandwidth: float, latency: float):
    return tp.Cluster([_device(), tp.Device(GPU1, "GPU", 10**9)], [tp.Link(GPU0, GPU1, bandwidth, latency)])


def _mlp(f):
    return tp.import_graph(f["mlp"], batch_size=8, fetches="train")


ROWS = [
    Row("D2 batch size beyond int64", _place("--batch-size", "9223372036854775808"),
        lambda f: tp.import_graph(f["mlp"], batch_size=2**63), errors.InvalidGraphError, "batch_size"),
    Row("D4 NaN link bandwidth", None, lambda f: _linked(math.nan, 1e-6), errors.InvalidClusterError, "bandwidth"),
    Row("D4 NaN link latency", None, lambda f: _linked(1e9, math.nan), errors.InvalidClusterError, "latency"),
    Row("D5 infinite link latency", None, lambda f: _linked(1e9, math.inf), errors.InvalidClusterError, "latency"),
    Row("D6 NaN device memory", None, lambda f: tp.Cluster([_device(memory_bytes=math.nan)]),
        errors.InvalidClusterError, "memory_bytes"),
    Row("D6 infinite device memory", None, lambda f: tp.Cluster([_device(memory_bytes=math.inf)]),
        errors.InvalidClusterError, "memory_bytes"),
    Row("D6 fractional device memory", None, lambda f: tp.Cluster([_device(memory_bytes=1.5e10)]),
        errors.InvalidClusterError, "memory_bytes"),
    Row("D7 NaN memory bandwidth", None, lambda f: tp.Cluster([_device(memory_bandwidth_gbs=math.nan)]),
        errors.InvalidClusterError, "memory_bandwidth_gbs"),
    Row("D8 local:100000", _place("--cluster", "local:100000"),
        lambda f: tp.place(_mlp(f), "local:100000", method="single"), errors.InvalidClusterError, "100000"),
    Row("D9 negative budget", _place("--budget-s", "-5"),
        lambda f: tp.optimize(f["mlp"], "train", "2xV100", budget_s=-5, batch_size=8),
        errors.InvalidArgumentError, "budget_s"),
    Row("D9 NaN budget", _place("--budget-s", "nan"),
        lambda f: tp.place(_mlp(f), "2xV100", method="single", budget_s=math.nan),
        errors.InvalidArgumentError, "budget_s"),
    Row("D9 budget as a string", None,
        lambda f: tp.optimize(f["mlp"], "train", "2xV100", budget_s="10", batch_size=8),
        errors.InvalidArgumentError, "budget_s"),
    Row("D10 negative seed", _place("--method", "random", "--seed", "-1"),
        lambda f: tp.place(_mlp(f), "2xV100", method="random", seed=-1), errors.InvalidArgumentError, "seed"),
    Row("D11 existing output", _place("--out", "{existing}"), None, errors.OutputExistsError, "--overwrite"),
    Row("D12 output over the input", _place("--out", "{mlp}", "--overwrite"), None, errors.OutputExistsError,
        "input"),
    Row("D13 output under a file", _place("--out", "{file}/o.pb"), None, errors.OutputPathError, "not a directory"),
    Row("D13 output in /proc", _place("--out", "/proc/o.pb"), None, errors.OutputPathError, "/proc"),
    Row("D13 empty output", _place("--out", ""), None, errors.OutputPathError, "empty"),
    Row("D13 trace under a file", ["simulate", "{mlp}", "--cluster", "2xV100", "--placement", "{placement}",
                                   "--batch-size", "8", "--fetch", "train", "--trace", "{file}/t.json"],
        lambda f: tp.simulate(_mlp(f), tp.Placement.load(f["placement"]), "2xV100").save_chrome_trace(
            f["file"] + "/t.json"), errors.OutputPathError, "not a directory"),
    Row("D14 a later output fails: the earlier is not written",
        _place("--trace", "{dir}/ok.json", "--placement-out", "{file}/p.pb"), None, errors.OutputPathError,
        "--placement-out"),
    Row("D15 DST in /proc", ["rewrite-saved-model", "{sm}", "/proc/dst", "--cluster", "2xV100", "--method",
                             "single"],
        lambda f: tp.saved_model.rewrite(f["sm"], "/proc/dst", "2xV100", method="single"),
        errors.OutputPathError, "/proc"),
    Row("D17 a policy directory that does not exist", _place("--method", "placeto_policy", "--policy", "{dir}/none"),
        lambda f: tp.place(_mlp(f), "2xV100", method="placeto_policy", policy=f["dir"] + "/none"),
        errors.PolicyError, "no policy"),
    Row("D17 a corrupted policy directory", _place("--method", "placeto_policy", "--policy", "{dir}"),
        lambda f: tp.place(_mlp(f), "2xV100", method="placeto_policy", policy=f["dir"]), errors.PolicyError,
        "policy"),
    Row("D20 no family members", ["train", "--family", "cifar10-cells", "--num-graphs", "0", "--cluster", "2xK80",
                                  "--episodes", "2", "--logdir", "{dir}/run"], None, errors.TfplacetoError,
        "num-graphs"),
    Row("D20 an empty family list", ["train", "--family", ",,", "--cluster", "2xK80", "--episodes", "2",
                                     "--logdir", "{dir}/run"], None, errors.TfplacetoError, "family"),
    Row("D21 logdir is a file", ["train", "--graph", "builtin:ptb-cells/0", "--cluster", "2xK80", "--episodes", "2",
                                 "--logdir", "{file}"], None, errors.CheckpointError, "logdir"),
    Row("D22 no episodes", ["train", "--graph", "{mlp}", "--cluster", "2xK80", "--episodes", "0",
                            "--logdir", "{dir}/run"],
        lambda f: tp.train([f["mlp"]], ["2xK80"], episodes=0, logdir=None), errors.TfplacetoError, "episodes"),
    Row("D23 unknown bench method", ["bench", "--graphs", "{mlp}", "--methods", "telepathy", "--out",
                                     "{dir}/b.json"],
        lambda f: tp.bench.run_bench([f["mlp"]], ["2xV100"], ["telepathy"]), errors.InvalidMethodError,
        "telepathy"),
    Row("D25 log_dir is a file", None, lambda f: tp.keras.PlacementCallback("local:2", log_dir=f["file"]),
        errors.OutputPathError, "log_dir"),
    Row("S fetch of an output the op lacks", _place("--fetch", "train:5"),
        lambda f: tp.import_graph(f["mlp"], batch_size=8, fetches="train:5"), errors.InvalidGraphError, "output"),
    Row("S batch_size=True", None, lambda f: tp.import_graph(f["mlp"], batch_size=True),
        errors.InvalidGraphError, "batch_size"),
    Row("S bench checks clusters before importing", ["bench", "--graphs", "{mlp}", "--clusters", "3xV100",
                                                     "--out", "{dir}/b.json"],
        lambda f: tp.bench.run_bench([f["mlp"]], ["3xV100"], ["single"]), errors.InvalidClusterError, "3xV100"),
    Row("X bench with an unknown built-in graph", ["bench", "--graphs", "no_such_model", "--out", "{dir}/b.json"],
        lambda f: tp.bench.run_bench(["no_such_model"], ["2xV100"], ["single"]), errors.InvalidGraphError,
        "no_such_model"),
    Row("X two outputs at one path", _place("--report", "{dir}/o.pb"), None, errors.OutputExistsError, "same file"),
    Row("X output is a directory", _place("--out", "{dir}"), None, errors.OutputPathError, "directory"),
    Row("X existing simulate output", ["simulate", "{mlp}", "--cluster", "2xV100", "--placement", "{placement}",
                                       "--batch-size", "8", "--fetch", "train", "--gantt", "{existing}"],
        None, errors.OutputExistsError, "--overwrite"),
    Row("X existing bench output", ["bench", "--graphs", "{mlp}", "--out", "{existing}"], None,
        errors.OutputExistsError, "--overwrite"),
    Row("X non-empty DST", ["rewrite-saved-model", "{sm}", "{dir}", "--cluster", "2xV100"],
        lambda f: tp.saved_model.rewrite(f["sm"], f["dir"], "2xV100"), errors.OutputExistsError, "overwrite"),
    Row("X empty DST", ["rewrite-saved-model", "{sm}", "", "--cluster", "2xV100"],
        lambda f: tp.saved_model.rewrite(f["sm"], "", "2xV100"), errors.OutputPathError, "empty"),
    Row("X seed beyond 32 bits", _place("--seed", "4294967296"),
        lambda f: tp.place(_mlp(f), "2xV100", method="random", seed=2**32), errors.InvalidArgumentError, "seed"),
    Row("X infinite budget", _place("--budget-s", "inf"),
        lambda f: tp.saved_model.rewrite(f["sm"], f["dir"] + "/new", "2xV100", budget_s=math.inf),
        errors.InvalidArgumentError, "budget_s"),
    Row("X zero streams", None, lambda f: tp.Cluster([_device(streams=0)]), errors.InvalidClusterError, "streams"),
    Row("X a link of zero bandwidth", None, lambda f: _linked(0.0, 1e-6), errors.InvalidClusterError, "bandwidth"),
    Row("X a placement saved under a file", None,
        lambda f: tp.Placement({}).save(f["file"] + "/p.pb"), errors.OutputPathError, "file.txt"),
    Row("X LocalTFCluster of a million tasks", None, lambda f: tp.LocalTFCluster(10**6),
        errors.InvalidClusterError, "n_tasks"),
    Row("X measure with runs=True", None, lambda f: tp.measure(_mlp(f), {}, runs=True),
        errors.InvalidArgumentError, "runs"),
    Row("X apply_placement to a non-device", None,
        lambda f: tp.apply_placement(_mlp(f).graph_def, {n: "garbage" for n in _mlp(f).names}),
        errors.InvalidClusterError, "garbage"),
    Row("X group into 0 groups", None, lambda f: tp.group(_mlp(f), 0), errors.InvalidArgumentError, "max_groups"),
    Row("X PlacementCallback with a bad seed", None, lambda f: tp.keras.PlacementCallback("local:2", seed=-3),
        errors.InvalidArgumentError, "seed"),
]


def _format(argv: list[str], files: dict) -> list[str]:
    return [arg.format(**files) for arg in argv]


@pytest.mark.parametrize("row", [r for r in ROWS if r.api is not None], ids=lambda r: r.id)
def test_api_raises_the_typed_error_and_writes_nothing(row, work):
    before = _listing(work["dir"], work["root"])
    with pytest.raises(row.error, match=None) as caught:
        row.api(work)
    assert row.expect in str(caught.value), str(caught.value)
    assert _listing(work["dir"], work["root"]) == before


@pytest.mark.parametrize("row", [r for r in ROWS if r.cli is not None], ids=lambda r: r.id)
def test_cli_exits_2_with_one_line_and_writes_nothing(row, work, capsys):
    before = _listing(work["dir"], work["root"])
    assert main(_format(row.cli, work)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("tfplaceto: error:") and "Traceback" not in err
    assert row.expect in err, err
    assert _listing(work["dir"], work["root"]) == before
    with open(work["existing"], "rb") as file:
        assert file.read() == b"keep me"


# -- rows that must succeed ----------------------------------------------------------------------------

def test_d3_zero_lower_bound_is_reported_not_divided(work, capsys):
    out, report = os.path.join(work["dir"], "o.pb"), os.path.join(work["dir"], "r.json")
    assert main(["place", work["relu"], "--cluster", "2xV100", "--out", out, "--report", report]) == 0
    table = capsys.readouterr().out
    assert json.load(open(report))["lower_bound_s"] == 0.0
    assert "lower bound 0.000 ms" in table and os.path.getsize(out) > 0
    assert main(["bench", "--graphs", work["relu"], "--clusters", "2xV100", "--methods", "single",
                 "--out", os.path.join(work["dir"], "b.json")]) == 0
    dst = os.path.join(work["dir"], "placed")
    assert main(["rewrite-saved-model", work["const_sm"], dst, "--cluster", "2xV100", "--method", "single"]) == 0
    assert os.path.isfile(os.path.join(dst, "saved_model.pb"))


def test_d11_overwrite_replaces_outputs_and_dst(work, capsys):
    assert main(_format(_place("--out", "{existing}", "--overwrite"), work)) == 0
    assert tf.compat.v1.GraphDef.FromString(open(work["existing"], "rb").read()).node
    dst = os.path.join(work["dir"], "dst")
    os.makedirs(os.path.join(dst, "old"))
    assert main(["rewrite-saved-model", work["sm"], dst, "--cluster", "2xV100", "--method", "single",
                 "--overwrite"]) == 0
    assert not os.path.exists(os.path.join(dst, "old"))
    assert tf.saved_model.load(dst).signatures["serving_default"](x=tf.ones([2, 4]))["y"].shape == (2, 4)
    leftovers = [n for n in os.listdir(work["dir"]) if n.startswith(outputs.TMP_PREFIX)]
    assert not leftovers


def test_ctrl_c_while_writing_leaves_nothing(work, capsys, monkeypatch):
    real = outputs.atomic_write

    def interrupted(path, data):
        if path.endswith("-o.pb"):  # the staged --out, written after the report and the trace
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(outputs, "atomic_write", interrupted)
    before = _listing(work["dir"], work["root"])
    assert main(_format(_place("--trace", "{dir}/t.json", "--report", "{dir}/r.json"), work)) == 130
    assert capsys.readouterr().err == "tfplaceto: interrupted\n"
    assert _listing(work["dir"], work["root"]) == before


def test_d24_ctrl_c_inside_the_compiled_simulator_is_an_interruption(work, capsys, monkeypatch):
    # numba re-raises a Ctrl-C that arrives in compiled code as a SystemError (its context: the
    # KeyboardInterrupt); the search spends most of its time there.
    import importlib

    place = importlib.import_module("tfplaceto.place")  # the module (tp.place is the function)

    def interrupted(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise SystemError("<built-in function simulate_step> returned a result with an exception set") from None

    monkeypatch.setattr(place, "place_problem", interrupted)
    before = _listing(work["dir"], work["root"])
    assert main(_format(_place(), work)) == 130
    assert capsys.readouterr().err == "tfplaceto: interrupted\n"
    assert _listing(work["dir"], work["root"]) == before


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_d16_temporaries_of_a_killed_run_are_removed_by_the_next(work, capsys):
    pid = _dead_pid()
    stale_dir = os.path.join(work["dir"], f"{outputs.TMP_PREFIX}{pid}-abc")
    os.makedirs(os.path.join(stale_dir, "variables"))  # a half-copied SavedModel
    stale_file = os.path.join(work["dir"], f"{outputs.TMP_PREFIX}{pid}-def-o.pb")
    open(stale_file, "wb").close()
    live = os.path.join(work["dir"], f"{outputs.TMP_PREFIX}{os.getpid()}-ghi")  # ours, still running
    os.makedirs(live)
    dst = os.path.join(work["dir"], "dst")
    assert main(["rewrite-saved-model", work["sm"], dst, "--cluster", "2xV100", "--method", "single"]) == 0
    assert not os.path.exists(stale_dir) and not os.path.exists(stale_file) and os.path.isdir(live)


def test_silent_wrong_answer_is_now_a_warning_and_a_figure(work, capsys):
    with pytest.warns(errors.UnknownShapesWarning, match="compute ops have unknown shapes"):
        result = tp.optimize(tp.import_graph(work["shapeless"]), cluster="2xV100", method="single")
    shapes = result.unknown_shapes
    assert shapes.ops > 0.5 * shapes.compute_ops and result.summary()["unknown_shapes"]["ops"] == shapes.ops
    # The same step from a source that knows its variables: shapes inferred, no warning.
    function = _step().step.get_concrete_function()
    for source in (function, function.graph):
        known = tp.optimize(source, cluster="2xV100", method="single")
        assert known.unknown_shapes.ops == 0
        # Guessed costs understate this step (7.08 us known, 3.19 us shapeless when written).
        assert known.lower_bound_s > 1.5 * result.lower_bound_s
    report = os.path.join(work["dir"], "r.json")
    assert main(["place", work["shapeless"], "--cluster", "2xV100", "--method", "single",
                 "--out", os.path.join(work["dir"], "o.pb"), "--report", report]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tfplaceto: warning:") and "ConcreteFunction" in err[0]
    assert json.load(open(report))["unknown_shapes"]["ops"] == shapes.ops


def test_small_sizes_in_unplaceable_messages(work):
    cluster = tp.Cluster([_device(memory_bytes=1000, peak_gflops=1000.0)])
    with pytest.raises(errors.UnplaceableError, match=r"1\.00 KiB.*1000 B"):
        tp.place(_mlp(work), cluster, method="single")


def test_simulator_refuses_a_nan_link_that_bypassed_validation(work):
    cluster = tp.Cluster.preset("2xV100")
    latency = cluster.latency.copy()
    latency[0, 1] = math.nan
    cluster.latency = latency
    op_graph = _mlp(work)
    with pytest.raises(errors.InvalidClusterError, match="NaN"):
        tp.sim.Simulator(op_graph, cluster, tp.profile(op_graph, "2xV100"))


# -- hangs and TensorFlow's log lines: in a subprocess, under a timeout ---------------------------------

def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_d1_cli_error_is_one_line_without_tensorflow_logs(work):
    garbage = os.path.join(work["dir"], "garbage.pb")
    with open(garbage, "wb") as file:
        file.write(b"\x00 not a graph")
    result = _run(["-m", "tfplaceto", "place", garbage, "--cluster", "2xV100", "--out",
                   os.path.join(work["dir"], "o.pb")])
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("tfplaceto: error:")


def test_help_and_usage_errors_do_not_load_tensorflow():
    code = ("import sys\nfrom tfplaceto.cli import main\n"
            "for argv in (['--help'], ['place'], ['place', 'g.pb', '--cluster', 'x', '--out', 'o', '--seed', 'q']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n")
    result = _run(["-c", code], timeout=60)
    assert result.returncode == 0, result.stderr


def test_d4_d8_no_hang_on_a_nan_link_or_a_huge_local_cluster(work):
    code = (f"import math, tfplaceto as tp\n"
            f"for make in (lambda: tp.Cluster([tp.Device('{GPU0}', 'GPU', 10**9), tp.Device('{GPU1}', 'GPU', 10**9)],"
            f" [tp.Link('{GPU0}', '{GPU1}', math.nan, 1e-6)]), lambda: tp.cluster.as_cluster('local:100000')):\n"
            f"    try:\n        tp.optimize({work['mlp']!r}, 'train', make(), method='single', batch_size=8)\n"
            f"    except tp.errors.InvalidClusterError:\n        pass\n"
            f"    else:\n        raise SystemExit('accepted')\n")
    assert _run(["-c", code], timeout=120).returncode == 0
    result = _run(["-m", "tfplaceto", *_format(_place("--cluster", "local:100000"), work)], timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr


def test_the_readme_lists_the_rules():
    readme = open(os.path.join(ROOT, "README.md")).read()
    section = readme.split("## Errors", 1)[1].split("\n## ", 1)[0]
    for word in ("OutputPathError", "InvalidArgumentError", "--overwrite", "exit", "130", "UnknownShapesWarning"):
        assert word in section, word


def test_stale_temporaries_only_of_dead_processes(tmp_path):
    mine = tmp_path / f"{outputs.TMP_PREFIX}{os.getpid()}-x"
    dead = tmp_path / f"{outputs.TMP_PREFIX}{_dead_pid()}-y"
    other = tmp_path / ".tmp-someone-else"
    for path in (mine, dead, other):
        path.write_bytes(b"")
    assert outputs.remove_stale_temporaries(tmp_path) == [str(dead)]
    assert mine.exists() and other.exists()
    shutil.rmtree(tmp_path)


def test_atomic_directory_replaces_whole_or_not_at_all(tmp_path, monkeypatch):
    target = tmp_path / "out" / "policy"
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    with outputs.atomic_directory(target) as tmp:
        assert not target.exists()  # nothing at the destination before the end
        with open(os.path.join(tmp, "a.txt"), "w") as f:
            f.write("first")
    assert sorted(os.listdir(target)) == ["a.txt"] and synced  # files and directories synced
    with pytest.raises(KeyboardInterrupt), outputs.atomic_directory(target) as tmp:
        with open(os.path.join(tmp, "b.txt"), "w") as f:
            f.write("half")
        raise KeyboardInterrupt
    assert sorted(os.listdir(target)) == ["a.txt"]  # the old directory, untouched
    with outputs.atomic_directory(target) as tmp:
        with open(os.path.join(tmp, "b.txt"), "w") as f:
            f.write("second")
    assert sorted(os.listdir(target)) == ["b.txt"]
    assert sorted(os.listdir(tmp_path / "out")) == ["policy"]  # no temporaries left
    with pytest.raises(errors.OutputPathError, match="cannot write"), \
            outputs.atomic_directory(target) as tmp:
        raise PermissionError(13, "Permission denied")
    assert sorted(os.listdir(target)) == ["b.txt"]
