"""The `tfplaceto` command line (also `python -m tfplaceto`).

  tfplaceto place SOURCE --cluster C [--method M] [--budget-s S] --out OUT.pb
                  [--report R.json] [--gantt G.png] [--trace T.json] [--batch-size N] [--fetch F]
                  [--explain]
  tfplaceto simulate SOURCE --cluster C --placement P.pb [--gantt G.png] [--trace T.json]
  tfplaceto bench [--graphs ..] [--clusters ..] [--methods ..] --out results.json [--plot P.png]
                  [--batch-size N] [--fetch F]
  tfplaceto train --family F --cluster C [--cluster C2 ..] --logdir D [--episodes N] [--select-members M,..]
                  [--actors N] [--reverb-address HOST:PORT] [--gin FILE] [--gin-param P]
  tfplaceto actor --reverb-address HOST:PORT [--actor-id I]   (collects for a `train` elsewhere)
  tfplaceto ensemble POLICY POLICY [POLICY ..] --out DIR   (one policy of several: an ensemble)
  tfplaceto rewrite-saved-model SRC DST --cluster C [--method M] [--signature K] [--batch-size N]
  tfplaceto models
  tfplaceto calibrate TARGET --out cluster.pbtxt [--rounds N] [--runs N] [--no-contention]

Bad input prints one line on stderr and exits with status 2, with no traceback and nothing
written at the output paths: every output is checked before the work (writable, not an input,
not existing unless --overwrite) and written atomically after all of it (`outputs.OutputSet`);
Ctrl-C prints "interrupted" and exits with 130, also with nothing written. TensorFlow is imported
only by the commands that need it, after its C++ log level is set, so an error is one line, and
`--help`, `--version` and usage errors answer without it. The long commands print one status
line per stage on stderr (`tfplaceto.progress`) when stderr is a terminal (TFPLACETO_PROGRESS=1
or 0 forces it on or off).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

EXIT_BAD_INPUT = 2


def _quiet_tensorflow() -> None:
    # Before TensorFlow loads (the package imports it lazily): 3 also hides the "Unable to
    # register cuDNN factory" E lines TensorFlow prints at import on some machines.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _one_line_warnings() -> None:
    """Warnings (unknown shapes, ...) as one `tfplaceto: warning:` line, not file:line + source."""
    import warnings

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"tfplaceto: warning: {message}", file=file or sys.stderr)

    warnings.showwarning = show


class _Formatter(argparse.HelpFormatter):
    """Help that shows every option's default (when it has one worth showing)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        trivial = default is None or default is False or default == [] or default == argparse.SUPPRESS
        if not trivial and action.option_strings and "default" not in text:
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit status 2)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"tfplaceto: error: {message} (see tfplaceto --help)\n")


_SOURCE_HELP = ("GraphDef or MetaGraphDef .pb/.pbtxt, SavedModel directory, Keras .keras/.h5 file, "
                "or builtin:NAME (see tfplaceto models)")
_BATCH_HELP = "size of unknown batch dimensions (required when an input has one; built-in graphs have their own)"


def _version() -> str:
    from tfplaceto import __version__

    return f"tfplaceto {__version__}"


def _placement_arguments(command: argparse.ArgumentParser) -> None:
    """--cluster, --method and --budget-s of the commands that place (place, rewrite-saved-model)."""
    command.add_argument("--cluster", required=True,
                         help="preset (4xV100, ...), local, local:N or a cluster file (tfplaceto calibrate)")
    command.add_argument("--method", default="placeto",
                         help="placement method (placeto: the best of a search and the baselines; a method "
                              "named is used as is), or auto (best baseline)")
    command.add_argument("--budget-s", type=float, default=None,
                         help="fine-tuning / search budget in seconds (default: a 10 s search, no fine-tuning)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tfplaceto", description="Learned device placement for TensorFlow graphs.")
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    place = commands.add_parser("place", help="place a graph and write the placed GraphDef")
    place.add_argument("source", help=_SOURCE_HELP)
    _placement_arguments(place)
    place.add_argument("--out", required=True, help="where to write the placed GraphDef (.pb or .pbtxt)")
    place.add_argument("--report", help="JSON report of the figures")
    place.add_argument("--gantt", help="PNG Gantt chart of the simulated step")
    place.add_argument("--trace", help="Chrome trace JSON of the simulated step")
    place.add_argument("--placement-out", help="write the Placement proto here too")
    place.add_argument("--explain", action="store_true",
                       help="print a per-layer table: device, compute, bytes across devices, peak memory")
    place.add_argument("--batch-size", type=int, default=None, help=_BATCH_HELP)
    place.add_argument("--fetch", action="append", default=None,
                       help="op the step computes (repeatable; default: the graph's train_op or outputs)")
    place.add_argument("--seed", type=int, default=0, help="seed of the random choices")
    place.add_argument("--overwrite", action="store_true", help="replace outputs that exist")
    place.add_argument("--costs", default=None,
                       help="analytical, measured, or a saved CostProfile (default: measured on local, "
                            "analytical for presets)")
    _policy_arguments(place)
    place.add_argument("--loop-iterations", type=int, default=None,
                       help="iterations of while loops whose count is not static (the report lists every loop's)")

    simulate = commands.add_parser("simulate", help="simulate a placed graph")
    simulate.add_argument("source", help=_SOURCE_HELP)
    simulate.add_argument("--cluster", required=True, help="preset (4xV100, ...), local or local:N")
    simulate.add_argument("--placement", required=True,
                          help="the placed GraphDef `place --out` wrote, or the Placement proto of "
                               "`place --placement-out`")
    simulate.add_argument("--gantt", help="PNG Gantt chart of the simulated step")
    simulate.add_argument("--trace", help="Chrome trace JSON of the simulated step")
    simulate.add_argument("--batch-size", type=int, default=None, help=_BATCH_HELP)
    simulate.add_argument("--fetch", action="append", default=None,
                          help="op the step computes (repeatable; default: the graph's train_op or outputs)")
    simulate.add_argument("--overwrite", action="store_true", help="replace outputs that exist")

    bench = commands.add_parser("bench", help="place and simulate built-in graphs with every method")
    bench.add_argument("--graphs", nargs="+", default=None,
                       help="built-in names (inception_v3, cifar10-cells/1, ...) or graph files "
                            "(default: inception_v3 nmt_4l nmt_2l_loop nasnet)")
    bench.add_argument("--clusters", nargs="+", default=None, help="presets (default: 2xK80 4xK80 4xV100 8xV100)")
    bench.add_argument("--methods", nargs="+", default=None,
                       help="methods (default: single round_robin expert metis m_topo m_etf m_sct heft local_search)")
    bench.add_argument("--budget-s", type=float, default=None, help="budget of local_search / fine-tuning")
    bench.add_argument("--batch-size", type=int, default=None, help=_BATCH_HELP)
    bench.add_argument("--fetch", action="append", default=None,
                       help="op the step computes, for graph files (repeatable)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the random choices")
    bench.add_argument("--out", required=True, help="results JSON")
    bench.add_argument("--plot", help="bar chart PNG")
    bench.add_argument("--overwrite", action="store_true", help="replace outputs that exist")

    train = commands.add_parser("train", help="train the Placeto policy on graphs or graph families")
    what = train.add_mutually_exclusive_group(required=True)
    what.add_argument("--family", help="built-in families (comma-separated): cifar10-cells, ptb-cells, nmt-variants")
    what.add_argument("--graph", action="append", help="a graph to train on (repeatable): anything place takes")
    train.add_argument("--cluster", action="append", required=True, help="preset (repeatable)")
    train.add_argument("--logdir", required=True, help="checkpoints, TensorBoard summaries, the exported policy")
    train.add_argument("--episodes", type=int, required=True, help="episodes in all (a resumed run counts its own)")
    train.add_argument("--num-graphs", type=int, default=3, help="family members trained on (0 .. N-1 unless --members cover)")
    train.add_argument("--members", choices=("first", "cover"), default="first",
                       help="with --family: which --num-graphs members to train on: first (0 .. N-1, the "
                       "default) or cover (those among 0-49 that cover the family's kinds of member)")
    train.add_argument("--seed", type=int, default=0, help="seed of the run")
    train.add_argument("--select-members", default=None,
                       help="with --family: members (e.g. 50,51,52) the exported policy is selected on, "
                       "never trained on (default: selection on the training problems)")
    train.add_argument("--gin", action="append", default=[], help="gin file configuring train() (repeatable)")
    train.add_argument("--gin-param", action="append", default=[], help="gin binding, e.g. train.lanes=64")
    train.add_argument("--actors", type=int, default=0,
                       help="actor processes collecting through a Reverb server (0: the embedded engine)")
    train.add_argument("--reverb-address", default=None,
                       help="HOST:PORT: serve Reverb on PORT for actors on other machines (tfplaceto actor)")

    actor = commands.add_parser("actor", help="collect episodes for a `tfplaceto train` run on another machine")
    actor.add_argument("--reverb-address", required=True, help="the learner's HOST:PORT")
    actor.add_argument("--actor-id", type=int, default=None,
                       help="this actor's id (seeds it; default: from the process id; unique per run)")
    actor.add_argument("--batches", type=int, default=None, help="stop after this many batches (default: "
                       "until the learner stops)")
    actor.add_argument("--connect-timeout-s", type=float, default=120.0, help="wait this long for the server")
    actor.add_argument("--incarnation", type=int, default=0, help=argparse.SUPPRESS)  # set by the launcher
    actor.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)

    ensemble = commands.add_parser("ensemble", help="make one policy of several trained policies (an ensemble)")
    ensemble.add_argument("policies", nargs="+", help="policy directories (LOGDIR/policy; never modified)")
    ensemble.add_argument("--out", required=True, help="the policy directory to write")
    ensemble.add_argument("--overwrite", action="store_true", help="replace an existing --out")

    commands.add_parser("models", help="list the built-in graphs and graph families")

    rewrite = commands.add_parser("rewrite-saved-model",
                                  help="write a copy of a SavedModel with its signatures' ops placed")
    rewrite.add_argument("src", help="SavedModel directory (never modified)")
    rewrite.add_argument("dst", help="directory for the placed SavedModel (must not exist, or be empty)")
    _placement_arguments(rewrite)
    rewrite.add_argument("--signature", action="append", default=None,
                         help="signature key to place (repeatable); default: all")
    rewrite.add_argument("--batch-size", type=int, default=None,
                         help="size of unknown batch dimensions of the signatures' inputs (required when "
                              "an input has one)")
    rewrite.add_argument("--seed", type=int, default=0, help="seed of the random choices")
    rewrite.add_argument("--overwrite", action="store_true", help="replace a DST that is not empty")
    calibrate = commands.add_parser(
        "calibrate", help="measure a machine or TF cluster once; write a cluster file for --cluster")
    calibrate.add_argument("target", help="local, local:N, loopback:N, a ClusterSpec JSON (inline or a .json "
                                          "file) or grpc://host:port[,grpc://host:port...]")
    calibrate.add_argument("--out", required=True, help="the cluster file to write (.pbtxt; .pb for binary)")
    calibrate.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the device measurements")
    calibrate.add_argument("--runs", type=int, default=5, help="timed steps per device measurement and round")
    calibrate.add_argument("--no-contention", action="store_true",
                           help="do not measure contention between devices sharing a host")
    calibrate.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    return parser


def _cmd_calibrate(args) -> int:
    from tfplaceto.measure.targets import calibrate_to_file, describe

    cluster = calibrate_to_file(args.target, args.out, rounds=args.rounds, runs=args.runs,
                                contention=not args.no_contention, overwrite=args.overwrite)
    print(describe(cluster))
    print(f"wrote {args.out} (use it as --cluster {args.out}, or tp.Cluster.load)")
    return 0


def _policy_arguments(parser) -> None:
    parser.add_argument("--policy", default=None,
                        help="methods placeto, placeto_policy: shipped (default), untrained, or a policy directory")
    parser.add_argument("--start", default=None, choices=("random", "single", "baseline"),
                        help="method placeto_policy: the episode's start (default random)")


def _graph_bytes(path: str, graph_def) -> bytes:
    from google.protobuf import text_format

    return text_format.MessageToString(graph_def).encode() if path.endswith(".pbtxt") else \
        graph_def.SerializeToString(deterministic=True)


def _check_command_args(args) -> None:
    """The numbers every command takes, checked before any graph is imported."""
    from tfplaceto import checks

    checks.check_budget(getattr(args, "budget_s", None))
    checks.check_batch_size(getattr(args, "batch_size", None))
    if hasattr(args, "seed"):
        checks.check_seed(args.seed)


def _cmd_place(args) -> int:
    from tfplaceto.outputs import OutputSet, atomic_write

    outputs = OutputSet({"--out": args.out, "--report": args.report, "--gantt": args.gantt,
                         "--trace": args.trace, "--placement-out": args.placement_out},
                        inputs=[args.source, args.costs], overwrite=args.overwrite)
    import tfplaceto as tp

    with outputs:
        result = tp.optimize(args.source, fetches=args.fetch, cluster=args.cluster, method=args.method,
                             costs=args.costs, budget_s=args.budget_s, seed=args.seed, batch_size=args.batch_size,
                             policy=args.policy, start=args.start, loop_iterations=args.loop_iterations)
        table = _format_table(result)
        sim = result.simulate() if (args.gantt or args.trace) else None
        if args.trace:
            sim.save_chrome_trace(outputs.stage(args.trace))
        if args.gantt:
            sim.plot_gantt(outputs.stage(args.gantt))
        if args.report:
            atomic_write(outputs.stage(args.report),
                         json.dumps(result.summary(), indent=2, sort_keys=True).encode())
        if args.placement_out:
            result.placement.save(outputs.stage(args.placement_out))
        atomic_write(outputs.stage(args.out), _graph_bytes(args.out, result.graph_def))
        explained = result.explain() if args.explain else None
    print(table)
    if explained:
        print(explained)
    return 0


def _ratio(step_s: float, bound_s: float) -> str:
    # A graph with no compute (a constant, ops too small to cost) has a lower bound of 0.
    return f"{step_s / bound_s:13.2f}" if bound_s > 0 else f"{'-':>13}"


def _format_table(result) -> str:
    oom = set(result.out_of_memory)
    # Placements that fit first, as `optimize` chooses: a faster one that does not fit cannot run.
    rows = sorted((result.evaluated or result.baselines).items(), key=lambda kv: (kv[0] in oom, kv[1]))
    width = max([len(m) for m, _ in rows] + [len(result.method_used), 6])
    lines = [f"{'method':<{width}}  step time (ms)  x lower bound"]
    for method, step in rows:
        mark = ("  out of memory" if method in oom else "") + ("  <- chosen" if method == result.method_used else "")
        lines.append(f"{method:<{width}}  {step * 1e3:14.3f}  {_ratio(step, result.lower_bound_s)}{mark}")
    lines.append(f"lower bound {result.lower_bound_s * 1e3:.3f} ms; {result.placement.notes}; "
                 f"{'OUT OF MEMORY; ' if result.oom else ''}placed in {result.placement_time_s:.1f} s")
    return "\n".join(lines)


def _cmd_simulate(args) -> int:
    from tfplaceto import errors
    from tfplaceto.outputs import OutputSet

    outputs = OutputSet({"--gantt": args.gantt, "--trace": args.trace},
                        inputs=[args.source, args.placement], overwrite=args.overwrite)
    import tfplaceto as tp

    with outputs:
        op_graph = tp.import_graph(args.source, fetches=args.fetch, batch_size=args.batch_size,
                                   cluster=args.cluster)
        placement = tp.Placement.load(args.placement)
        sim = tp.simulate(op_graph, placement, args.cluster)
        if args.trace:
            sim.save_chrome_trace(outputs.stage(args.trace))
        if args.gantt:
            sim.plot_gantt(outputs.stage(args.gantt))
    print(f"step time {sim.step_time_s * 1e3:.3f} ms, {errors.format_bytes(sim.transfer_bytes)} moved, "
          f"{'OOM' if sim.oom else 'fits'}")
    for device, limit in zip(sim.device_names, sim.memory_limit_bytes):
        peak = sim.peak_memory_bytes[device]
        print(f"  {device}: busy {sim.busy_s[device] * 1e3:.3f} ms, peak memory {errors.format_bytes(peak)} "
              f"of {errors.format_bytes(limit)}{' OUT OF MEMORY' if peak > limit else ''}")
    return 0


def _cmd_bench(args) -> int:
    from tfplaceto.outputs import OutputSet

    outputs = OutputSet({"--out": args.out, "--plot": args.plot}, inputs=args.graphs or (),
                        overwrite=args.overwrite)
    from tfplaceto import bench

    graphs = args.graphs or bench.DEFAULT_GRAPHS
    clusters = args.clusters or bench.DEFAULT_CLUSTERS
    methods = args.methods or bench.DEFAULT_METHODS
    bench.check_arguments(graphs, clusters, methods)  # before importing any graph
    with outputs:
        rows = bench.run_bench(graphs, clusters, methods, seed=args.seed, budget_s=args.budget_s,
                               log=lambda line: print(line, file=sys.stderr), batch_size=args.batch_size,
                               fetches=args.fetch)
        table = bench.format_table(rows)
        bench.save_json(rows, outputs.stage(args.out))
        if args.plot:
            bench.plot(rows, outputs.stage(args.plot))
    print(table)
    return 0


def _cmd_train(args) -> int:
    import gin

    from tfplaceto import errors
    from tfplaceto.rl import (
        learner,  # imports rl.train: registers train() with gin before the config is parsed
    )

    if args.episodes < 1:
        raise errors.TfplacetoError(f"--episodes must be at least 1, got {args.episodes}")
    try:
        gin.clear_config()  # main() may run more than once in a process (tests, notebooks)
        gin.parse_config_files_and_bindings([_gin_file(path) for path in args.gin], args.gin_param)
    except (OSError, ValueError, KeyError) as e:
        raise errors.TfplacetoError(f"bad gin configuration: {errors.first_line(e)}") from None
    sources = _train_sources(args)
    if args.actors < 0:
        raise errors.TfplacetoError(f"--actors must be at least 0, got {args.actors}")
    result = learner.train_sources(sources, args.cluster, args.episodes, args.logdir, seed=args.seed,
                                   actors=args.actors, reverb_address=args.reverb_address,
                                   select_sources=_select_sources(args))
    with open(os.path.join(args.logdir, "operative_config.gin"), "w") as f:
        f.write(gin.operative_config_str())
    print(f"{result.episodes} episodes, {result.decisions} decisions in {result.wall_s:.0f} s; "
          f"policy: {result.policy_dir} (use --method placeto_policy --policy {result.policy_dir})")
    return 0


def _select_sources(args) -> list[str] | None:
    """The validation graphs of `--select-members` (those members of every `--family`), or None."""
    from tfplaceto import errors

    if args.select_members is None:
        return None
    if not args.family:
        raise errors.TfplacetoError("--select-members needs --family")
    try:
        members = sorted({int(m) for m in args.select_members.split(",") if m.strip()})
    except ValueError:
        raise errors.TfplacetoError(f"--select-members takes member numbers, e.g. 50,51; got "
                                    f"{args.select_members!r}") from None
    for family in _families(args):
        trained = _training_members(args, family)
        if not members or set(trained) & set(members):
            raise errors.TfplacetoError(f"--select-members needs members not trained on (not {family} "
                                        f"{', '.join(map(str, trained))}); got {args.select_members!r}")
    return [f"builtin:{family}/{member}" for family in _families(args) for member in members]


def _gin_file(path: str) -> str:
    """`path`, or the packaged file it names when not found as given: `--gin
    tfplaceto/policy/train.gin` works from any directory, not only a checkout."""
    import tfplaceto

    packaged = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(tfplaceto.__file__))), path)
    return packaged if not os.path.exists(path) and os.path.exists(packaged) else path


def _train_sources(args) -> list[str]:
    """The sources `tfplaceto train` trains on: `--family` members (`_training_members`), or `--graph`s."""
    if not args.family:
        return args.graph
    return [f"builtin:{family}/{member}" for family in _families(args) for member in _training_members(args, family)]


def _training_members(args, family: str) -> list[int]:
    """The `--num-graphs` members of `family` trained on: 0 .. N-1, or with `--members cover`
    those that cover its kinds of member (`builtin.covering_members`)."""
    from tfplaceto import errors
    from tfplaceto.graph.builtin import covering_members

    if args.num_graphs < 1:
        raise errors.TfplacetoError(f"--num-graphs must be at least 1, got {args.num_graphs}")
    if args.members == "first":
        return list(range(args.num_graphs))
    return sorted(covering_members(family, args.num_graphs))


def _families(args) -> list[str]:
    """The names in `--family`."""
    from tfplaceto import errors

    families = [f.strip() for f in args.family.split(",") if f.strip()]
    if not families:
        raise errors.TfplacetoError(f"--family needs a family name, got {args.family!r}")
    return families


def _cmd_actor(args) -> int:
    from tfplaceto import errors
    from tfplaceto.rl.actor_process import run_actor
    from tfplaceto.rl.reverb_items import parse_address

    parse_address(args.reverb_address)
    if args.batches is not None and args.batches < 1:
        raise errors.TfplacetoError(f"--batches must be at least 1, got {args.batches}")
    actor_id = 1000 + os.getpid() % 100000 if args.actor_id is None else args.actor_id
    written = run_actor(args.reverb_address, actor_id, incarnation=args.incarnation, parent_pid=args.parent_pid,
                        batches=args.batches, connect_timeout_s=args.connect_timeout_s, exit_when_gone=True)
    print(f"actor {actor_id}: wrote {written} batches")
    return 0


def _cmd_ensemble(args) -> int:
    from tfplaceto.policy.checkpoint import ensemble_policies

    network = ensemble_policies(args.policies, args.out, overwrite=args.overwrite)
    print(f"wrote {args.out}: an ensemble of {len(network.members)} networks "
          f"(--policy {args.out}, policy={args.out!r})")
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
                                 batch_size=args.batch_size, overwrite=args.overwrite)
    print(_format_table(result))
    print(f"wrote {args.dst}")
    return 0


def main(argv: list[str] | None = None) -> int:
    _quiet_tensorflow()
    args = _parser().parse_args(argv)
    from tfplaceto import errors

    _one_line_warnings()
    handlers = {"place": _cmd_place, "simulate": _cmd_simulate, "models": _cmd_models, "bench": _cmd_bench,
                "train": _cmd_train, "actor": _cmd_actor, "ensemble": _cmd_ensemble, "rewrite-saved-model": _cmd_rewrite_saved_model,
                "calibrate": _cmd_calibrate}
    from tfplaceto import progress

    try:
        _check_command_args(args)
        with progress.reporting(progress.wanted()):
            return handlers[args.command](args)
    except errors.TfplacetoError as e:
        print(f"tfplaceto: error: {errors.first_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tfplaceto: interrupted", file=sys.stderr)
        return 130
    except SystemError as e:  # numba's compiled simulator re-raises Ctrl-C as a SystemError
        if not isinstance(e.__cause__ or e.__context__, KeyboardInterrupt):
            raise
        print("tfplaceto: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
