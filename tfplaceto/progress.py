"""Stage status lines on stderr for the long steps (import, profile, baselines, search).

The library calls `stage("profiling ...")` as it goes; nothing is printed unless a caller turned
reporting on with `reporting(True)` (the command line does, when stderr is a terminal or
TFPLACETO_PROGRESS=1; TFPLACETO_PROGRESS=0 silences it). Each line says how long the run has
taken so far, so a long stage is visible as it starts:

    tfplaceto: [  0.0 s] importing builtin:inception_v3
    tfplaceto: [  9.1 s] profiling 21874 ops for 4xV100

`tqdm(...)`: the progress bar of the search and of training, without the TqdmWarning that
`tqdm.auto` gives in a notebook that lacks ipywidgets.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator

ENV = "TFPLACETO_PROGRESS"
_state = {"on": False, "began": 0.0}


def wanted(stream=None) -> bool:
    """Whether the command line reports progress: TFPLACETO_PROGRESS if set, else a terminal."""
    setting = os.environ.get(ENV, "").strip()
    if setting:
        return setting not in ("0", "false", "no")
    stream = stream or sys.stderr
    return bool(getattr(stream, "isatty", lambda: False)())


@contextlib.contextmanager
def reporting(on: bool = True) -> Iterator[None]:
    """Within the block, `stage` prints (when on)."""
    saved = dict(_state)
    _state.update(on=on, began=time.perf_counter())
    try:
        yield
    finally:
        _state.update(saved)


def tqdm(*args, **kwargs):
    """A tqdm bar: the notebook widget when ipywidgets is installed, else the text bar (tqdm.auto
    without ipywidgets warns "IProgress not found" in every notebook and draws text anyway)."""
    try:
        import ipywidgets  # noqa: F401
        from tqdm.auto import tqdm as bar
    except ImportError:
        from tqdm.std import tqdm as bar
    return bar(*args, **kwargs)


def stage(message: str) -> None:
    """One status line on stderr, when reporting is on."""
    if _state["on"]:
        print(f"tfplaceto: [{time.perf_counter() - _state['began']:5.1f} s] {message}", file=sys.stderr, flush=True)


__all__ = ["ENV", "reporting", "stage", "tqdm", "wanted"]
