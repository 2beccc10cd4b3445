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
pair's tensors over an average link. y_ij > 0.5 makes j the favourite child of i (the two
constraints on the sums guarantee at most one each way). A tiny reward for y (weighted by c)
breaks the LP's many ties off the critical path towards keeping heavy transfers local.
The LP is solved by HiGHS through `scipy.optimize.linprog(method="highs")` (Baechi used Gurobi).

The schedule is m-ETF's (`m_etf.schedule`, memory- and kernel-aware, ties placed whole) with one
change: once a node is placed, its favourite child prefers the parent's device as long as it
starts there no later than on the best other device plus the pair's transfer time.

The LP has one variable per data pair plus one per node; past MAX_LP_VARIABLES, or when HiGHS
fails or runs out of time, m-SCT falls back to plain m-ETF (and warns).
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.optimize
import scipy.sparse

from tfplaceto.baselines import _common, m_etf
from tfplaceto.problem import Problem

MAX_LP_VARIABLES = 400_000
LP_TIME_LIMIT_S = 20.0


def place(problem: Problem, seed: int = 0, budget_s: float | None = None) -> np.ndarray:
    del seed  # HiGHS and the schedule are deterministic
    inst = _common.prepare(problem)
    _common.check_persistent_fits(problem, inst)
    time_limit = LP_TIME_LIMIT_S if budget_s is None else max(1.0, 0.8 * budget_s)
    favourites = favourite_children(inst, time_limit)
    if favourites is None:
        return m_etf.schedule(problem, inst)
    child, bonus = favourites
    return m_etf.schedule(problem, inst, favourite_child=child, favourite_bonus=bonus)


def favourite_children(inst: _common.Instance, time_limit_s: float = LP_TIME_LIMIT_S):
    """(favourite child of each node or -1, transfer seconds to it), or None if the LP failed."""
    n = inst.num_nodes
    data = np.flatnonzero(inst.pair_tensors > 0)
    if len(data) == 0:
        return np.full(n, -1), np.zeros(n)
    if len(data) + n + 1 > MAX_LP_VARIABLES:
        warnings.warn(f"m_sct: the favourite-child LP would have {len(data) + n + 1} variables "
                      f"(limit {MAX_LP_VARIABLES}); falling back to m_etf", stacklevel=3)
        return None
    solution = _solve_lp(inst, data, time_limit_s)
    if solution is None:
        return None
    favourite = data[solution > 0.5]
    child = np.full(n, -1)
    bonus = np.zeros(n)
    child[inst.pair_src[favourite]] = inst.pair_dst[favourite]
    bonus[inst.pair_src[favourite]] = inst.mean_transfer_s(favourite)
    return child, bonus


def _solve_lp(inst: _common.Instance, data: np.ndarray, time_limit_s: float) -> np.ndarray | None:
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
