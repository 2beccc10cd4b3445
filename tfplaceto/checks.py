"""Checks of the numbers that enter tfplaceto, where they enter.

Every check raises a typed error (`tfplaceto.errors`) whose message names the field and the value,
so a bad number never travels on to loop forever (a NaN link), crash deep inside (a seed numpy
refuses) or be silently taken for another (True for a batch size of 1).

- `check_int(field, value, low, high)`: an int (not a bool) in [low, high].
- `check_real(field, value, low, high, ...)`: a finite real (not a bool) in range.
- `check_budget`, `check_seed`, `check_batch_size`: the arguments of the public verbs.
"""

from __future__ import annotations

import math
import numbers

from tfplaceto import errors

# numpy's seeds are 32-bit unsigned.
MAX_SEED = 2**32 - 1
# A batch beyond this is not a real step, and its tensor sizes would overflow int64 bytes.
MAX_BATCH_SIZE = 2**20


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(field: str, value, low: int, high: int | None = None,
              error: type[errors.TfplacetoError] = errors.InvalidArgumentError) -> int:
    """value as an int; `error` unless it is an integer (not a bool) in [low, high]."""
    if not _is_int(value):
        raise error(f"{field} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise error(f"{field} must be {bound}, got {value}")
    return int(value)


def check_real(field: str, value, low: float = 0.0, high: float = math.inf, *, low_open: bool = False,
               allow_inf: bool = False,
               error: type[errors.TfplacetoError] = errors.InvalidArgumentError) -> float:
    """value as a float; `error` unless it is a real number (not a bool, not NaN) in range.

    low_open: the range excludes low (e.g. a bandwidth must be > 0). allow_inf: +inf is accepted.
    """
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise error(f"{field} must be a number, got {value!r}")
    number = float(value)
    if math.isnan(number) or (math.isinf(number) and not (allow_inf and number > 0)):
        raise error(f"{field} must be a finite number, got {value!r}")
    if number < low or (low_open and number == low) or number > high:
        lower = f"> {low:g}" if low_open else f">= {low:g}"
        raise error(f"{field} must be {lower}" + (f" and <= {high:g}" if high < math.inf else "")
                    + f", got {value!r}")
    return number


def check_budget(budget_s) -> float | None:
    """None, or a finite number of seconds >= 0."""
    return None if budget_s is None else check_real("budget_s", budget_s, 0.0)


def check_seed(seed) -> int:
    """An integer seed in [0, 2**32 - 1] (what numpy accepts)."""
    return check_int("seed", seed, 0, MAX_SEED)


def check_batch_size(batch_size) -> int | None:
    """None, or a positive int up to MAX_BATCH_SIZE (InvalidGraphError: it sizes the graph)."""
    if batch_size is None:
        return None
    return check_int("batch_size", batch_size, 1, MAX_BATCH_SIZE, error=errors.InvalidGraphError)
