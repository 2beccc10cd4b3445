"""Collection throughput at equal wall time: the embedded engine, then 1 and 2 Reverb actors.

Each configuration trains from fresh weights (seed 0) on the same problems with the training
configuration (tfplaceto/policy/train.gin: 64 lockstep lanes of one problem per batch since
session 12: docs/RESULTS.md has runs with 16 and with 64; 4 updates per batch, hidden 32,
8 rounds) for `--seconds` of wall time (`train(stop_after_s=)`, which stops between updates),
one configuration after the other in this process:
- embedded (`--actors 0`): collection and learning alternate in one process;
- 1 and 2 actors: `tfplaceto.rl.learner` with local actor processes on loopback.
A decision is one action (one node placed). Figures per configuration:
- decisions/s: all decisions trained on / wall time of the run, actor start-up included;
- steady decisions/s: from the first batch's arrival to the end (start-up excluded);
- learner s/batch: time the learner spends per batch outside `batch()` (4 updates, publishing;
  median over the batches);
- wait s/batch: time inside `batch()` (embedded: collecting; actors: waiting for the queue;
  median, the first batch excluded);
- per actor: its own episodes/s between its items, as the learner's TensorBoard shows it.
From those, the expected throughput of a 16-core machine with a GPU learner is
min(15 actors x the per-actor rate, decisions per batch / learner s per batch): the first
term is collection (one core per actor), the second the learner (the CPU learner time measured
here; what a GPU learner takes for this small network was not measured).
The last line: `ratio 2 actors / embedded: X.XX` (decisions/s, start-up included).

    python benchmarks/actors_scaling.py --seconds 240 --out docs/actors_scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


class Timed:
    """Wraps a collector: times what happens inside `batch()` and between batches."""

    def __init__(self, inner):
        self.inner = inner
        self.wait, self.learner, self.batches, self.decisions = [], [], 0, []
        self._returned = None
        self.first_at = None

    def batch(self):
        begin = time.perf_counter()
        if self._returned is not None:
            self.learner.append(begin - self._returned)
        batch = self.inner.batch()
        self._returned = time.perf_counter()
        if self.first_at is None:
            self.first_at = self._returned
        self.wait.append(self._returned - begin)
        self.decisions.append(float(batch.weights.sum()))
        return batch

    def after_update(self, agent, writer, episodes):
        self.inner.after_update(agent, writer, episodes)

    def episodes_per_actor(self):
        return self.inner.episodes_per_actor()


def run(actors: int, seconds: float, problems, sources, clusters) -> dict:
    import numpy as np

    from tfplaceto.rl.learner import Launcher
    from tfplaceto.rl.train import Embedded, train

    timed: list[Timed] = []
    launcher = Launcher(sources, clusters, actors, logdir=tempfile.mkdtemp(prefix="actors-scaling-"))

    def factory(*args):
        timed.append(Timed(launcher.start(*args) if actors else Embedded(*args)))
        return timed[0]

    begin = time.perf_counter()
    try:
        result = train(problems, episodes=10**9, logdir=None, seed=0, progress=False, stop_after_s=seconds,
                       collector=factory)
    finally:
        launcher.close()
    t = timed[0]
    wall = result.wall_s
    steady_s = time.perf_counter() - t.first_at if t.first_at else float("nan")
    # `steady` starts when the first batch arrived: its own decisions are not counted.
    steady = (result.decisions - t.decisions[0]) / steady_s if t.decisions else 0.0
    row = {"actors": actors, "wall_s": wall, "start_up_s": (t.first_at or begin) - begin,
           "episodes": result.episodes, "decisions": result.decisions, "batches": len(t.decisions),
           "decisions_per_s": result.decisions / wall, "steady_decisions_per_s": steady,
           "decisions_per_batch": float(np.mean(t.decisions)) if t.decisions else 0.0,
           # Medians: the first updates also trace the train step (once per episode length).
           "learner_s_per_batch": float(np.median(t.learner)) if t.learner else float("nan"),
           "wait_s_per_batch": float(np.median(t.wait[1:])) if len(t.wait) > 1 else float("nan"),
           "episodes_per_actor": launcher.episodes_per_actor() if actors else {"embedded": result.episodes}}
    if actors:
        episodes_per_decision = result.episodes / max(result.decisions, 1)
        row["actor_decisions_per_s"] = {str(a): float(np.median(r)) / episodes_per_decision
                                        for a, r in launcher.actor_rates.items() if r}
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=240.0, help="wall time of each configuration")
    parser.add_argument("--graphs", nargs="+", default=["builtin:cifar10-cells/0", "builtin:ptb-cells/0"])
    parser.add_argument("--clusters", nargs="+", default=["2xK80"])
    parser.add_argument("--actors", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--cores", type=int, default=16, help="the machine of the projection")
    parser.add_argument("--out", default=None, help="JSON of the rows")
    parser.add_argument("--gin-param", action="append", default=[],
                        help="gin binding on top of train.gin, e.g. 'train.updates_per_batch = 1'")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import gin

    # rl.learner imported first, as `tfplaceto train` does: every configurable (rl.cloning's too) is
    # registered before gin locks the parsed config, or the first run with actors cannot import it.
    from tfplaceto.rl import learner  # noqa: F401
    from tfplaceto.rl.train import problems_for

    gin.parse_config_files_and_bindings([os.path.join(ROOT, "tfplaceto", "policy", "train.gin")], args.gin_param)
    problems, labels = problems_for(args.graphs, args.clusters)
    print(f"problems: {', '.join(labels)}; {args.seconds:.0f} s each; {os.cpu_count()} cores; load average "
          f"{os.getloadavg()[0]:.1f}; {' '.join(args.gin_param) or 'train.gin'}", flush=True)
    rows = []
    for actors in args.actors:
        row = run(actors, args.seconds, problems, args.graphs, args.clusters)
        rows.append(row)
        name = "embedded" if actors == 0 else f"{actors} actor{'s' * (actors > 1)}"
        per_actor = ", ".join(f"actor {a}: {r:.0f}/s" for a, r in row.get("actor_decisions_per_s", {}).items())
        print(f"{name:<10} {row['decisions_per_s']:7.1f} decisions/s ({row['decisions']} in {row['wall_s']:.0f} s; "
              f"steady {row['steady_decisions_per_s']:.1f}/s after {row['start_up_s']:.0f} s start-up); "
              f"learner {row['learner_s_per_batch']:.2f} s/batch, wait {row['wait_s_per_batch']:.2f} s/batch"
              f"{'; ' + per_actor if per_actor else ''}; load average {os.getloadavg()[0]:.1f}", flush=True)
    by = {row["actors"]: row for row in rows}
    if 0 in by and 1 in by and by[1].get("actor_decisions_per_s"):
        # The per-actor rate measured with one actor; the learner's time per batch from the
        # embedded run (there it does not share the cores with collection).
        per_actor = max(by[1]["actor_decisions_per_s"].values())
        learner_bound = by[0]["decisions_per_batch"] / by[0]["learner_s_per_batch"]
        projected = min((args.cores - 1) * per_actor, learner_bound)
        print(f"projection for {args.cores} cores: {args.cores - 1} actors x {per_actor:.0f} decisions/s = "
              f"{(args.cores - 1) * per_actor:.0f}/s of collection; the learner takes "
              f"{by[0]['learner_s_per_batch']:.2f} s per batch of {by[0]['decisions_per_batch']:.0f} decisions "
              f"= {learner_bound:.0f}/s; expected {projected:.0f} decisions/s "
              f"({projected / by[0]['decisions_per_s']:.1f}x embedded)")
    if args.out:
        from tfplaceto.outputs import atomic_write

        atomic_write(args.out, json.dumps({"command": " ".join(["python", "benchmarks/actors_scaling.py",
                                                                *(argv or sys.argv[1:])]), "rows": rows}, indent=1).encode())
    if 0 in by and 2 in by:
        print(f"ratio 2 actors / embedded: {by[2]['decisions_per_s'] / by[0]['decisions_per_s']:.2f}")


if __name__ == "__main__":
    main()
