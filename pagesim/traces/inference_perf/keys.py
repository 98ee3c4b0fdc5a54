"""Values read from inference-perf's files, fetched by key path, and the one error they raise.

inference-perf writes its whole configuration as YAML (``config.yaml``) and its measurements as
JSON; pagesim reads a subset of both. A ``Node`` is one value with the key path that reached it
(``load.stages[1].rate``) and the file it came from, so every problem is one
``InferencePerfError`` line: ``FILE: KEY problem``. Messages describe a bad value ("found a
string") rather than quote it (``pagesim.engine.files``' rule: a file's content is never echoed), except a
short identifier such as an unsupported ``data.type``, which is quoted because naming it is the
point.

A key that is absent and a key that is ``null`` read the same (inference-perf writes ``null`` for
an unset optional field): ``present`` is False for both. Numbers may be written as numbers or as
numeric strings (pydantic, which inference-perf validates with, accepts both); booleans are never
numbers.
"""

from __future__ import annotations

import re
from os import PathLike

from pagesim.engine.files import describe_value, number_problem

_ABSENT = object()
_IDENTIFIER = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


class InferencePerfError(ValueError):
    """An inference-perf output folder that pagesim cannot read or rebuild; the message is one
    line naming the file and the key (``config.yaml: load.stages[1].rate must be > 0, ...``)."""


class Node:
    """One value of a parsed document, with its key path and its file (for messages)."""

    __slots__ = ("value", "key", "path")

    def __init__(self, value, key: str, path: str | PathLike[str]):
        self.value = value
        self.key = key
        self.path = str(path)

    def error(self, problem: str) -> InferencePerfError:
        """``FILE: KEY problem`` (``FILE: problem`` at the document's top)."""
        return InferencePerfError(f"{self.path}: {self.key} {problem}" if self.key else f"{self.path}: {problem}")

    @property
    def present(self) -> bool:
        return self.value is not _ABSENT and self.value is not None

    @property
    def given(self) -> bool:
        """Whether the key is written at all (even as ``null``): how a version's fields are told apart."""
        return self.value is not _ABSENT

    def __getitem__(self, name: str) -> Node:
        key = f"{self.key}.{name}" if self.key else name
        if not self.present:
            return Node(_ABSENT, key, self.path)
        if not isinstance(self.value, dict):
            raise self.error(f"must be a mapping of keys to values, found {describe_value(self.value)}")
        return Node(self.value.get(name, _ABSENT), key, self.path)

    def either(self, *names: str) -> Node:
        """The child under whichever of ``names`` (a field and its alias) is written; both is an error."""
        written = [self[name] for name in names if self[name].given]
        if len(written) > 1:
            raise self.error(f"gives both {written[0].key.rsplit('.', 1)[-1]} and "
                             f"{written[1].key.rsplit('.', 1)[-1]} (one field under two names): keep one")
        return written[0] if written else self[names[0]]

    def required(self) -> Node:
        if self.value is _ABSENT:
            raise self.error("is missing")
        if self.value is None:
            raise self.error("is null: it needs a value")
        return self

    def number(self, *, minimum: float | None = None, positive: bool = False, maximum: float | None = None,
               integer: bool = False) -> float:
        """The (required) value as a finite number within the bounds (``positive``: > 0)."""
        value = self.required().value
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise self.error("must be a number, found a string") from None
        problem = number_problem(value, minimum=None if positive else minimum, maximum=maximum, integer=integer)
        if problem is None and positive and value <= 0:
            problem = f"must be > 0, found {'zero' if value == 0 else 'a negative number'}"
        if problem is not None:
            raise self.error(problem)
        return float(value)

    def count(self, *, minimum: int = 0, maximum: float | None = None) -> int:
        """The (required) value as a whole number >= ``minimum``."""
        return int(self.number(minimum=minimum, maximum=maximum, integer=True))

    def optional_number(self, **bounds) -> float | None:
        return self.number(**bounds) if self.present else None

    def optional_count(self, **bounds) -> int | None:
        return self.count(**bounds) if self.present else None

    def text(self) -> str:
        value = self.required().value
        if not isinstance(value, str):
            raise self.error(f"must be text, found {describe_value(value)}")
        return value

    def optional_text(self) -> str | None:
        return self.text() if self.present else None

    def flag(self, default: bool) -> bool:
        if not self.present:
            return default
        if not isinstance(self.value, bool):
            raise self.error(f"must be true or false, found {describe_value(self.value)}")
        return self.value

    def choice(self, supported: tuple[str, ...], default: str | None = None) -> str:
        """The value, one of ``supported`` (``default`` when absent, if given)."""
        if not self.present and default is not None:
            return default
        value = self.text()
        if value not in supported:
            what = repr(value) if _IDENTIFIER.fullmatch(value) else "(text that is no such name)"
            raise self.error(f"{what} is not supported (supported: {', '.join(supported)})")
        return value

    def elements(self) -> list[Node]:
        """The (required) value as a list of nodes keyed ``KEY[i]``."""
        value = self.required().value
        if not isinstance(value, list):
            raise self.error(f"must be a list, found {describe_value(value)}")
        return [Node(item, f"{self.key}[{k}]", self.path) for k, item in enumerate(value)]

    def unsupported_if_set(self, why: str) -> None:
        """Refuse a feature pagesim does not model when the key holds anything but null, false or ``[]``."""
        if self.present and self.value is not False and self.value != [] and self.value != {}:
            raise self.error(f"is set, which is not supported: {why}")
