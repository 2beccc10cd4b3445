"""The package's file utilities: every file it writes is written here, atomically and durably, all
or nothing, never over an input, no temporaries left behind; its proto files are read back here.

- `atomic_write(path, data)`: a temporary file beside `path`, synced to disk, then one rename
  (and a sync of the directory), so a reader never sees half a file, even after a crash; an
  OSError becomes `OutputPathError` (one line, the path and the reason).
- `atomic_directory(directory)`: the same for a whole directory (a trained policy, a rewritten
  SavedModel): fill the temporary it yields; on a clean exit it replaces `directory`.
- `read_proto(path, proto_type, error_type)`: a binary proto file back, or one line of error.
- `check_output_path(path, ...)`: the checks to run before any work: a non-empty path, not a
  directory, its directory writable (probed, not guessed from permission bits: root is refused by
  /proc too), not an input or inside one, and existing only when overwriting is allowed.
- `OutputSet`: the outputs of one command as a transaction. All paths are checked when it is made
  (before the work); `stage(path)` gives a temporary path beside each output for the writer; on a
  clean exit every staged file is synced and renamed into place, on any exception (Ctrl-C
  included) every temporary is removed and nothing is written.
- Temporaries are named `.tfplaceto-tmp-<pid>-<random>-<name>`. A SIGKILLed run cannot remove
  its own, so `remove_stale_temporaries(directory)` deletes those whose process is gone; every
  write into a directory calls it first.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator

from tfplaceto import errors

TMP_PREFIX = ".tfplaceto-tmp-"
_TMP_NAME = re.compile(re.escape(TMP_PREFIX) + r"(\d+)-")


def _prefix() -> str:
    return f"{TMP_PREFIX}{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's live process (or an impossible pid): leave it alone
    return True


def remove_stale_temporaries(directory: str | os.PathLike) -> list[str]:
    """Deletes tfplaceto temporaries in directory whose process is gone; returns their paths."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        match = _TMP_NAME.match(name)
        if not match or _alive(int(match[1])):
            continue
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(path)
    return removed


def make_temp_dir(directory: str) -> str:
    """A private temporary directory in `directory` (created with its parents), named as ours."""
    _makedirs(directory)
    remove_stale_temporaries(directory)
    try:
        return tempfile.mkdtemp(dir=directory, prefix=_prefix())
    except OSError as e:
        raise _path_error(directory, e) from None


def _makedirs(directory: str) -> None:
    ancestor = _existing_ancestor(directory)
    if not os.path.isdir(ancestor):  # makedirs would say "File exists", which misleads
        raise errors.OutputPathError(f"cannot write under {directory!r}: {ancestor!r} is not a directory")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise _path_error(directory, e) from None


def _path_error(path, error: OSError) -> errors.OutputPathError:
    reason = error.strerror or type(error).__name__
    return errors.OutputPathError(f"cannot write {os.fspath(path)!r}: {reason}")


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Writes data to path through a temporary file and a rename, so a reader never sees half.

    Raises OutputPathError (also an OSError) when the path cannot be written.
    """
    path = os.fspath(path)
    if not path:
        raise errors.OutputPathError("an output path is empty")
    directory = os.path.dirname(os.path.abspath(path))
    _makedirs(directory)
    remove_stale_temporaries(directory)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=_prefix(), suffix="-" + os.path.basename(path))
        # mkstemp makes the file private (0600); give it the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_directory(directory)
    except OSError as e:
        _discard(tmp)
        raise _path_error(path, e) from None
    except BaseException:
        _discard(tmp)
        raise


@contextlib.contextmanager
def atomic_directory(directory: str | os.PathLike) -> Iterator[str]:
    """Yields a temporary directory beside `directory` for the caller to fill.

    On a clean exit its files are synced and it replaces `directory` in one rename (an existing
    `directory` is moved aside to another temporary first, and deleted after); on any exception
    the temporary is removed and an existing `directory` is left as it was. An OSError becomes
    `OutputPathError`. Temporaries are named as ours (`make_temp_dir`), so a SIGKILLed run's are
    removed by the next write beside them.
    """
    directory = os.fspath(directory)
    parent = os.path.dirname(os.path.abspath(directory))
    tmp = make_temp_dir(parent)
    old = None
    try:
        yield tmp
        _fsync_tree(tmp)
        if os.path.isdir(directory):
            old = make_temp_dir(parent)  # rename cannot replace a directory portably
            os.rename(directory, os.path.join(old, "replaced"))
        os.rename(tmp, directory)
        _fsync_directory(parent)
    except OSError as error:
        _discard(tmp)
        _restore(old, directory)
        raise errors.OutputPathError(f"cannot write {directory!r}: {error.strerror or error}") from None
    except BaseException:
        _discard(tmp)
        _restore(old, directory)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _restore(old: str | None, directory: str) -> None:
    """Puts a directory moved aside back (the rename of the new one did not happen)."""
    if old is None:
        return
    replaced = os.path.join(old, "replaced")
    if os.path.isdir(replaced) and not os.path.lexists(directory):
        os.rename(replaced, directory)
    shutil.rmtree(old, ignore_errors=True)


def _fsync_file(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_directory(directory: str) -> None:
    """Makes a rename in `directory` durable (where the file system lets a directory be synced)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a directory; the rename is still atomic
    finally:
        os.close(fd)


def _fsync_tree(root: str) -> None:
    """Syncs every file under root, then every directory (deepest first)."""
    directories = []
    for path, _, files in os.walk(root):
        directories.append(path)
        for name in files:
            _fsync_file(os.path.join(path, name))
    for path in reversed(directories):
        _fsync_directory(path)


def read_proto(path: str | os.PathLike, proto_type, error_type: type[Exception]):
    """Parses a binary proto file; an unreadable or malformed file raises error_type, one line."""
    proto = proto_type()
    try:
        with open(path, "rb") as f:
            proto.ParseFromString(f.read())
    except OSError as e:
        raise error_type(f"cannot read {path}: {e.strerror}") from None
    except Exception:  # protobuf's DecodeError
        raise error_type(f"{path} is not a tfplaceto {proto_type.DESCRIPTOR.name} proto") from None
    return proto


def _discard(path: str | None) -> None:
    if path is None:
        return
    with contextlib.suppress(OSError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _existing_ancestor(path: str) -> str:
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def is_inside(path: str, directory: str) -> bool:
    """Whether path is directory or lies under it (both absolute, resolved)."""
    return path == directory or os.path.commonpath([path, directory]) == directory


def check_writable_directory(directory: str, label: str) -> None:
    """OutputPathError unless `directory` (or the nearest part of it that exists) is a writable
    directory. Probed with a temporary file, which is removed at once."""
    ancestor = _existing_ancestor(directory)
    if not os.path.isdir(ancestor):
        raise errors.OutputPathError(f"cannot write {label}: {ancestor!r} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=ancestor, prefix=_prefix())
    except OSError as e:
        raise errors.OutputPathError(
            f"cannot write {label}: {ancestor!r} is not writable ({e.strerror or type(e).__name__})") from None
    os.close(fd)
    os.unlink(probe)


def check_output_path(path, *, overwrite: bool, inputs: Iterable = (), label: str = "output",
                      overwrite_hint: str = "pass --overwrite to replace it") -> str:
    """The absolute output path, or a typed error (see the module docstring) before any work.

    inputs: paths the command reads (files or directories; other strings are ignored). An output
    equal to one or inside one is refused even with overwrite.
    """
    if path is None or not isinstance(path, str | os.PathLike) or not os.fspath(path):
        raise errors.OutputPathError(f"the {label} path is empty; give a file name")
    path = os.path.abspath(os.fspath(path))
    real = os.path.realpath(path)
    for source in inputs:
        if not isinstance(source, str | os.PathLike) or not os.path.exists(source):
            continue
        source_real = os.path.realpath(source)
        if is_inside(real, source_real):
            raise errors.OutputExistsError(
                f"the {label} {path!r} would overwrite the input {os.fspath(source)!r}; write it elsewhere")
    if os.path.isdir(path):
        raise errors.OutputPathError(f"the {label} {path!r} is a directory; give a file name")
    if os.path.lexists(path) and not overwrite:
        raise errors.OutputExistsError(f"the {label} {path!r} exists; {overwrite_hint}")
    check_writable_directory(os.path.dirname(path), f"the {label} {path!r}")
    return path


class OutputSet:
    """The outputs of one command, written together or not at all (see the module docstring).

    Args:
      paths: label -> output path (None entries are skipped), all checked now.
      inputs: paths the command reads; no output may be one or lie inside one.
      overwrite: whether existing outputs may be replaced.

    Use as a context manager: `with OutputSet(...) as outputs: writer(outputs.stage(path))`.
    """

    def __init__(self, paths: dict[str, str | os.PathLike | None], *, inputs: Iterable = (),
                 overwrite: bool = False):
        inputs = list(inputs)
        self._final: dict[str, str] = {}  # original path -> absolute path
        seen: dict[str, str] = {}
        for label, path in paths.items():
            if path is None:
                continue
            final = check_output_path(path, overwrite=overwrite, inputs=inputs, label=label)
            real = os.path.realpath(final)
            if real in seen:
                raise errors.OutputExistsError(f"{seen[real]} and {label} are the same file {path!r}; "
                                               "give each output its own path")
            seen[real] = label
            self._final[os.fspath(path)] = final
        self._staged: dict[str, str] = {}  # absolute final path -> temporary path
        self._made_dirs: list[str] = []

    def stage(self, path: str | os.PathLike) -> str:
        """A temporary path beside `path` (one of this set's outputs) for its writer to fill."""
        final = self._final[os.fspath(path)]
        directory = os.path.dirname(final)
        missing = []
        parent = directory
        while not os.path.exists(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        _makedirs(directory)
        self._made_dirs.extend(reversed(missing))
        remove_stale_temporaries(directory)
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=_prefix(), suffix="-" + os.path.basename(final))
        except OSError as e:
            raise _path_error(final, e) from None
        os.close(fd)
        self._staged[final] = tmp
        return tmp

    def commit(self) -> None:
        try:
            for final, tmp in self._staged.items():
                _fsync_file(tmp)
                os.replace(tmp, final)
            for directory in {os.path.dirname(final) for final in self._staged}:
                _fsync_directory(directory)
        except OSError as e:
            self.discard()
            raise _path_error(final, e) from None
        self._staged.clear()

    def discard(self) -> None:
        for tmp in self._staged.values():
            _discard(tmp)
        self._staged.clear()
        for directory in reversed(self._made_dirs):  # innermost first; only the ones we made
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        self._made_dirs.clear()

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()
