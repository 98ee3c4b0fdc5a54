"""Looking plug-ins up by name: one place that turns an unknown name into a clear error."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def lookup(registry: dict[str, T], name: object, kind: str) -> T:
    """``registry[name]``, or a ``ValueError`` naming the ``kind`` and the choices."""
    try:
        return registry[name]  # type: ignore[index]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {kind} {name!r}; choose one of {', '.join(registry)}") from None
