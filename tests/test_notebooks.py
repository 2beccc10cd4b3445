"""The notebooks in notebooks/ run from top to bottom (each ends with assertions of its own).

Each runs in a fresh kernel (nbclient) with the repository as working directory and on the
path, so the kernel imports this checkout. 01 and 02 take well under a minute and stay in the
fast set; 03 trains the policy (over a minute) and is marked slow. No output may carry a
TqdmWarning, and the notebooks are committed with their outputs (tools/execute_notebooks.py).
"""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")


def _rl_installed() -> bool:
    try:
        import tfplaceto.rl.train  # noqa: F401
    except ImportError:
        return False
    return True


def _run(name, timeout_s, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=timeout_s, kernel_name="python3",
                                     resources={"metadata": {"path": NOTEBOOKS}})
    client.execute()  # raises CellExecutionError with the failing cell and its traceback
    text = "".join(o.get("text", "") for o in _outputs(notebook, "stream"))
    assert "TqdmWarning" not in text and "IProgress not found" not in text, text
    return notebook


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(NOTEBOOKS) if n.endswith(".ipynb")))
def test_notebooks_are_committed_with_their_outputs(name):
    """A reader on GitHub sees what each cell printed and drew (tools/execute_notebooks.py)."""
    import json

    with open(os.path.join(NOTEBOOKS, name), encoding="utf-8") as file:
        cells = [c for c in json.load(file)["cells"] if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in cells), f"{name}: run tools/execute_notebooks.py {name}"
    assert sum(len(c.get("outputs", [])) for c in cells) >= len(cells) // 2


def _outputs(notebook, output_type):
    return [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
            if o.get("output_type") == output_type]


def test_01_quickstart(monkeypatch):
    notebook = _run("01_quickstart.ipynb", 300, monkeypatch)
    images = [o for o in _outputs(notebook, "execute_result") + _outputs(notebook, "display_data")
              if "image/png" in o.get("data", {})]
    assert images, "the Gantt chart is shown"
    assert any("x lower bound" in o.get("data", {}).get("text/markdown", "")
               for o in _outputs(notebook, "display_data")), "the baselines table is shown"


def test_02_keras_callback(monkeypatch):
    notebook = _run("02_keras_callback.ipynb", 600, monkeypatch)
    text = "".join(o.get("text", "") for o in _outputs(notebook, "stream"))
    assert "PlacementCallback:" in text and "measured step time" in text


@pytest.mark.slow
@pytest.mark.skipif(not _rl_installed(), reason="policy not installed")
def test_03_train_a_policy(monkeypatch):
    notebook = _run("03_train_a_policy.ipynb", 1800, monkeypatch)
    images = [o for o in _outputs(notebook, "display_data") if "image/png" in o.get("data", {})]
    assert images, "the learning curve is shown"
