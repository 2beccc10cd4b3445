"""The data-flow picture in README.md ("For contributors") matches the imports.

The picture lists the stages of the package in order (`a, b -> c -> ...`) and the modules every
stage may use. Every `tfplaceto...` import in every module, at the top or inside a function,
must come from the module's own stage, an earlier one or the shared ones; a stage names a module
(`rewrite`, `measure.session`) or a package (`graph`: all its modules), the longest name wins.
"""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tfplaceto"


def _picture() -> tuple[list[list[str]], list[str]]:
    """(stages in order, shared modules) as written in README.md."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## For contributors"):]
    block = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    flow, shared = block.split("used by every stage:")
    stages = [[name.strip() for name in stage.split(",") if name.strip()] for stage in flow.split("->")]
    return stages, [name.strip() for name in shared.split(",") if name.strip()]


def _stage_of(module: str, stages: list[list[str]], shared: list[str]) -> int | None:
    """Index of the stage of a dotted module name below tfplaceto (-1: shared), None: unlisted."""
    best, best_len = None, -1
    for index, names in [(-1, shared), *enumerate(stages)]:
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best_len:
                best, best_len = index, len(name)
    return best


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).with_suffix("")
        parts = list(relative.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts[0] != "protos":
            yield ".".join(parts), path


def _imports(path: pathlib.Path):
    """(line, dotted name below tfplaceto) of every tfplaceto module or name path imports."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "tfplaceto" else \
                [f"tfplaceto.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith("tfplaceto.") and name != "tfplaceto.__version__":
                yield node.lineno, name[len("tfplaceto."):]


def test_the_picture_names_every_module():
    stages, shared = _picture()
    unlisted = [module for module, _ in _modules() if module and _stage_of(module, stages, shared) is None]
    assert not unlisted, f"modules missing from README's picture: {unlisted}"


def test_no_module_imports_from_a_later_stage():
    stages, shared = _picture()
    backwards = []
    for module, path in _modules():
        if not module:
            continue  # tfplaceto/__init__.py exports names from every stage
        own = _stage_of(module, stages, shared)
        for line, imported in _imports(path):
            stage = _stage_of(imported, stages, shared)
            if stage is None or stage > own:
                backwards.append(f"{path.relative_to(ROOT)}:{line} ({module}, stage {own}) imports "
                                 f"{imported} (stage {stage})")
    assert not backwards, "imports against the README's data flow:\n" + "\n".join(backwards)


def test_the_checker_sees_a_backward_import():
    stages, shared = _picture()
    assert _stage_of("graph.grouping", stages, shared) < _stage_of("sim.kernel", stages, shared)
    assert _stage_of("measure.session", stages, shared) < _stage_of("costs", stages, shared) \
        < _stage_of("measure.calibrate", stages, shared)
    assert _stage_of("errors", stages, shared) == -1
