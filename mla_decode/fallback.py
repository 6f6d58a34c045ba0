"""Observable fallbacks.

Every time the package takes a slower path than the one it meant to take,
it calls report(): the first time for a given reason (the whole message:
path, reason and the exception's type and text) a RuntimeWarning is issued,
so it can be fixed, and with MLA_DECODE_STRICT=1 the fallback raises
instead, so a benchmark or CI run cannot silently measure the wrong thing.
Only platform reasons are reported here (no native library, no kernel for a
device or format); bad input raises where it is found.
"""

from __future__ import annotations

import os
import warnings

_seen: set[str] = set()


class FallbackError(RuntimeError):
    """Raised instead of falling back when MLA_DECODE_STRICT=1."""


def strict() -> bool:
    return os.environ.get("MLA_DECODE_STRICT", "0").lower() in ("1", "true", "yes", "on")


def report(path: str, reason: str, exc: BaseException | None = None) -> None:
    msg = f"mla_decode: falling back from {path}: {reason}"
    if exc is not None:
        msg += f" ({type(exc).__name__}: {exc})"
    if strict():
        raise FallbackError(msg + " [MLA_DECODE_STRICT=1]") from exc
    if msg not in _seen:
        _seen.add(msg)
        warnings.warn(msg + " (set MLA_DECODE_STRICT=1 to make this an error)", RuntimeWarning, stacklevel=3)


def reset() -> None:
    """Forget which fallbacks were reported (for tests)."""
    _seen.clear()
