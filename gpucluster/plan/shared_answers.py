"""Answers a placement asks once (issue 43, docs/placement.md): ranking N candidates of one cloud and
region runs that cloud's preflight N times, and most of what it asks (who the caller is, the
region's vCPU quota and what already runs against it, the newest image, a project's enabled APIs,
its billing, its regional quotas) is the same for every candidate of that place. Inside
`sharing()` a backend's preflight asks each such question through `shared(key, ask)`: the first
asks the cloud, the others get that answer (or the same error) within the placement. Outside it
(a single run's preflight, `doctor`) every call asks, as before.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Hashable, Iterator, TypeVar

T = TypeVar("T")
_ANSWERS: ContextVar["dict[Hashable, tuple[bool, object]] | None"] = ContextVar("gpucluster_shared_answers",
                                                                                  default=None)


@contextmanager
def sharing() -> Iterator[None]:
    """Within the block, `shared` keeps every answer by its key (one placement's preflights)."""
    token = _ANSWERS.set({})
    try:
        yield
    finally:
        _ANSWERS.reset(token)


def shared(key: Hashable, ask: Callable[[], T]) -> T:
    """`ask()` once per key inside `sharing()` (its error, too, is kept and raised again); else `ask()`."""
    answers = _ANSWERS.get()
    if answers is None:
        return ask()
    if key not in answers:
        try:
            answers[key] = (True, ask())
        except Exception as exc:  # noqa: BLE001 - kept as asked: the next candidate gets the same answer
            answers[key] = (False, exc)
    ok, value = answers[key]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]
