"""`tfplaceto bench`: every (graph, cluster, method) placed and simulated, as a table and JSON.

`run_bench` imports each graph once, profiles it for each cluster (analytical costs), places it
with each method on the same grouped Problem, and records the simulated step time, its ratio to
the lower bound, OOM, peak memory per device and the time the method took to place. A method
that cannot place a graph (UnplaceableError) gets a row with its error instead of figures.
`format_table` prints one line per (graph, cluster) with the best method marked; `plot` draws
grouped bars (step time / lower bound) into a PNG.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Sequence

import numpy as np

from tfplaceto import checks, errors
from tfplaceto.cluster import as_cluster
from tfplaceto.costs import profile
from tfplaceto.graph import BUILTIN_PREFIX, builtin, import_graph
from tfplaceto.graph.implementations import target_device_type
from tfplaceto.outputs import atomic_write
from tfplaceto.place import METHODS, check_method, place_problem
from tfplaceto.problem import make_problem
from tfplaceto.sim import lower_bound

DEFAULT_GRAPHS = ("inception_v3", "nmt_4l", "nmt_2l_loop", "nasnet")
DEFAULT_CLUSTERS = ("2xK80", "4xK80", "4xV100", "8xV100")
DEFAULT_METHODS = ("single", "round_robin", "expert", "metis", "m_topo", "m_etf", "m_sct", "heft",
                   "local_search")


@dataclasses.dataclass(frozen=True)
class BenchRow:
    graph: str
    cluster: str
    method: str
    step_time_s: float | None
    lower_bound_s: float
    oom: bool | None
    peak_memory_bytes: dict[str, int]
    placement_time_s: float
    error: str = ""

    @property
    def ratio(self) -> float | None:
        """Step time / lower bound; None when unplaced or when the bound is 0 (no compute)."""
        if self.step_time_s is None or self.lower_bound_s <= 0:
            return None
        return self.step_time_s / self.lower_bound_s


def _source(graph_name: str) -> str:
    return graph_name if ":" in graph_name or os.path.exists(graph_name) else f"builtin:{graph_name}"


def check_arguments(graphs: Sequence[str], clusters: Sequence[str], methods: Sequence[str]) -> None:
    """Typed errors for an unknown graph, cluster or method, before any graph is imported."""
    for name in graphs:
        source = _source(name)
        if source.startswith(BUILTIN_PREFIX):
            builtin.check_name(source[len(BUILTIN_PREFIX):])
        elif not os.path.exists(source):
            raise errors.InvalidGraphError(f"graph {name!r} is neither a built-in name nor an existing file")
    for cluster in clusters:
        as_cluster(cluster)
    for method in methods:
        if method == "auto":
            raise errors.InvalidMethodError(f"bench compares methods one by one; name them ({', '.join(METHODS)})")
        check_method(method)


def run_bench(graphs: Sequence[str] = DEFAULT_GRAPHS, clusters: Sequence[str] = DEFAULT_CLUSTERS,
              methods: Sequence[str] = DEFAULT_METHODS, seed: int = 0, budget_s: float | None = None,
              log=print, batch_size: int | None = None, fetches: Sequence[str] | None = None) -> list[BenchRow]:
    """Places and simulates every combination; `log` gets one progress line per step.

    batch_size, fetches: passed to `import_graph` for every graph (a graph file with an unknown
    batch dimension needs batch_size; built-in graphs have their own batch when it is None).
    """
    check_arguments(graphs, clusters, methods)
    seed, budget_s = checks.check_seed(seed), checks.check_budget(budget_s)
    checks.check_batch_size(batch_size)
    rows = []
    for graph_name in graphs:
        source = _source(graph_name)
        imported: dict[str, object] = {}  # per target device type (a Keras LSTM's cuDNN or loop form)
        for cluster_name in clusters:
            cluster = as_cluster(cluster_name)
            device_type = target_device_type(cluster)
            if device_type not in imported:
                start = time.perf_counter()
                imported[device_type] = import_graph(source, fetches, batch_size, cluster=cluster)
                log(f"{graph_name}: {imported[device_type].num_ops} ops imported for {device_type} "
                    f"clusters in {time.perf_counter() - start:.1f} s")
            op_graph = imported[device_type]
            costs = profile(op_graph, cluster)
            bound = lower_bound(op_graph, cluster, costs)
            problem = make_problem(op_graph, cluster, costs)
            simulator = problem.simulator()
            for method in methods:
                start = time.perf_counter()
                try:
                    device_of = place_problem(problem, method, seed, budget_s)
                except errors.UnplaceableError as e:
                    rows.append(BenchRow(graph_name, cluster_name, method, None, bound, None, {},
                                         time.perf_counter() - start, str(e)))
                    log(f"  {cluster_name} {method}: {e}")
                    continue
                elapsed = time.perf_counter() - start
                step, peaks, oom = simulator.run(device_of)
                peak = {d: int(p) for d, p in zip(cluster.device_names, peaks) if p}
                rows.append(BenchRow(graph_name, cluster_name, method, float(step), bound, bool(oom), peak,
                                     elapsed))
                ratio = f"{step / bound:.2f}x bound" if bound > 0 else "bound 0"
                log(f"  {cluster_name} {method}: {step * 1e3:.2f} ms ({ratio})"
                    f"{' OOM' if oom else ''}, placed in {elapsed:.2f} s")
    return rows


def _best(rows: list[BenchRow]) -> BenchRow | None:
    feasible = [r for r in rows if r.step_time_s is not None]
    return min(feasible, key=lambda r: (r.oom, r.step_time_s)) if feasible else None


def format_table(rows: list[BenchRow]) -> str:
    """One line per (graph, cluster): step time in ms per method, the best marked with *."""
    methods = list(dict.fromkeys(r.method for r in rows))
    keys = list(dict.fromkeys((r.graph, r.cluster) for r in rows))
    width = max(10, *(len(m) + 1 for m in methods))
    graph_width = max([14, *(len(label(g)) + 2 for g, _ in keys)])
    cluster_width = max([8, *(len(c) + 2 for _, c in keys)])
    lines = [f"{'graph':<{graph_width}}{'cluster':<{cluster_width}}{'bound':>{width}}"
             + "".join(f"{m:>{width}}" for m in methods),
             "(simulated step time in ms; * best; OOM marked !; - could not place)"]
    for graph, cluster in keys:
        group = [r for r in rows if (r.graph, r.cluster) == (graph, cluster)]
        best = _best(group)
        cells = []
        for method in methods:
            row = next((r for r in group if r.method == method), None)
            if row is None or row.step_time_s is None:
                cells.append(f"{'-':>{width}}")
                continue
            mark = "*" if row is best else ("!" if row.oom else "")
            cells.append(f"{row.step_time_s * 1e3:>{width - 1}.4g}{mark or ' '}")
        lines.append(f"{label(graph):<{graph_width}}{cluster:<{cluster_width}}"
                     f"{group[0].lower_bound_s * 1e3:>{width}.4g}" + "".join(cells))
    return "\n".join(lines)


def label(graph: str) -> str:
    """A row's name: a built-in as given ("cifar10-cells/1", "builtin:" dropped), a file by its
    name without directory and extension ("models/cnn.pb" -> "cnn")."""
    if graph.startswith("builtin:"):
        return graph[len("builtin:"):]
    stem, extension = os.path.splitext(os.path.basename(os.path.normpath(graph)))
    if os.path.exists(graph) or os.path.isabs(graph) or extension in _FILE_EXTENSIONS:
        return stem or graph
    return graph


_FILE_EXTENSIONS = (".pb", ".pbtxt", ".keras", ".h5", ".hdf5")


def save_json(rows: list[BenchRow], path: str) -> None:
    records = [dict(dataclasses.asdict(r), ratio=r.ratio) for r in rows]
    atomic_write(path, json.dumps(records, indent=2).encode())


def plot(rows: list[BenchRow], path: str) -> None:
    """Grouped bars: step time / lower bound per method, one group per (graph, cluster)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r.method for r in rows))
    keys = list(dict.fromkeys((r.graph, r.cluster) for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(keys) * len(methods) / 4), 5))
    width = 0.8 / len(methods)
    for k, method in enumerate(methods):
        ratios = []
        for key in keys:
            row = next((r for r in rows if (r.graph, r.cluster) == key and r.method == method), None)
            ratios.append(row.ratio if row is not None and row.ratio is not None else np.nan)
        ax.bar(np.arange(len(keys)) + k * width, ratios, width, label=method)
    ax.set_xticks(np.arange(len(keys)) + 0.4 - width / 2)
    ax.set_xticklabels([f"{label(g)}\n{c}" for g, c in keys], fontsize=8)
    ax.set_ylabel("simulated step time / lower bound (lower is better)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.legend(fontsize=8, ncol=min(5, len(methods)))
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write(path, buffer.getvalue())
