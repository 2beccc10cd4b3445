"""Executes the notebooks in notebooks/ and writes them back with their outputs.

    python tools/execute_notebooks.py [NAME.ipynb ...]    (default: every notebook)

Each runs top to bottom in a fresh kernel with the repository on the path (as
tests/test_notebooks.py runs them), and is written back atomically only if every cell succeeded,
so a committed notebook shows what it printed and drew. Cell ids and execution counts are kept
as nbclient leaves them; the kernel's timing metadata is dropped so reruns diff on content only.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(ROOT, "notebooks")


def execute(path: str, timeout_s: int = 3600) -> float:
    """Runs the notebook at path and writes it back with its outputs; returns the seconds taken."""
    import nbclient
    import nbformat

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    notebook = nbformat.read(path, as_version=4)
    began = time.perf_counter()
    nbclient.NotebookClient(notebook, timeout=timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": NOTEBOOKS}}).execute()
    for cell in notebook.cells:
        cell.get("metadata", {}).pop("execution", None)
    mode = os.stat(path).st_mode & 0o777
    handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tfplaceto-tmp-", suffix=".ipynb")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            nbformat.write(notebook, file)
        os.chmod(temporary, mode)  # mkstemp makes it 0600
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    return time.perf_counter() - began


def main(argv: list[str]) -> int:
    names = argv or sorted(n for n in os.listdir(NOTEBOOKS) if n.endswith(".ipynb"))
    for name in names:
        path = name if os.path.exists(name) else os.path.join(NOTEBOOKS, name)
        print(f"{os.path.basename(path)}: executed in {execute(path):.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
