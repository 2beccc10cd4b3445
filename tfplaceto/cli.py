"""The `tfplaceto` command line (also `python -m tfplaceto`).

  tfplaceto place SOURCE --cluster C [--method M] [--budget-s S] --out OUT.pb
                  [--report R.json] [--gantt G.png] [--trace T.json] [--batch-size N] [--fetch F]
  tfplaceto simulate SOURCE --cluster C --placement P.pb [--gantt G.png] [--trace T.json]
  tfplaceto bench [--graphs ..] [--clusters ..] [--methods ..] --out results.json [--plot P.png]
  tfplaceto train --family F --cluster C [--cluster C2 ..] --logdir D [--episodes N]
  tfplaceto rewrite-saved-model SRC DST --cluster C [--method M] [--signature K] [--batch-size N]
  tfplaceto models

Bad input prints one line on stderr and exits with status 2, with no traceback and nothing
written at the output paths (every output is written atomically, after all the work is done).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

EXIT_BAD_INPUT = 2


def _quiet_tensorflow() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit status 2)."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"tfplaceto: error: {message} (see tfplaceto --help)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tfplaceto", description="Learned device placement for TensorFlow graphs.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    place = commands.add_parser("place", help="place a graph and write the placed GraphDef")
    place.add_argument("source", help="GraphDef .pb/.pbtxt, SavedModel directory, or builtin:NAME")
    place.add_argument("--cluster", required=True, help="preset (4xV100, ...), local or local:N")
    place.add_argument("--method", default="placeto", help="placement method, or auto (best baseline)")
    place.add_argument("--budget-s", type=float, default=None, help="fine-tuning / search budget in seconds")
    place.add_argument("--out", required=True, help="where to write the placed GraphDef (.pb or .pbtxt)")
    place.add_argument("--report", help="JSON report of the figures")
    place.add_argument("--gantt", help="PNG Gantt chart of the simulated step")
    place.add_argument("--trace", help="Chrome trace JSON of the simulated step")
    place.add_argument("--placement-out", help="write the Placement proto here too")
    place.add_argument("--batch-size", type=int, default=None)
    place.add_argument("--fetch", action="append", default=None, help="fetch op (repeatable)")
    place.add_argument("--seed", type=int, default=0)
    place.add_argument("--costs", default=None,
                       help="analytical, measured, or a saved CostProfile (default: measured on local, "
                            "analytical for presets)")
    _policy_arguments(place)

    simulate = commands.add_parser("simulate", help="simulate a placed graph")
    simulate.add_argument("source")
    simulate.add_argument("--cluster", required=True)
    simulate.add_argument("--placement", required=True, help="a Placement proto written by `place`")
    simulate.add_argument("--gantt")
    simulate.add_argument("--trace")
    simulate.add_argument("--batch-size", type=int, default=None)
    simulate.add_argument("--fetch", action="append", default=None)

    bench = commands.add_parser("bench", help="place and simulate built-in graphs with every method")
    bench.add_argument("--graphs", nargs="+", default=None, help="built-in names or graph files")
    bench.add_argument("--clusters", nargs="+", default=None)
    bench.add_argument("--methods", nargs="+", default=None)
    bench.add_argument("--budget-s", type=float, default=None, help="budget of local_search / fine-tuning")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--out", required=True, help="results JSON")
    bench.add_argument("--plot", help="bar chart PNG")

    train = commands.add_parser("train", help="train the Placeto policy on graphs or graph families")
    what = train.add_mutually_exclusive_group(required=True)
    what.add_argument("--family", help="built-in families (comma-separated): cifar10-cells, ptb-cells, nmt-variants")
    what.add_argument("--graph", action="append", help="a graph to train on (repeatable): anything place takes")
    train.add_argument("--cluster", action="append", required=True, help="preset (repeatable)")
    train.add_argument("--logdir", required=True, help="checkpoints, TensorBoard summaries, the exported policy")
    train.add_argument("--episodes", type=int, required=True, help="episodes in all (a resumed run counts its own)")
    train.add_argument("--num-graphs", type=int, default=3, help="family members trained on (0 .. N-1)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--gin", action="append", default=[], help="gin file configuring train() (repeatable)")
    train.add_argument("--gin-param", action="append", default=[], help="gin binding, e.g. train.lanes=64")

    commands.add_parser("models", help="list the built-in graphs and graph families")

    rewrite = commands.add_parser("rewrite-saved-model",
                                  help="write a copy of a SavedModel with its signatures' ops placed")
    rewrite.add_argument("src", help="SavedModel directory (never modified)")
    rewrite.add_argument("dst", help="directory for the placed SavedModel (must not exist, or be empty)")
    rewrite.add_argument("--cluster", required=True, help="preset (4xV100, ...), local or local:N")
    rewrite.add_argument("--method", default="placeto", help="placement method, or auto (best baseline)")
    rewrite.add_argument("--budget-s", type=float, default=None, help="fine-tuning / search budget in seconds")
    rewrite.add_argument("--signature", action="append", default=None,
                         help="signature key to place (repeatable); default: all")
    rewrite.add_argument("--batch-size", type=int, default=None,
                         help="size of unknown batch dimensions (default 32)")
    rewrite.add_argument("--seed", type=int, default=0)
    return parser


def _policy_arguments(parser) -> None:
    parser.add_argument("--policy", default=None,
                        help="methods placeto, placeto_policy: shipped (default), untrained, or a policy directory")
    parser.add_argument("--start", default=None, choices=("random", "single", "baseline"),
                        help="method placeto_policy: the episode's start (default random)")


def _write_graph(path: str, graph_def) -> None:
    from google.protobuf import text_format

    from tfplaceto.placement import atomic_write

    data = text_format.MessageToString(graph_def).encode() if path.endswith(".pbtxt") else \
        graph_def.SerializeToString(deterministic=True)
    atomic_write(path, data)


def _check_output_paths(*paths: str | None) -> None:
    from tfplaceto import errors

    for path in paths:
        if path is None:
            continue
        directory = os.path.dirname(os.path.abspath(path)) or "."
        if os.path.isdir(path):
            raise errors.TfplacetoError(f"output path {path} is a directory")
        if os.path.exists(directory) and not os.access(directory, os.W_OK):
            raise errors.TfplacetoError(f"cannot write to {directory}")


def _cmd_place(args) -> int:
    import tfplaceto as tp
    from tfplaceto.placement import atomic_write

    _check_output_paths(args.out, args.report, args.gantt, args.trace, args.placement_out)
    result = tp.optimize(args.source, fetches=args.fetch, cluster=args.cluster, method=args.method, costs=args.costs,
                         budget_s=args.budget_s, seed=args.seed, batch_size=args.batch_size,
                         policy=args.policy, start=args.start)
    # Render everything first; write the graph last so a failure leaves OUT untouched.
    sim = result.simulate() if (args.gantt or args.trace) else None
    if sim is not None and args.trace:
        sim.save_chrome_trace(args.trace)
    if sim is not None and args.gantt:
        sim.plot_gantt(args.gantt)
    if args.report:
        atomic_write(args.report, json.dumps(result.summary(), indent=2, sort_keys=True).encode())
    if args.placement_out:
        result.placement.save(args.placement_out)
    _write_graph(args.out, result.graph_def)
    _print_table(result)
    return 0


def _print_table(result) -> None:
    rows = sorted((result.evaluated or result.baselines).items(), key=lambda kv: kv[1])
    width = max([len(m) for m, _ in rows] + [len(result.method_used), 6])
    print(f"{'method':<{width}}  step time (ms)  x lower bound")
    for method, step in rows:
        mark = "  <- chosen" if method == result.method_used else ""
        print(f"{method:<{width}}  {step * 1e3:14.3f}  {step / result.lower_bound_s:13.2f}{mark}")
    print(f"lower bound {result.lower_bound_s * 1e3:.3f} ms; {result.placement.notes}; "
          f"{'OUT OF MEMORY; ' if result.oom else ''}placed in {result.placement_time_s:.1f} s")


def _cmd_simulate(args) -> int:
    import tfplaceto as tp

    _check_output_paths(args.gantt, args.trace)
    op_graph = tp.import_graph(args.source, fetches=args.fetch, batch_size=args.batch_size)
    placement = tp.Placement.load(args.placement)
    sim = tp.simulate(op_graph, placement, args.cluster)
    if args.trace:
        sim.save_chrome_trace(args.trace)
    if args.gantt:
        sim.plot_gantt(args.gantt)
    print(f"step time {sim.step_time_s * 1e3:.3f} ms, {sim.transfer_bytes / 1e6:.1f} MB moved, "
          f"{'OOM' if sim.oom else 'fits'}")
    for device, peak in sim.peak_memory_bytes.items():
        print(f"  {device}: busy {sim.busy_s[device] * 1e3:.3f} ms, peak memory {peak / 2**30:.2f} GiB")
    return 0


def _cmd_bench(args) -> int:
    from tfplaceto import bench

    _check_output_paths(args.out, args.plot)
    rows = bench.run_bench(args.graphs or bench.DEFAULT_GRAPHS, args.clusters or bench.DEFAULT_CLUSTERS,
                           args.methods or bench.DEFAULT_METHODS, seed=args.seed, budget_s=args.budget_s,
                           log=lambda line: print(line, file=sys.stderr))
    bench.save_json(rows, args.out)
    if args.plot:
        bench.plot(rows, args.plot)
    print(bench.format_table(rows))
    return 0


def _cmd_train(args) -> int:
    import gin

    from tfplaceto import errors
    from tfplaceto.rl import train as training

    if args.episodes < 1:
        raise errors.TfplacetoError(f"--episodes must be at least 1, got {args.episodes}")
    try:
        gin.parse_config_files_and_bindings(args.gin, args.gin_param)
    except (OSError, ValueError, KeyError) as e:
        raise errors.TfplacetoError(f"bad gin configuration: {errors.first_line(e)}") from None
    if args.family:
        families = [f.strip() for f in args.family.split(",") if f.strip()]
        if not families or args.num_graphs < 1:
            raise errors.TfplacetoError("--family needs a family name and --num-graphs at least 1")
        sources = [f"builtin:{family}/{member}" for family in families for member in range(args.num_graphs)]
    else:
        sources = args.graph
    result = training.train_sources(sources, args.cluster, args.episodes, args.logdir, seed=args.seed)
    with open(os.path.join(args.logdir, "operative_config.gin"), "w") as f:
        f.write(gin.operative_config_str())
    print(f"{result.episodes} episodes, {result.decisions} decisions in {result.wall_s:.0f} s; "
          f"policy: {result.policy_dir} (use --method placeto_policy --policy {result.policy_dir})")
    return 0


def _cmd_models(args) -> int:
    from tfplaceto.graph import builtin

    for name, description in builtin.describe():
        print(f"builtin:{name:<24} {description}")
    return 0


def _cmd_rewrite_saved_model(args) -> int:
    from tfplaceto import saved_model

    # rewrite validates SRC and DST before any work and renames DST into place last.
    result = saved_model.rewrite(args.src, args.dst, args.cluster, method=args.method,
                                 signature_keys=args.signature, budget_s=args.budget_s, seed=args.seed,
                                 batch_size=args.batch_size)
    _print_table(result)
    print(f"wrote {args.dst}")
    return 0


def main(argv: list[str] | None = None) -> int:
    _quiet_tensorflow()
    args = _parser().parse_args(argv)
    from tfplaceto import errors

    handlers = {"place": _cmd_place, "simulate": _cmd_simulate, "models": _cmd_models, "bench": _cmd_bench, "train": _cmd_train,
                "rewrite-saved-model": _cmd_rewrite_saved_model}
    try:
        return handlers[args.command](args)
    except errors.TfplacetoError as e:
        print(f"tfplaceto: error: {errors.first_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tfplaceto: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
