"""`tfplaceto bench`: rows for every (graph, cluster, method), a table with the best marked, JSON, plot."""

import json

import numpy as np
import pytest
import tensorflow as tf

from tfplaceto import bench
from tfplaceto.cli import main


def test_bench_cli_writes_json_table_and_plot(tmp_path, capsys):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [64, 256], name="x")
        branches = [tf.nn.relu(tf.matmul(x, tf.compat.v1.get_variable(f"w{i}", [256, 256], use_resource=True)))
                    for i in range(4)]
        tf.add_n(branches, name="out")
    source = tmp_path / "branches.pb"
    source.write_bytes(graph.as_graph_def().SerializeToString())
    out, picture = tmp_path / "results.json", tmp_path / "bench.png"
    assert main(["bench", "--graphs", str(source), "--clusters", "2xV100", "4xK80",
                 "--methods", "single", "round_robin", "m_etf", "--out", str(out), "--plot", str(picture)]) == 0
    records = json.loads(out.read_text())
    assert len(records) == 2 * 3
    assert all(r["step_time_s"] >= r["lower_bound_s"] * (1 - 1e-9) for r in records)
    table = capsys.readouterr().out
    assert sum(line.count("*") for line in table.splitlines()[2:]) == 2, table  # one best per row
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_best_prefers_fitting_placements():
    rows = [bench.BenchRow("g", "c", "fast_oom", 1.0, 1.0, True, {}, 0.0),
            bench.BenchRow("g", "c", "slow_fits", 2.0, 1.0, False, {}, 0.0)]
    assert bench._best(rows).method == "slow_fits"


def test_ablation_pools_runs_and_pairs_placeto_with_each_control_row_by_row(capsys):
    import numpy as np
    from conftest import ROOT, load_script

    ablation = load_script("benchmarks/ablation.py")
    runs = [ROOT / "docs" / f"ablation_seed5policy_seed{seed}.json" for seed in range(5)]
    ablation.main(["--pool", *map(str, runs)])
    pooled = json.loads(capsys.readouterr().out)
    summaries = [json.loads(run.read_text())["summary"] for run in runs]
    assert pooled["rows"] == sum(s["rows"] for s in summaries) == 90
    for variant in ("placeto", "untrained", "random moves"):  # equal rows a run: the mean of the runs' means
        assert np.isclose(pooled["mean_ratio_to_local_search"][variant],
                          np.mean([s[variant]["mean_ratio_to_local_search"] for s in summaries]))
    for control in ("untrained", "random moves"):
        paired = pooled[f"placeto - {control}"]
        assert np.isclose(paired["mean"], pooled["mean_ratio_to_local_search"]["placeto"]
                          - pooled["mean_ratio_to_local_search"][control])
        assert paired["standard_error"] > 0 and paired["rows_placeto_better"] + paired["rows_placeto_worse"] <= 90
    with pytest.raises(SystemExit):  # not a run's file: a usage error naming it, no traceback
        ablation.main(["--pool", str(runs[0]), str(ROOT / "README.md")])
    assert "README.md: JSONDecodeError" in capsys.readouterr().err


def test_ablation_reruns_chosen_variants_on_a_stored_runs_rows_and_keeps_the_others(tmp_path, capsys):
    from conftest import ROOT, load_script

    ablation = load_script("benchmarks/ablation.py")
    stored = json.loads((ROOT / "docs" / "ablation_heldout90_seed0.json").read_text())
    row = next(r for r in stored["rows"] if (r["graph"], r["cluster"]) == ("ptb-cells/100", "2xK80"))
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"rows": [row]}))
    out = tmp_path / "rerun.json"
    # Random moves alone ends by patience here (in about 1 s): seeded, it finds the same again.
    ablation.main(["--rerun", str(run), "--variants", "random moves", "--seed", "0", "--out", str(out)])
    again = json.loads(out.read_text())["rows"][0]["variants"]
    assert again["random moves"]["step_time_s"] == row["variants"]["random moves"]["step_time_s"]
    assert again["random moves"]["wall_s"] != row["variants"]["random moves"]["wall_s"]  # run, not copied
    assert all(again[v] == row["variants"][v] for v in ("local_search", "placeto", "untrained"))
    # --ended-before: nothing the stored run ended later than that is run again.
    ablation.main(["--rerun", str(run), "--variants", "random moves", "--ended-before", "0.01", "--out", str(out)])
    assert json.loads(out.read_text())["rows"][0]["variants"] == row["variants"]
    capsys.readouterr()
    for wrong in (["--variants", "placeto"], ["--rerun", str(run), "--variants", "climbing"]):
        with pytest.raises(SystemExit):  # a usage error, no traceback
            ablation.main(wrong + ["--out", str(out)])


def test_generalization_merge_reports_runs_without_controls_and_joins_them_with_controls(capsys):
    from conftest import ROOT, load_script

    generalization = load_script("benchmarks/generalization.py")
    zero_shot_only = ROOT / "docs" / "validation_reproducible_seed5.json"  # a --no-controls run
    generalization.main(["--merge", str(zero_shot_only)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    rows = json.loads(zero_shot_only.read_text())
    mean = np.mean([r["zero_shot_s"] / r["best_baseline_s"] for r in rows])
    assert last.startswith(f"{len(rows)} rows; zero-shot / best fast baseline: mean {mean:.3f} (no controls")
    generalization.main(["--merge", str(ROOT / "docs" / "validation_controls.json"), str(zero_shot_only)])
    assert "untrained / zero-shot" in capsys.readouterr().out.strip().splitlines()[-1]


def test_generalization_merge_joins_rows_of_models_outside_the_families(capsys):
    from conftest import ROOT, load_script

    generalization = load_script("benchmarks/generalization.py")
    masked = ROOT / "docs" / "generalization_keras_applications.json"
    generalization.main(["--merge", str(ROOT / "docs" / "generalization_keras_applications_no_mask.json"), str(masked)])
    lines = capsys.readouterr().out.strip().splitlines()
    rows = json.loads(masked.read_text())
    clusters = ["2xK80", "4xV100", "8xV100"]
    expected = sorted(([r["graph"], r["cluster"]] for r in rows), key=lambda k: (k[0], clusters.index(k[1])))
    assert [line.split()[:2] for line in lines[1:-1]] == expected  # by model name, then cluster
    assert lines[-1].endswith("zero-shot out of memory on 0 rows")  # the later run's rows replace the earlier's


def test_perturbations_climbs_every_changed_draw_to_no_worse_than_it_began():
    from conftest import load_script

    from tfplaceto.rl.train import problems_for

    perturbations = load_script("benchmarks/perturbations.py")
    (problem,), _ = problems_for(["builtin:cifar10-cells/0"], ["2xK80"])
    sources = perturbations.SOURCES + perturbations.WHERE_IT_DIFFERS
    figures = perturbations.measure(problem, draws=4, sources=sources)
    assert figures["optimum_s"] > 0
    for source in sources:
        f = figures[source]
        assert 0 <= f["unchanged"] <= 4 and 0 <= f["better"] <= 1
        # a climb never worsens its start, and an unchanged draw stays at the optimum (1)
        changed = 4 - f["unchanged"]
        assert f["after"] * 4 <= f["before"] * changed + f["unchanged"] + 1e-9
        assert f["best"] <= f["after"] + 1e-12
        assert (f["climb_s"] > 0) == (changed > 0)


def test_relink_moves_a_window_of_the_differing_classes_to_the_guide_and_nothing_else():
    from conftest import load_script

    from tfplaceto.rl.train import problems_for
    from tfplaceto.search import classes_in_order

    perturbations = load_script("benchmarks/perturbations.py")
    (problem,), _ = problems_for(["builtin:cifar10-cells/0"], ["2xK80"])
    rng = np.random.default_rng(0)
    start = problem.tie(np.zeros(problem.num_nodes, np.int32))
    guide = problem.tie(rng.integers(0, 2, problem.num_nodes).astype(np.int32))
    classes = classes_in_order(problem)
    differing = sum(start[m[0]] != guide[m[0]] for m in classes)
    assert differing > 8
    for moved in perturbations.relink_moves(problem, guide, window=8)(rng, start, 6):
        changed = moved != start
        assert np.array_equal(moved[changed], guide[changed])  # only ever to the guide's device
        assert sum(bool(changed[m].any()) for m in classes) == 8  # one window of differing classes
        assert all(changed[m].all() == changed[m].any() for m in classes)  # whole classes
