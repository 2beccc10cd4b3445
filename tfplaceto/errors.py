"""Typed errors raised by tfplaceto.

Every error a user can cause subclasses `TfplacetoError`, so callers (and the CLI) can catch
one type and print one line. Messages say what was wrong and what to do about it.

- `InvalidGraphError`: the graph cannot be parsed, has an unsupported cycle, or a fetch is missing.
- `InvalidClusterError`: unknown preset, no devices, malformed device names, a device outside
    the cluster.
- `UnplaceableError`: an op fits on no device (no kernel for its type, or too little memory).
- `CostProfileError`: a cost profile is unreadable or does not match the graph and cluster.
- `InvalidMethodError`: an unknown placement method.
- `OutputExistsError`: an output path that exists (or overlaps the input) and would be overwritten.
- `OutputPathError`: an output path that cannot be written (a missing or read-only directory, a
    file where a directory is needed, an empty path); also an OSError, for callers catching those.
- `InvalidArgumentError`: a number or option outside its range (budget, seed, batch size, ...).
- `UnknownShapesWarning`: a warning (not an error): the costs of some ops are unknown because
    their shapes are, so a placement is planned on partial costs.
- `ImplementationWarning`: a warning: a graph was imported with another implementation of its
    Keras LSTM/GRU layers (cuDNN kernel or standard loop) than TensorFlow runs on the cluster.
"""


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (or its type name): TensorFlow and gin append
    context lines, and tfplaceto reports one line. TensorFlow's OpError carries its own text in
    `.message`."""
    text = str(getattr(error, "message", "") or error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class TfplacetoError(Exception):
    """Base class of every error tfplaceto raises on bad input."""


class InvalidGraphError(TfplacetoError, ValueError):
    """The graph could not be read, is cyclic, or lacks a requested fetch."""


class InvalidClusterError(TfplacetoError, ValueError):
    """The cluster is unknown, empty or has malformed device names."""


class UnplaceableError(TfplacetoError):
    """An op fits on no device of the cluster (kernels or memory)."""


class CostProfileError(TfplacetoError, ValueError):
    """A cost profile could not be read or does not match the graph or cluster."""


class InvalidMethodError(TfplacetoError, ValueError):
    """An unknown placement method, or one this installation cannot run."""


class OutputExistsError(TfplacetoError, FileExistsError):
    """An output already exists (or overlaps the input) and tfplaceto will not overwrite it."""


class PolicyError(TfplacetoError, ValueError):
    """A named policy directory is missing, corrupted or made for other features."""


class OutputPathError(TfplacetoError, OSError):
    """An output path cannot be written: missing or read-only directory, not a directory, empty."""


class InvalidArgumentError(TfplacetoError, ValueError):
    """A number or option is outside its range (budget, seed, batch size, counts, ...)."""


class UnknownShapesWarning(UserWarning):
    """Some ops have unknown shapes, so their costs are unknown and taken as (near) zero."""


class ImplementationWarning(UserWarning):
    """A graph is costed for a cluster whose device type TensorFlow would run another
    implementation of its Keras LSTM/GRU layers on (cuDNN kernel vs standard loop)."""


def format_bytes(size: float) -> str:
    """A byte count in the largest binary unit that keeps it >= 1 ("512 B", "3.00 MiB")."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size) >= scale:
            return f"{size / scale:.2f} {unit}"
    return f"{int(size)} B"


class CheckpointError(TfplacetoError, ValueError):
    """A training logdir cannot be written, or holds a corrupted or mismatched run."""


class DistributedError(TfplacetoError, RuntimeError):
    """Distributed training failed: the Reverb server, or an actor that keeps failing or differs."""
