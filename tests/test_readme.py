"""README.md runs as written: its Python blocks and `tfplaceto` commands, in order, in a fresh
temporary directory, as a new user would type them.

One driver process (a fresh one: the README creates logical devices before TensorFlow builds
anything) executes the ```python blocks in one namespace and, in the full run, each `tfplaceto`
line of the ```sh blocks through `python -m tfplaceto` in that directory, where the blocks'
files are. `make` lines (they build a virtualenv) are not run, nor are ```bash blocks: they show
commands for the reader's own files or machines (a model.pb, a learner's host, a TF cluster's
addresses), which a test here does not have. Training budgets are cut to a
couple of episodes (TRAINING_CUTS, the only change made to what the README says); everything else
runs as written.

- `test_readme_python_blocks` (the fast suite): the Python blocks.
- `test_readme_python_blocks_and_commands` (slow): the blocks and the commands, in README order.
"""

import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")

# The README's training budgets, cut so the run takes seconds (the README's figures are real runs).
TRAINING_CUTS = (("episodes=1024", "episodes=2, lanes=2"),
                 ("--episodes 2048", "--episodes 2 --gin-param train.lanes=2"),
                 ("--episodes 1024", "--episodes 2 --gin-param train.lanes=2"))

_DRIVER = r'''
import json, os, shlex, subprocess, sys


def main():
    steps = json.load(open(sys.argv[1]))
    namespace = {"__name__": "__main__"}  # as a user's script: LocalTFCluster's workers need the guard
    for kind, text, line in steps:
        print(f"README.md:{line}: {kind}", flush=True)
        if kind == "python":
            exec(compile(text, f"README.md:{line}", "exec"), namespace)
        else:
            argv = shlex.split(text)
            result = subprocess.run([sys.executable, "-m", "tfplaceto", *argv[1:]], capture_output=True, text=True)
            sys.stdout.write(result.stdout)
            if result.returncode != 0:
                sys.exit(f"README.md:{line}: `{text}` exited with {result.returncode}:\n{result.stderr[-3000:]}")
    print("README OK")


if __name__ == "__main__":  # multiprocessing's spawned workers import this file again
    main()
'''


def readme_steps(commands: bool) -> list[tuple[str, str, int]]:
    """(kind, text, line) of every Python block and, if `commands`, every `tfplaceto` command."""
    lines = open(README).read().splitlines()
    steps, block, kind, start = [], [], None, 0
    for number, line in enumerate(lines, 1):
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and kind is None:
            kind, block, start = fence.group(1) or "text", [], number + 1
        elif fence:
            if kind == "python":
                steps.append(("python", "\n".join(block), start))
            elif kind == "sh" and commands:
                for offset, command in enumerate(block):
                    command = command.split("  #")[0].strip()
                    if command.startswith("tfplaceto "):
                        steps.append(("command", command, start + offset))
            kind = None
        elif kind is not None:
            block.append(line)
    for cut_from, cut_to in TRAINING_CUTS:
        steps = [(k, text.replace(cut_from, cut_to), n) for k, text, n in steps]
    return steps


def _run_readme(tmp_path, commands: bool) -> str:
    steps = readme_steps(commands)
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    (tmp_path / "driver.py").write_text(_DRIVER)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": REPO, "MPLBACKEND": "Agg"}
    env.pop("TFPLACETO_PROGRESS", None)
    result = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "steps.json")],
                            cwd=work, capture_output=True, text=True, timeout=3600, env=env)
    assert result.returncode == 0 and "README OK" in result.stdout, \
        result.stdout[-3000:] + "\n" + result.stderr[-6000:]
    return result.stdout


def test_readme_has_the_steps_a_newcomer_follows():
    steps = readme_steps(commands=True)
    python = [text for kind, text, _ in steps if kind == "python"]
    commands = [text for kind, text, _ in steps if kind == "command"]
    assert python[0].startswith("import numpy") and "model.compile" in python[0]  # the model comes first
    assert any(c.startswith("tfplaceto train ") for c in commands)
    assert any("simulate" in c and "--placement placed.pb" in c for c in commands)
    assert any(c.startswith("tfplaceto place cnn.keras") for c in commands)


def test_readme_python_blocks(tmp_path):
    out = _run_readme(tmp_path, commands=False)
    assert "PlacementCallback:" in out and "layer " in out  # the callback ran; explain() printed


@pytest.mark.slow
def test_readme_python_blocks_and_commands(tmp_path):
    out = _run_readme(tmp_path, commands=True)
    assert "<- chosen" in out and "step time" in out
    work = tmp_path / "work"
    for path in ("placed.pb", "cells.pb", "r.json", "g.png", "t.json", "sim.png", "results.json", "bench.png",
                 "placed_model", "run/policy", "run_cnn/policy", "run_cells/policy", "placed_policy.pb", "gantt.png", "trace.json"):
        assert (work / path).exists(), path
