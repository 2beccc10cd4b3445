"""Baseline placers: one module per algorithm, all with the same signature.

Each module defines `place(problem, seed=0, budget_s=None) -> np.ndarray`: the device index of
every node of `problem.graph` (see tfplaceto/problem.py), honouring kernels (`problem.allowed`),
colocation ties and device memory, deterministic given `seed`. `METHODS` names them, `get`
imports one (on first use: m-ETF compiles with numba, METIS loads pymetis); `common` holds what
they (and `tfplaceto.search`) share; `tfplaceto.place` is the public entry point.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import numpy as np

from tfplaceto import errors
from tfplaceto.problem import Problem

# method name -> module under tfplaceto.baselines
_MODULES = {
    "single": "single",
    "random": "random_placement",
    "round_robin": "round_robin",
    "expert": "expert",
    "metis": "metis",
    "m_topo": "m_topo",
    "m_etf": "m_etf",
    "m_sct": "m_sct",
    "heft": "heft",
    "local_search": "local_search",
}
METHODS = tuple(_MODULES)

# Baselines tfplaceto.optimize and the policy compare against: fast and deterministic
# (local_search needs a time budget).
COMPARED_BASELINES = ("single", "round_robin", "expert", "metis", "m_topo", "m_etf", "m_sct", "heft")

Placer = Callable[..., np.ndarray]


def get(method: str) -> Placer:
    module = importlib.import_module(f"tfplaceto.baselines.{_MODULES[method]}")
    return module.place


def run(method: str, problem: Problem, seed: int = 0, budget_s: float | None = None) -> np.ndarray:
    """Runs a baseline and checks its answer honours the problem's constraints."""
    device_of = np.asarray(get(method)(problem, seed=seed, budget_s=budget_s), dtype=np.int32)
    if device_of.shape != (problem.num_nodes,):
        raise AssertionError(f"{method} returned shape {device_of.shape}")
    if not problem.allowed[np.arange(problem.num_nodes), device_of].all():
        raise AssertionError(f"{method} placed a node on a device without a kernel for it")
    if (problem.tie(device_of) != device_of).any():
        raise AssertionError(f"{method} split a colocation class")
    return device_of


def starting_placements(problem: Problem, seed: int = 0) -> dict[str, np.ndarray]:
    """{"best baseline name": placement, "single": placement} (one entry if they coincide).

    A memory-aware greedy baseline that finds no room by its own estimate (m-ETF's and m-SCT's
    Baechi estimate holds every output for the whole step) is left out; UnplaceableError only
    if every baseline is."""
    simulator = problem.simulator()
    scored, failed = {}, []
    for method in COMPARED_BASELINES:
        try:
            placement = run(method, problem, seed=seed)
        except errors.UnplaceableError as e:
            failed.append(e)
            continue
        step_time, _, oom = simulator.run(placement)
        scored[method] = ((bool(oom), float(step_time)), placement)
    if not scored and failed:
        raise failed[0]
    best = min(scored, key=lambda m: scored[m][0])
    starts = {best: scored[best][1]}
    if best != "single" and "single" in scored:
        starts["single"] = scored["single"][1]
    return starts
