"""METIS: a balanced min-cut partition of the graph, one part per accelerator.

The graph is made undirected (both directions of every data pair, bytes summed) and partitioned
by METIS (Karypis and Kumar, SIAM J. Sci. Comput. 1998) through pymetis into as many parts as
there are accelerators, balancing vertex weights (compute on the fastest candidate device) while
minimizing the weight of the cut edges (tensor bytes). This is the classic "partition the graph,
ignore the schedule" baseline (Mirhoseini et al. 2017 compare against Scotch/METIS the same way):
transfers are few, but parts run one after another when the graph is a chain of layers.

Weights are scaled to integers (METIS wants positive ints): vertices to about 10^6 in total,
edges to at most 10^5 each (1 for zero-byte tensors). Control edges carry no bytes and are left
out. Part k goes to the k-th accelerator. The partition is then repaired (`common.repair`):
kernels, ties (each class to the device holding most of its compute), persistent memory and
simulated peak memory (smallest-compute classes move to the device with the most free memory).
"""

from __future__ import annotations

import numpy as np
import pymetis

from tfplaceto.baselines import common
from tfplaceto.problem import Problem


def place(problem: Problem, seed: int = 0, budget_s: float | None = None) -> np.ndarray:
    del budget_s  # one METIS call
    inst = common.prepare(problem)
    common.check_persistent_fits(problem, inst)
    parts = common.accelerator_indices(problem)
    if len(parts) == 1 or inst.num_nodes <= 1:
        device_of = np.full(inst.num_nodes, parts[0])
    else:
        device_of = parts[partition(inst, len(parts), seed)]
    return common.repair(problem, inst, device_of)


def partition(inst: common.Instance, num_parts: int, seed: int = 0) -> np.ndarray:
    """Part index of every node: METIS k-way on compute-weighted nodes and byte-weighted edges."""
    n = inst.num_nodes
    data = inst.pair_tensors > 0
    # Pairs are unique and a DAG has no (j, i) next to (i, j): each undirected edge appears once.
    lo, hi, weight = inst.pair_src[data], inst.pair_dst[data], inst.pair_bytes[data]
    scale = min(1e5, 1e8 / max(len(lo), 1)) / max(weight.max(initial=0.0), 1.0)
    edge_weight = 1 + np.floor(weight * scale).astype(np.int64)
    src = np.concatenate([lo, hi])
    dst = np.concatenate([hi, lo])
    both = np.concatenate([edge_weight, edge_weight])
    order = np.lexsort((dst, src))
    xadj = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=xadj[1:])

    work = np.where(np.isfinite(inst.fastest), inst.fastest, 0.0)
    vertex_weight = 1 + np.floor(work / max(work.sum(), 1e-30) * 1e6).astype(np.int64)
    options = pymetis.Options(seed=int(seed) % (2**31))
    adjacency = pymetis.CSRAdjacency(adj_starts=xadj.tolist(), adjacent=dst[order].tolist())
    _, membership = pymetis.part_graph(num_parts, adjacency, vweights=vertex_weight.tolist(),
                                       eweights=both[order].tolist(), options=options)
    return np.asarray(membership, np.int64)
