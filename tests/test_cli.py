"""The command line: placing a graph file, and one clear line + exit 2 for every kind of bad input."""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto.cli import _parser, _train_sources, main
from tfplaceto.graph.builtin import covering_members


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory, write_mlp_graph):
    return write_mlp_graph(tmp_path_factory.mktemp("graphs") / "mlp.pb", train_op="train")


def _place_args(graph_file, out, *extra):
    return ["place", graph_file, "--cluster", "2xV100", "--method", "round_robin", "--batch-size", "8",
            "--fetch", "train", "--out", str(out), *extra]


def test_place_writes_a_graph_with_every_device_set(graph_file, tmp_path, capsys):
    out = tmp_path / "placed.pb"
    report = tmp_path / "report.json"
    placement = tmp_path / "placement.pb"
    assert main(_place_args(graph_file, out, "--report", str(report), "--placement-out", str(placement))) == 0
    placed = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    devices = {n.device for n in placed.node}
    assert all(devices) and devices <= set(tp.Cluster.preset("2xV100").device_names)
    assert "lower bound" in capsys.readouterr().out
    assert report.stat().st_size > 0
    assert len(tp.Placement.load(placement)) > 0


def test_place_lists_placements_that_do_not_fit_after_those_that_do(graph_file, tmp_path, capsys):
    from conftest import with_gpu_memory

    op_graph = tp.import_graph(graph_file, fetches=["train"], batch_size=512)
    preset = tp.Cluster.preset("2xV100")
    one_device = max(tp.simulate(op_graph, tp.place(op_graph, preset, method="single"), preset).peak_memory_bytes.values())
    small = with_gpu_memory("2xV100", 0.75 * one_device)
    small.save(str(tmp_path / "small.pbtxt"))
    report = tmp_path / "report.json"
    args = ["place", graph_file, "--cluster", str(tmp_path / "small.pbtxt"), "--method", "m_etf", "--batch-size",
            "512", "--fetch", "train", "--out", str(tmp_path / "placed.pb"), "--report", str(report)]
    assert main(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.split()[:1] in (["single"], ["m_etf"])]
    summary = json.loads(report.read_text())
    assert "single" in summary["out_of_memory"] and "m_etf" not in summary["out_of_memory"]
    assert [line.split()[0] for line in lines] == ["m_etf", "single"]  # fitting first, whatever the step time
    assert lines[1].endswith("out of memory") and "out of memory" not in lines[0]


BAD_INPUTS = {
    "unknown cluster": (["--cluster", "3xV100"], "3xV100"),
    "unknown method": (["--method", "telepathy"], "telepathy"),
    "missing fetch": (["--fetch", "nope"], "nope"),
    "no batch size": (["--batch-size", "0"], "batch_size"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_nothing_written(graph_file, tmp_path, capsys, case):
    extra, expected = BAD_INPUTS[case]
    out = tmp_path / "placed.pb"
    args = _place_args(graph_file, out)
    for flag, value in zip(extra[::2], extra[1::2]):
        args[args.index(flag) + 1] = value
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err and "Traceback" not in err
    assert not out.exists() and not os.listdir(tmp_path)


def test_garbage_and_missing_sources(tmp_path, capsys):
    garbage = tmp_path / "garbage.pb"
    garbage.write_bytes(b"\x00not a graph at all")
    for source in (str(garbage), str(tmp_path / "missing.pb"), "builtin:no_such_model"):
        out = tmp_path / "out.pb"
        assert main(["place", source, "--cluster", "2xV100", "--out", str(out)]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
        assert not out.exists()


def test_usage_errors_are_one_line_too(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["place"])
    assert exit_info.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_installed_entry_point_runs(graph_file, tmp_path):
    out = tmp_path / "placed.pbtxt"
    result = subprocess.run([sys.executable, "-m", "tfplaceto", *_place_args(graph_file, out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert out.read_text().count("device:") > 10


def test_train_runs_a_few_episodes_and_exports_a_policy(tmp_path, capsys, monkeypatch):
    logdir = tmp_path / "run"
    monkeypatch.chdir(tmp_path)  # the packaged gin file is named as in the README, from anywhere
    assert main(["train", "--family", "cifar10-cells", "--cluster", "2xK80", "--logdir", str(logdir),
                 "--episodes", "2", "--num-graphs", "1", "--gin", "tfplaceto/policy/train.gin",
                 "--gin-param", "train.lanes = 2", "--select-members", "5"]) == 0
    assert (logdir / "policy" / "policy.json").exists()
    assert "train.exploration = 0.01" in (logdir / "operative_config.gin").read_text()
    capsys.readouterr()
    assert main(["train", "--family", "no-such-family", "--cluster", "2xK80", "--logdir", str(tmp_path / "x"),
                 "--episodes", "1"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    # Model selection on members trained on (0 .. num-graphs - 1, or those --members cover picks:
    # nmt-variants 0, 1 and 5), or on no family: refused.
    for bad in (["--family", "cifar10-cells", "--select-members", "0"], ["--family", "cifar10-cells",
                "--select-members", "x"], ["--graph", "builtin:inception_v3", "--select-members", "5"],
                ["--family", "ptb-cells,nmt-variants", "--members", "cover", "--select-members", "5"]):
        assert main(["train", *bad, "--cluster", "2xK80", "--logdir", str(tmp_path / "y"), "--episodes", "1"]) == 2
        assert "--select-members" in capsys.readouterr().err
    assert not (tmp_path / "y" / "policy").exists()


def test_train_members_cover_picks_each_familys_covering_members():
    args = _parser().parse_args(["train", "--family", "cifar10-cells,nmt-variants", "--members", "cover",
                                 "--num-graphs", "2", "--cluster", "2xK80", "--logdir", "x", "--episodes", "1"])
    assert _train_sources(args) == [f"builtin:{family}/{member}" for family in ("cifar10-cells", "nmt-variants")
                                    for member in sorted(covering_members(family, 2))]
    args.members = "first"
    assert _train_sources(args) == [f"builtin:{family}/{member}" for family in ("cifar10-cells", "nmt-variants")
                                    for member in (0, 1)]


def test_simulate_and_place_write_trace_and_gantt(graph_file, tmp_path, capsys):
    placement, trace, gantt = tmp_path / "p.pb", tmp_path / "t.json", tmp_path / "g.png"
    assert main(_place_args(graph_file, tmp_path / "out.pb", "--placement-out", str(placement),
                            "--trace", str(trace), "--gantt", str(gantt))) == 0
    assert trace.stat().st_size > 0 and gantt.read_bytes()[:4] == b"\x89PNG"
    trace2, gantt2 = tmp_path / "t2.json", tmp_path / "g2.png"
    assert main(["simulate", graph_file, "--cluster", "2xV100", "--placement", str(placement), "--batch-size", "8",
                 "--fetch", "train", "--trace", str(trace2), "--gantt", str(gantt2)]) == 0
    assert "step time" in capsys.readouterr().out
    events = json.loads(trace2.read_text())
    assert events, "a Chrome trace with events"
    assert gantt2.read_bytes()[:4] == b"\x89PNG"
