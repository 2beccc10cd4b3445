"""m-SCT: m-ETF guided by favourite children (Baechi: Jeon et al., SoCC 2020, section 4.3).

SCT ("small communication times", Hanen and Munier, Discrete Applied Math. 1995) decides, for
each data edge (i, j), whether j is i's *favourite child*: the one child that runs right after i on
i's device and so receives i's output for free. It is the rounding of a linear program:

    minimize  w
    s.t.      t_j >= t_i + p_i + c_ij (1 - y_ij)       every pair (i, j) (control pairs: c = 0)
              sum_j y_ij <= 1                          at most one favourite child per node
              sum_i y_ij <= 1                          at most one favourite parent per node
              t_i + p_i <= w                           every exit
              0 <= y <= 1,  t >= 0

with p_i the node's compute on its fastest candidate device and c_ij the transfer time of the
pair's tensors over an average link. j is i's favourite child when y_ij > 1 - cutoff (Baechi's
code rounds x = 1 - y, "i and j apart", and makes j favourite when x <= cutoff, default 0.1; the
two rules differ only when y is exactly 1 - cutoff); should rounding leave a node with two
favourite children or parents, the larger y wins. A tiny reward for y (weighted by c) breaks the
LP's many ties off the critical path towards keeping heavy transfers local. The LP is solved by
HiGHS through `scipy.optimize.linprog(method="highs")` (Baechi's code calls MOSEK through cvxopt).

The schedule is m-ETF's (`m_etf.schedule`, memory- and kernel-aware, ties placed whole) with one
of two favourite-child rules (`RULES`):
- "awake", the paper's (Hanen and Munier; Baechi's `SCTDevice`): a device whose last node's
  favourite child is ready and starts earliest there waits for it, running another node first
  only when that node is urgent (it could not start earlier on any other device);
- "bonus", tfplaceto's earlier rule: ETF's order unchanged, and the favourite child goes to its
  parent's device when it starts there no later than on its best device plus the pair's transfer
  time.
`place` tries every rule, cut-off (`CUTOFFS`) and m-ETF schedule option (`m_etf.OPTIONS`: the
communication model, tie break and input estimate) and keeps the placement the simulator scores
best (one LP, then a few millisecond schedules on a grouped graph); keyword arguments fix any.

The LP has one variable per data pair plus one per node; past MAX_LP_VARIABLES, or when HiGHS
fails or runs out of time, m-SCT falls back to m-ETF (and warns).
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import scipy.optimize
import scipy.sparse

from tfplaceto.baselines import common, m_etf
from tfplaceto.problem import Problem

MAX_LP_VARIABLES = 400_000
LP_TIME_LIMIT_S = 20.0
RULES = ("awake", "bonus")
BAECHI_CUTOFF = 0.1  # Baechi's default (its flag sct_threshold)
CUTOFFS = (BAECHI_CUTOFF, 0.5)


def place(problem: Problem, seed: int = 0, budget_s: float | None = None,
          rule: str | None = None, cutoff: float | None = None, **schedule_options) -> np.ndarray:
    """m-SCT with the given rule, cut-off and m-ETF schedule options (`m_etf.OPTIONS`: comm_model,
    tie_break, inputs), trying every combination of those left None and keeping the placement
    the simulator scores best."""
    del seed  # HiGHS and the schedule are deterministic
    if rule is not None:
        common.choice("m_sct rule", rule, RULES)
    if cutoff is not None and not 0.0 <= cutoff < 1.0:
        raise ValueError(f"m_sct cutoff must be in [0, 1), got {cutoff}")
    unknown = set(schedule_options) - set(m_etf.OPTIONS)
    if unknown:
        raise TypeError(f"m_sct.place got unknown options {sorted(unknown)}; known: "
                        f"rule, cutoff, {', '.join(m_etf.OPTIONS)}")
    inst = common.prepare(problem)
    common.check_persistent_fits(problem, inst)
    time_limit = LP_TIME_LIMIT_S if budget_s is None else max(1.0, 0.8 * budget_s)
    solution = lp_solution(inst, time_limit)
    if solution is None:
        return m_etf.place(problem, **schedule_options)
    variants = {}
    for each_cutoff in CUTOFFS if cutoff is None else (cutoff,):
        child, bonus = favourite_children(inst, *solution, cutoff=each_cutoff)
        for each_rule in RULES if rule is None else (rule,):
            for options in common.combinations(m_etf.OPTIONS, schedule_options):
                variants[(each_rule, each_cutoff, *options.values())] = functools.partial(
                    m_etf.schedule, problem, inst, favourite_child=child, awake=each_rule == "awake",
                    favourite_bonus=bonus if each_rule == "bonus" else np.zeros_like(bonus), **options)
    return common.best_of(problem, variants)[1]


def lp_solution(inst: common.Instance, time_limit_s: float = LP_TIME_LIMIT_S):
    """(data pairs, their y in the LP relaxation), or None (warned) if the LP failed or is too big."""
    n = inst.num_nodes
    data = np.flatnonzero(inst.pair_tensors > 0)
    if len(data) == 0:
        return data, np.zeros(0)
    if len(data) + n + 1 > MAX_LP_VARIABLES:
        warnings.warn(f"m_sct: the favourite-child LP would have {len(data) + n + 1} variables "
                      f"(limit {MAX_LP_VARIABLES}); falling back to m_etf", stacklevel=3)
        return None
    solution = _solve_lp(inst, data, time_limit_s)
    return None if solution is None else (data, solution)


def favourite_children(inst: common.Instance, data: np.ndarray, y: np.ndarray,
                       cutoff: float = BAECHI_CUTOFF) -> tuple[np.ndarray, np.ndarray]:
    """(favourite child of each node or -1, transfer seconds to it): the pairs with
    y > 1 - cutoff, the larger y first where rounding gives a node two."""
    n = inst.num_nodes
    child, parent = np.full(n, -1), np.full(n, -1)
    bonus = np.zeros(n)
    chosen = np.flatnonzero(y > 1.0 - cutoff)
    for k in chosen[np.argsort(-y[chosen], kind="stable")]:
        src, dst = inst.pair_src[data[k]], inst.pair_dst[data[k]]
        if child[src] < 0 and parent[dst] < 0:
            child[src], parent[dst] = dst, src
            bonus[src] = inst.mean_transfer_s(data[k:k + 1])[0]
    return child, bonus


def _solve_lp(inst: common.Instance, data: np.ndarray, time_limit_s: float) -> np.ndarray | None:
    """y of every data pair from the LP relaxation (module docstring), or None on failure."""
    n = inst.num_nodes
    num_pairs = len(inst.pair_src)
    k = len(data)
    p = np.where(np.isfinite(inst.fastest), inst.fastest, 0.0)
    c = np.zeros(num_pairs)
    c[data] = inst.mean_transfer_s(data)
    y_of_pair = np.full(num_pairs, -1)
    y_of_pair[data] = np.arange(k)
    # Variables: y (k), t (n), w (1).
    t0, w = k, k + n
    rows, cols, vals, rhs = [], [], [], []
    # Precedence, one row per pair: t_i - t_j - c_ij y_ij <= -(p_i + c_ij).
    pair_rows = np.arange(num_pairs)
    rows += [pair_rows, pair_rows]
    cols += [t0 + inst.pair_src, t0 + inst.pair_dst]
    vals += [np.ones(num_pairs), -np.ones(num_pairs)]
    rows.append(pair_rows[data])
    cols.append(np.arange(k))
    vals.append(-c[data])
    rhs.append(-(p[inst.pair_src] + c))
    offset = num_pairs
    # At most one favourite child / parent: sum of y over a node's out / in data pairs <= 1.
    for ends in (inst.pair_src[data], inst.pair_dst[data]):
        _, node_row = np.unique(ends, return_inverse=True)
        rows.append(offset + node_row)
        cols.append(np.arange(k))
        vals.append(np.ones(k))
        count = int(node_row.max()) + 1
        rhs.append(np.ones(count))
        offset += count
    # Makespan over the exits: t_i - w <= -p_i.
    exits = np.flatnonzero(np.diff(inst.child_ptr) == 0)
    exit_rows = offset + np.arange(len(exits))
    rows += [exit_rows, exit_rows]
    cols += [t0 + exits, np.full(len(exits), w)]
    vals += [np.ones(len(exits)), -np.ones(len(exits))]
    rhs.append(-p[exits])
    offset += len(exits)

    a_ub = scipy.sparse.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(offset, k + n + 1))
    objective = np.zeros(k + n + 1)
    objective[w] = 1.0
    # Tie-breaker: total reward at most 0.1% of the critical path, proportional to c.
    critical = max(inst.bottom_level(p).max(initial=0.0), 1e-12)
    if c[data].sum() > 0:
        objective[:k] = -1e-3 * critical * c[data] / c[data].sum()
    bounds = np.zeros((k + n + 1, 2))
    bounds[:, 1] = np.inf
    bounds[:k, 1] = 1.0
    try:
        result = scipy.optimize.linprog(objective, A_ub=a_ub, b_ub=np.concatenate(rhs), bounds=bounds,
                                        method="highs", options={"time_limit": float(time_limit_s)})
    except (ValueError, MemoryError) as error:  # HiGHS refusing the model
        warnings.warn(f"m_sct: HiGHS failed ({error}); falling back to m_etf", stacklevel=4)
        return None
    if result.status != 0 or result.x is None:
        warnings.warn(f"m_sct: the favourite-child LP was not solved ({result.message}); falling back "
                      "to m_etf", stacklevel=4)
        return None
    return result.x[:k]
