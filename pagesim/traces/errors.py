"""How a trace file is refused or repaired: one line naming the file, the line and the problem.

``TraceFormatError`` is a ``ValueError`` whose message reads ``FILE:LINE: problem`` (or ``FILE:
problem`` when no single line is at fault), so the command line prints it as one error line and
exits non-zero. What can be repaired without guessing (a truncated last line, BurstGPT's failed
rows) is repaired and reported through ``warnings`` with the ``TraceWarning`` category, whose
message says what was done; a caller that wants strictness turns those into errors with
``warnings.simplefilter("error", TraceWarning)``.
"""

from __future__ import annotations

import warnings
from os import PathLike


class TraceFormatError(ValueError):
    """A trace file or a trace's columns cannot be used as they are."""

    def __init__(
        self,
        path: str | PathLike[str] | None,
        problem: str,
        line: int | None = None,
        *,
        row: int | None = None,
    ):
        self.path = None if path is None else str(path)
        self.line = line  # 1-based line in the file
        self.row = row  # 0-based request row, when the columns (not a file) are at fault
        self.problem = problem
        where = self.path or "trace"
        if line is not None:
            where = f"{where}:{line}"
        elif row is not None:
            where = f"{where}: request {row}"
        super().__init__(f"{where}: {problem}")

    def at_line_of(self, path: str | PathLike[str], line_of_row) -> TraceFormatError:
        """This row error restated at the file line the row came from."""
        if self.row is None:
            return TraceFormatError(path, self.problem)
        return TraceFormatError(path, self.problem, int(line_of_row[self.row]))


class TraceWarning(UserWarning):
    """Something in a trace file was repaired; the message says what and where."""


def warn(path: str | PathLike[str] | None, message: str, line: int | None = None) -> None:
    where = str(path) if path is not None else "trace"
    if line is not None:
        where = f"{where}:{line}"
    warnings.warn(f"{where}: {message}", TraceWarning, stacklevel=3)
