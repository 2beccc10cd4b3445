"""Every error in tfplaceto.errors, raised through the API and reported by the CLI.

The API raises the typed error; the CLI prints one line on stderr, exits with status 2 and writes
nothing at its output paths.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfplaceto as tp
from tfplaceto import errors
from tfplaceto.cli import main


def _graph_with_variable(elements: int, name: str = "big"):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 1], name="x")
        w = tf.compat.v1.get_variable(name, [elements, 1], use_resource=True,
                                      initializer=tf.compat.v1.zeros_initializer())
        tf.matmul(w, x, transpose_b=True, name="y")
    return graph.as_graph_def()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    small = root / "small.pb"
    small.write_bytes(_graph_with_variable(16).SerializeToString())
    # 4 * 1e11 bytes = 400 GB of variable: more than any K80 or the 256 GiB host holds.
    huge = root / "huge.pb"
    huge.write_bytes(_graph_with_variable(10**11).SerializeToString())
    garbage = root / "garbage.profile"
    garbage.write_bytes(b"\xffnot a profile")
    return {"small": str(small), "huge": str(huge), "garbage_costs": str(garbage)}


def test_all_errors_share_a_base_class():
    for error in (errors.InvalidGraphError, errors.InvalidClusterError, errors.UnplaceableError,
                  errors.CostProfileError, errors.InvalidMethodError):
        assert issubclass(error, errors.TfplacetoError)


def test_api_raises_each_typed_error(files):
    op_graph = tp.import_graph(files["small"], batch_size=2)
    with pytest.raises(errors.InvalidGraphError):
        tp.import_graph(files["garbage_costs"])
    with pytest.raises(errors.InvalidClusterError):
        tp.place(op_graph, "9xK80", method="single")
    with pytest.raises(errors.UnplaceableError, match="big"):
        tp.place(tp.import_graph(files["huge"], batch_size=2), "2xK80", method="single")
    with pytest.raises(errors.CostProfileError):
        tp.place(op_graph, "2xK80", method="single", costs=files["garbage_costs"])
    with pytest.raises(errors.InvalidMethodError):
        tp.place(op_graph, "2xK80", method="psychic")
    with pytest.raises(errors.InvalidClusterError):
        tp.simulate(op_graph, {n: "/job:localhost/replica:0/task:0/device:GPU:9" for n in op_graph.names},
                    "2xK80", np.zeros((op_graph.num_ops, 3)))


CLI_CASES = {
    "InvalidGraphError": ("garbage_costs", [], "not"),
    "InvalidClusterError": ("small", ["--cluster", "9xK80"], "9xK80"),
    "UnplaceableError": ("huge", ["--cluster", "2xK80"], "big"),
    "CostProfileError": ("small", ["--costs", "@garbage_costs"], "profile"),
    "InvalidMethodError": ("small", ["--method", "psychic"], "psychic"),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_cli_reports_each_error_in_one_line(files, tmp_path, capsys, case):
    source, extra, expected = CLI_CASES[case]
    out = tmp_path / "out.pb"
    args = ["place", files[source], "--cluster", "2xK80", "--method", "single", "--batch-size", "2",
            "--out", str(out), "--report", str(tmp_path / "report.json")]
    for flag, value in zip(extra[::2], extra[1::2]):
        value = files[value[1:]] if value.startswith("@") else value
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("tfplaceto: error:") and expected in err
    assert not any(tmp_path.iterdir()), "nothing is written on error"
