"""The Baechi placers with each communication model and rule, against the previous version.

For every row (graph, cluster) this builds the grouped Problem (analytical costs) and simulates:
- m_topo under each rule ("share": tfplaceto's, "fill": Baechi's) and their best (`m_topo.place`);
- m_etf under each communication model ("link": per-link queues, the simulator's; "channel":
  Baechi's one channel per device; each the best over the other options, `m_etf.OPTIONS`),
  with the options Baechi's code has ("baechi": channel, topological tie break, queued inputs)
  and the best of all (`m_etf.place`);
- m_sct likewise under each model, under each rule (best over the other options), with Baechi's
  choices (the awake rule, cut-off 0.1) and the best of all;
- heft under each model ("none": HEFT's own, contention-free; "link"; "channel") and their best;
- the best fast baseline (`COMPARED_BASELINES`) now;
and the same placers as they were at `--previous` (default: the commit issue 16 started from),
run in a subprocess on that commit's tfplaceto (extracted with `git archive`) over the same
problems, their placements scored by this simulator. Ratios are new / previous (< 1: faster now).
Targets: the new m_etf at least as good as each model's on every row (and so as Baechi's
choices); the best fast baseline lower than the previous one on several rows.

Run: .venv/bin/python benchmarks/baselines_vs_paper.py [--rows bench,grouped] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import pickle
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Runnable from a checkout without an install; the previous version's worker (a subprocess with
# that version first on PYTHONPATH) must not import this checkout's tfplaceto.
if str(ROOT) not in sys.path and "--previous-worker" not in sys.argv:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PREVIOUS = "46ab397"  # main when issue 16 started
BENCH_ROWS = [(g, c) for g in ("inception_v3", "nmt_4l", "nasnet")
              for c in ("2xK80", "4xK80", "4xV100", "8xV100")]
GROUPED_ROWS = [(g, "4xV100") for g in (
    [f"cifar10-cells/{i}" for i in range(6)] + [f"ptb-cells/{i}" for i in range(4)]
    + [f"nmt-variants/{i}" for i in range(4)] + ["inception_v3", "nmt_2l"])]
FAST = ("single", "round_robin", "expert", "metis", "m_topo", "m_etf", "m_sct", "heft")


def build_problems(rows):
    import tfplaceto as tp
    from tfplaceto.problem import make_problem

    problems, graphs = [], {}
    for graph, cluster in rows:
        if graph not in graphs:
            graphs[graph] = tp.import_graph(f"builtin:{graph}")
        op_graph = graphs[graph]
        problems.append(make_problem(op_graph, tp.Cluster.preset(cluster), tp.profile(op_graph, cluster)))
    return problems


def variants(problem) -> dict[str, np.ndarray | None]:
    """name -> placement (None when the variant could not place) of every variant of this issue."""
    from tfplaceto import baselines, errors
    from tfplaceto.baselines import common, heft, m_etf, m_sct, m_topo

    def attempt(placer, *args, **kwargs):
        try:
            return np.asarray(placer(*args, **kwargs), np.int32)
        except errors.UnplaceableError:
            return None

    baechi = {"comm_model": "channel", "tie_break": "topo", "inputs": "queued"}  # its code's choices
    out = {}
    for rule in m_topo.RULES:
        out[f"m_topo:{rule}"] = attempt(m_topo.place, problem, rule=rule)
    for model in common.COMM_MODELS:
        out[f"m_etf:{model}"] = attempt(m_etf.place, problem, comm_model=model)
        out[f"m_sct:{model}"] = attempt(m_sct.place, problem, comm_model=model)
    out["m_etf:baechi"] = attempt(m_etf.place, problem, **baechi)
    for rule in m_sct.RULES:
        out[f"m_sct:{rule}"] = attempt(m_sct.place, problem, rule=rule)
    out["m_sct:baechi"] = attempt(m_sct.place, problem, rule="awake", cutoff=m_sct.BAECHI_CUTOFF, **baechi)
    for model in heft.COMM_MODELS:
        out[f"heft:{model}"] = attempt(heft.place, problem, comm_model=model)
    for method in FAST:
        out[method] = attempt(baselines.run, method, problem)
    return out


def previous_placements(problems, ref: str) -> list[dict[str, list[int] | None]]:
    """The FAST baselines' placements by tfplaceto at git ref `ref`, in a subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "tfplaceto"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        inputs, outputs = pathlib.Path(tmp, "problems.pkl"), pathlib.Path(tmp, "placements.json")
        with open(inputs, "wb") as f:
            pickle.dump([(p.graph, p.cluster, p.compute_s, p.allowed) for p in problems], f)
        env = dict(os.environ, PYTHONPATH=tmp, NUMBA_CACHE_DIR=str(pathlib.Path(tmp, "numba")))
        subprocess.run([sys.executable, __file__, "--previous-worker", str(inputs), str(outputs)],
                       check=True, env=env, cwd=tmp)
        return json.loads(outputs.read_text())


def previous_worker(inputs: str, outputs: str) -> None:
    """Runs in the subprocess: the old tfplaceto is first on the path."""
    import tfplaceto
    from tfplaceto import baselines, errors
    from tfplaceto.problem import Problem

    assert not str(pathlib.Path(tfplaceto.__file__)).startswith(str(ROOT)), tfplaceto.__file__
    with open(inputs, "rb") as f:
        problems = [Problem(*fields) for fields in pickle.load(f)]
    placements = []
    for problem in problems:
        row = {}
        for method in FAST:
            try:
                row[method] = baselines.run(method, problem).tolist()
            except errors.UnplaceableError:
                row[method] = None
        placements.append(row)
    pathlib.Path(outputs).write_text(json.dumps(placements))


def score(problem, placement) -> tuple[bool, float] | None:
    if placement is None:
        return None
    step_time, _, oom = problem.simulator().run(np.asarray(placement, np.int32))
    return bool(oom), float(step_time)


def best(scores: dict[str, tuple[bool, float] | None], names) -> tuple[bool, float] | None:
    found = [scores[n] for n in names if scores.get(n) is not None]
    return min(found) if found else None


COLUMNS = [  # (header, key): key into the row's scores
    ("topo:share", "m_topo:share"), ("topo:fill", "m_topo:fill"), ("m_topo", "m_topo"),
    ("was", "was:m_topo"),
    ("etf:link", "m_etf:link"), ("etf:chan", "m_etf:channel"), ("etf:baechi", "m_etf:baechi"),
    ("m_etf", "m_etf"), ("was", "was:m_etf"),
    ("sct:link", "m_sct:link"), ("sct:chan", "m_sct:channel"), ("sct:awake", "m_sct:awake"),
    ("sct:bonus", "m_sct:bonus"), ("sct:baechi", "m_sct:baechi"), ("m_sct", "m_sct"), ("was", "was:m_sct"),
    ("heft:none", "heft:none"), ("heft:link", "heft:link"), ("heft:chan", "heft:channel"),
    ("heft", "heft"), ("was", "was:heft"), ("best", "best"), ("was", "was:best")]


def cell(value) -> str:
    if value is None:
        return "-"
    oom, seconds = value
    return f"{seconds * 1e3:.4g}" + ("!" if oom else "")


def ratio(new, old) -> float | None:
    if new is None or old is None or new[0] or old[0]:
        return None
    return new[1] / old[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="bench,grouped", help="bench, grouped or both")
    parser.add_argument("--previous", default=PREVIOUS, help="git ref of the previous version")
    parser.add_argument("--out", default=None)
    parser.add_argument("--previous-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.previous_worker:
        previous_worker(*args.previous_worker)
        return
    warnings.simplefilter("ignore")
    rows = []
    for kind in args.rows.split(","):
        rows += {"bench": BENCH_ROWS, "grouped": GROUPED_ROWS}[kind]
    rows = list(dict.fromkeys(rows))  # inception_v3 4xV100 is in both
    start = time.perf_counter()
    problems = build_problems(rows)
    print(f"built {len(problems)} problems in {time.perf_counter() - start:.0f} s", flush=True)
    start = time.perf_counter()
    previous = previous_placements(problems, args.previous)
    print(f"previous placements ({args.previous}) in {time.perf_counter() - start:.0f} s", flush=True)

    records = []
    header = f"{'graph':18s} {'cluster':7s} " + " ".join(f"{h:>10s}" for h, _ in COLUMNS)
    print("(simulated step time in ms; ! OOM; - could not place; was = previous version)")
    print(header)
    for (graph, cluster), problem, old in zip(rows, problems, previous):
        start = time.perf_counter()
        scores = {name: score(problem, p) for name, p in variants(problem).items()}
        wall = time.perf_counter() - start
        for method in FAST:
            scores[f"was:{method}"] = score(problem, old[method])
        scores["best"] = best(scores, FAST)
        scores["was:best"] = best(scores, [f"was:{m}" for m in FAST])
        line = f"{graph:18s} {cluster:7s} " + " ".join(f"{cell(scores.get(k)):>10s}" for _, k in COLUMNS)
        print(line, flush=True)
        records.append({"graph": graph, "cluster": cluster, "nodes": problem.num_nodes,
                        "wall_s": wall, "scores": scores})
    print()
    summarize(records)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(records, indent=1))


def summarize(records: list[dict]) -> None:
    """Ratios new / previous per placer, and the checks of the issue's targets."""
    def geo(values):
        values = [v for v in values if v is not None]
        return (float(np.exp(np.mean(np.log(values)))), min(values), max(values), len(values)) if values else None

    print(f"{'placer':8s} {'geo-mean new/was':>16s} {'min':>6s} {'max':>6s} {'rows':>5s} {'faster':>6s} {'slower':>6s}")
    for method in ("m_topo", "m_etf", "m_sct", "heft", "best"):
        ratios = [ratio(r["scores"][method], r["scores"][f"was:{method}"]) for r in records]
        g = geo(ratios)
        faster = sum(1 for x in ratios if x is not None and x < 1 - 1e-9)
        slower = sum(1 for x in ratios if x is not None and x > 1 + 1e-9)
        if g:
            print(f"{method:8s} {g[0]:16.3f} {g[1]:6.3f} {g[2]:6.3f} {g[3]:5d} {faster:6d} {slower:6d}")
    # The m_etf target: at least as good as each model alone on every row.
    worse = [(r["graph"], r["cluster"], model) for r in records for model in ("link", "channel", "baechi")
             if r["scores"][f"m_etf:{model}"] is not None
             and r["scores"]["m_etf"] > r["scores"][f"m_etf:{model}"]]
    print(f"m_etf worse than one of its models on {len(worse)} rows {worse if worse else ''}")
    lowered = [(r["graph"], r["cluster"]) for r in records
               if (ratio(r["scores"]["best"], r["scores"]["was:best"]) or 1.0) < 1 - 1e-9]
    print(f"best fast baseline lowered on {len(lowered)} of {len(records)} rows: {lowered}")


if __name__ == "__main__":
    main()
