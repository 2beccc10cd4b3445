"""docs/API.md names every public name and is what tools/gen_api_doc.py writes from the code."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import gen_api_doc  # noqa: E402


def test_every_public_name_is_in_the_api_reference():
    import tfplaceto
    import tfplaceto.keras
    import tfplaceto.saved_model
    from tfplaceto import cli

    with open(gen_api_doc.PATH) as f:
        text = f.read()
    names = [f"tfplaceto.{n}" for n in tfplaceto.__all__]
    names += [f"tfplaceto.keras.{n}" for n in tfplaceto.keras.__all__]
    names += [f"tfplaceto.saved_model.{n}" for n in tfplaceto.saved_model.__all__]
    commands = cli._parser()._subparsers._group_actions[0].choices
    names += [f"tfplaceto {c}" for c in commands]
    missing = [n for n in names if f"### `{n}`" not in text]
    assert not missing, f"docs/API.md lacks {missing}: run python tools/gen_api_doc.py"


def test_the_api_reference_is_current():
    assert gen_api_doc.render() == open(gen_api_doc.PATH).read(), "run python tools/gen_api_doc.py"
