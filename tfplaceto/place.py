"""`place` and `optimize`: from a graph and a cluster to a placement, the public verbs.

- `place(op_graph, cluster, method)` runs one method (a baseline or the Placeto policy) and
  returns an op-level Placement.
- `optimize(source, ...)` is the one-call flow: import, profile (measured on the local machine,
  analytical for presets), place with the chosen method, compare against the fast baselines, keep
  the best, and write the devices back into the graph. With the default method (`placeto`, a
  search that starts from the best baseline) or `auto`, the result is never worse than the best
  baseline it evaluated; a method named explicitly is honoured: its placement is returned, with
  the baselines' figures beside it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from tfplaceto import baselines, checks, errors, explain, progress
from tfplaceto.baselines import COMPARED_BASELINES
from tfplaceto.cluster import Cluster, as_cluster
from tfplaceto.costs import profile
from tfplaceto.costs.cost_profile import CostProfile
from tfplaceto.costs.unknown_shapes import UnknownShapes, count_unknown_shapes, warn_if_unknown
from tfplaceto.graph import import_graph
from tfplaceto.graph.op_graph import OpGraph
from tfplaceto.placement import Placement
from tfplaceto.problem import Problem, make_problem
from tfplaceto.rewrite import apply_placement
from tfplaceto.sim import Simulator, lower_bound, simulate

METHODS = ("single", "random", "round_robin", "expert", "metis", "m_topo", "m_etf", "m_sct", "heft",
           "local_search", "placeto", "placeto_policy")
POLICY_METHODS = ("placeto", "placeto_policy")
# Methods optimize answers with the best placement it evaluated; any other method named is honoured.
BEST_OF_METHODS = ("placeto", "auto")


def _resolve_costs(op_graph: OpGraph, cluster: Cluster, costs) -> CostProfile:
    if isinstance(costs, CostProfile):
        costs.check(op_graph)
        return costs
    if costs is None:
        costs = "measured" if cluster.name.startswith("local") else "analytical"
    return profile(op_graph, cluster, source=costs)


def check_method(method: str) -> None:
    """InvalidMethodError unless `method` is one of METHODS or "auto" (bench and the Keras
    callback check before importing anything)."""
    if method not in METHODS and method != "auto":
        raise errors.InvalidMethodError(f"unknown method {method!r}; methods: {', '.join(METHODS)}, auto")


def place_problem(problem: Problem, method: str, seed: int = 0, budget_s: float | None = None,
                  policy=None, start: str | None = None) -> np.ndarray:
    """Node-level device indices for a Problem (no expansion to ops)."""
    if method in POLICY_METHODS:
        # Imported here: the policy stack (Sonnet, graph_nets, TF-Agents) loads only when it is used.
        from tfplaceto import placeto
    if method == "placeto":
        return placeto.place(problem, seed=seed, budget_s=budget_s, policy=policy)
    if method == "placeto_policy":
        return placeto.policy_placement(problem, policy=policy, start=start or "random", seed=seed)
    return baselines.run(method, problem, seed=seed, budget_s=budget_s)


def place(op_graph: OpGraph, cluster: Cluster | str, method: str = "placeto", costs=None, seed: int = 0,
          budget_s: float | None = None, policy=None, start: str | None = None) -> Placement:
    """Places every op of op_graph on a device of cluster with one method (see METHODS).

    `policy` (methods placeto and placeto_policy): "shipped" (default: the policy in the
    package), "untrained" (fresh weights: the control) or a trained policy's directory.
    `start` (placeto_policy): where the policy's episode starts, "random" (default: a random
    placement drawn with `seed`), "single" or "baseline".
    """
    seed, budget_s = checks.check_seed(seed), checks.check_budget(budget_s)
    check_method(method)
    if method not in POLICY_METHODS and (policy is not None or start is not None):
        raise errors.InvalidMethodError(f"policy= and start= apply to {' and '.join(POLICY_METHODS)}, "
                                        f"not to {method!r}")
    cluster = as_cluster(cluster)
    costs = _resolve_costs(op_graph, cluster, costs)
    problem = make_problem(op_graph, cluster, costs)
    if method == "auto":
        results = _evaluate(problem, list(COMPARED_BASELINES), seed, _op_simulator(op_graph, cluster, costs))
        method = _best(results)
        device_of = results[method][2]
    else:
        device_of = place_problem(problem, method, seed, budget_s, policy, start)
    return Placement.from_indices(op_graph, cluster, problem.expand(device_of), method, _notes(problem))


def _notes(problem: Problem) -> str:
    if problem.grouping is None:
        return f"placed op by op ({problem.num_nodes} ops)"
    return f"placed on {problem.num_nodes} groups of {problem.grouping.op_graph.num_ops} ops"


def _describe(source) -> str:
    """A few words naming a source for the progress line."""
    if isinstance(source, str | bytes) or hasattr(source, "__fspath__"):
        return str(source)
    name = getattr(source, "name", None)
    return f"{type(source).__name__} {name!r}" if isinstance(name, str) else type(source).__name__


def _op_simulator(op_graph: OpGraph, cluster: Cluster, costs: CostProfile):
    """The simulator that scores candidates: op level, so reported figures match `simulate`."""
    return Simulator(op_graph, cluster, costs.per_device(op_graph, cluster))


def _evaluate(problem: Problem, methods: Sequence[str], seed: int, simulator,
              budget_s: float | None = None, policy=None,
              start: str | None = None) -> dict[str, tuple[bool, float, np.ndarray]]:
    """method -> (oom, simulated step time, node device indices) for each method.

    Placers work on the problem (groups); each answer is scored by the op-level `simulator` on
    the expanded placement. A method that runs out of room is skipped, unless all do.
    """
    results, failures = {}, []
    for method in methods:
        try:
            device_of = place_problem(problem, method, seed, budget_s, policy, start)
        except errors.UnplaceableError as e:  # a greedy placer ran out of room: others may not
            failures.append(e)
            continue
        step_time, _, oom = simulator.run(problem.expand(device_of))
        results[method] = (bool(oom), float(step_time), device_of)
    if not results and failures:
        raise failures[0]
    return results


def _best(results: dict[str, tuple[bool, float, np.ndarray]]) -> str:
    """The method whose placement fits and is fastest (a fitting one before any OOM)."""
    return min(results, key=lambda m: results[m][:2])


@dataclasses.dataclass(frozen=True)
class OptimizeResult:
    """What `optimize` found: the placed graph, its placement and the figures behind the choice."""

    graph_def: object
    placement: Placement
    step_time_s: float
    lower_bound_s: float
    baselines: dict[str, float]
    method_used: str
    oom: bool = False
    placement_time_s: float = 0.0
    op_graph: OpGraph | None = None
    cluster: Cluster | None = None
    costs: CostProfile | None = None
    # Every method evaluated (the baselines and the requested method): method -> step time.
    evaluated: dict[str, float] = dataclasses.field(default_factory=dict)
    # How many compute ops have unknown shapes (so guessed costs), and their share of the estimate.
    unknown_shapes: UnknownShapes | None = None
    # The methods of `evaluated` whose placement runs out of device memory (their step times
    # are what the step would take if it fitted; "placeto" and "auto" choose none of them while
    # another fits, a method named explicitly is returned all the same).
    out_of_memory: tuple[str, ...] = ()

    def simulate(self):
        """The SimResult of the chosen placement (for traces and Gantt charts)."""
        return simulate(self.op_graph, self.placement, self.cluster, self.costs)

    def summary(self) -> dict:
        """The figures as a JSON-able dict (`tfplaceto place --report`): with `memory`, per device
        of the cluster, the simulated peak and the limit in bytes and in GiB, and the busy time."""
        summary = {"method_used": self.method_used, "step_time_s": self.step_time_s, "evaluated": self.evaluated,
                   "out_of_memory": list(self.out_of_memory),
                   "lower_bound_s": self.lower_bound_s, "oom": self.oom, "baselines": self.baselines,
                   "placement_time_s": self.placement_time_s, "notes": self.placement.notes,
                   "loops": self.op_graph.loop_report() if self.op_graph is not None else [],
                   "implementations": self.op_graph.implementation_report() if self.op_graph is not None else [],
                   "devices": sorted(set(self.placement.values())),
                   "unknown_shapes": self.unknown_shapes.as_dict() if self.unknown_shapes else None}
        if self.op_graph is not None and self.cluster is not None:
            sim = self.simulate()
            summary["memory"] = {
                device: {"peak_bytes": sim.peak_memory_bytes[device], "limit_bytes": limit,
                         "peak_gib": round(sim.peak_memory_bytes[device] / 2**30, 4),
                         "limit_gib": round(limit / 2**30, 4), "busy_s": sim.busy_s[device]}
                for device, limit in zip(sim.device_names, sim.memory_limit_bytes)}
        return summary

    def _layers(self):
        if self.op_graph is None or self.cluster is None:
            raise errors.TfplacetoError("this result has no graph or cluster to explain")
        return explain.layer_table(self.op_graph, self.placement, self.cluster, self.costs)

    def explain(self) -> str:
        """A per-layer (name-scope) table of the placement: layer, device, ops, compute ms, bytes
        in and out across devices; then the simulated peak memory per device (GiB)."""
        return explain.format_table(self._layers())

    def device_scopes(self) -> dict[str, str]:
        """Layer name scope (as in `explain()`) -> the device running most of its compute, for
        `with tf.device(scopes[name]):` around that layer in your own model code."""
        return explain.device_scopes(self._layers())


def optimize(graph_def, fetches: Sequence[str] | str | None = None, cluster: Cluster | str = "local",
             method: str = "placeto", costs=None, budget_s: float | None = None, seed: int = 0,
             batch_size: int | None = None, policy=None, start: str | None = None,
             loop_iterations=None) -> OptimizeResult:
    """Imports, profiles, places and writes back; never worse than the best baseline evaluated.

    `graph_def` may be any source `import_graph` accepts; a GraphDef gets its devices set and is
    returned as a copy (the input is not modified); other sources return their imported graph.
    Ops whose costs are guesses (shapes unknown because a graph input has none) are counted in
    `OptimizeResult.unknown_shapes`, with an UnknownShapesWarning when there are any.

    `method`: the default "placeto" (a search from the best baseline) and "auto" (the best
    baseline) return the best placement evaluated; any other method named explicitly returns
    that method's placement, with the baselines' figures in `baselines` for comparison.
    """
    began = time.perf_counter()
    seed, budget_s = checks.check_seed(seed), checks.check_budget(budget_s)
    checks.check_batch_size(batch_size)
    cluster = as_cluster(cluster)
    check_method(method)
    if not isinstance(graph_def, OpGraph):
        progress.stage(f"importing {_describe(graph_def)}")
    op_graph = graph_def if isinstance(graph_def, OpGraph) else import_graph(graph_def, fetches, batch_size,
                                                                              loop_iterations, cluster)
    progress.stage(f"profiling {op_graph.num_ops} ops for {cluster.name}")
    costs = _resolve_costs(op_graph, cluster, costs)
    problem = make_problem(op_graph, cluster, costs)
    compared = list(COMPARED_BASELINES)
    simulator = _op_simulator(op_graph, cluster, costs)
    shapes = count_unknown_shapes(op_graph, simulator.compute_s)
    warn_if_unknown(shapes)
    progress.stage(f"baselines: {', '.join(compared)} on {problem.num_nodes} groups")
    results = _evaluate(problem, compared, seed, simulator)
    # A best step of 0 s (no op has a cost: a constant, ops too small to cost) cannot be improved,
    # and a policy scored relative to it would divide by it.
    settled = bool(results) and results[_best(results)][:2] == (False, 0.0)
    if method not in results and method != "auto" and not (settled and method in POLICY_METHODS):
        budgeted = budget_s is not None and method in (*POLICY_METHODS, "local_search")
        budget = f" (budget {budget_s:g} s)" if budgeted else ""
        progress.stage(f"method {method}{budget}")
        results.update(_evaluate(problem, [method], seed, simulator, budget_s, policy, start))
    chosen = method if method in results and method not in BEST_OF_METHODS else _best(results)
    oom, step_time, device_of = results[chosen]
    placement = Placement.from_indices(op_graph, cluster, problem.expand(device_of), chosen, _notes(problem))
    import tensorflow as tf

    base = graph_def if isinstance(graph_def, tf.compat.v1.GraphDef) else op_graph.graph_def
    placed = apply_placement(base, placement)
    return OptimizeResult(placed, placement, step_time, float(lower_bound(op_graph, cluster, costs)),
                          {m: r[1] for m, r in results.items() if m in compared}, chosen, oom,
                          time.perf_counter() - began, op_graph, cluster, costs,
                          {m: r[1] for m, r in results.items()}, shapes,
                          tuple(m for m, r in results.items() if r[0]))
