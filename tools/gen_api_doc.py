"""Writes docs/API.md, the project's API reference, from the code.

    python tools/gen_api_doc.py          # (re)write docs/API.md
    python tools/gen_api_doc.py --check  # exit 1 when docs/API.md is not what the code says

Every public name of `tfplaceto` (`tfplaceto.__all__`), `tfplaceto.keras` and
`tfplaceto.saved_model` (their `__all__`) gets a section with its signature and its docstring's
first paragraph; the CLI's commands get their one-line help and their options.
`tests/test_api_doc.py` fails when docs/API.md is missing a public name or is out of date.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PATH = os.path.join(ROOT, "docs", "API.md")


def _summary(obj) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.split("\n\n")[0].replace("\n", " ").strip()


def _entry(module: str, name: str, obj) -> list[str]:
    lines = [f"### `{module}.{name}`", ""]
    if inspect.ismodule(obj):
        lines.append(f"Module. {_summary(obj)}")
    elif inspect.isclass(obj) or callable(obj):
        try:
            signature = str(inspect.signature(obj))
        except (TypeError, ValueError):
            signature = "(...)"
        kind = "class" if inspect.isclass(obj) else "def"
        lines += ["```python", f"{kind} {name}{signature}", "```", "", _summary(obj)]
    else:
        lines.append(f"`{name} = {obj!r}`")
    return lines + [""]


def _cli() -> list[str]:
    from tfplaceto import cli

    parser = cli._parser()
    lines = ["## Command line (`tfplaceto`)", ""]
    for action in parser._subparsers._group_actions:
        for name, sub in action.choices.items():
            helps = {a.dest: a.help for a in action._choices_actions}
            lines += [f"### `tfplaceto {name}`", "", helps.get(name) or "", ""]
            for option in sub._actions:
                if option.option_strings and "-h" not in option.option_strings:
                    lines.append(f"- `{', '.join(option.option_strings)}`: {option.help or ''}")
                elif not option.option_strings:
                    lines.append(f"- `{option.dest}` (positional): {option.help or ''}")
            lines.append("")
    return lines


def render() -> str:
    import tfplaceto
    import tfplaceto.keras
    import tfplaceto.saved_model

    lines = ["# tfplaceto API reference", "",
             "Written from the code by `tools/gen_api_doc.py` (`tests/test_api_doc.py` checks it is "
             "current): every public name, its signature and the first paragraph of its docstring. "
             "The README shows how the pieces fit together.", ""]
    for module, names in (("tfplaceto", tfplaceto.__all__), ("tfplaceto.keras", tfplaceto.keras.__all__),
                          ("tfplaceto.saved_model", tfplaceto.saved_model.__all__)):
        lines += [f"## `{module}`", ""]
        namespace = sys.modules[module]
        for name in sorted(names):
            lines += _entry(module, name, getattr(namespace, name))
    return "\n".join(lines + _cli()).rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        with open(PATH) as f:
            current = f.read()
        if current != text:
            print("docs/API.md is out of date: run python tools/gen_api_doc.py", file=sys.stderr)
            return 1
        return 0
    from tfplaceto.outputs import atomic_write

    atomic_write(PATH, text.encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
