"""Outputs that are whole or visibly partial: nothing half-written ever appears under its final name.

- ``OutputFolder``: a command's ``--out DIR`` (``simulate``, ``run``, ``validate``). Every file is
  written into a fresh folder beside the target, ``DIR.partial-<pid>``; once the command's work is
  done, the files and that folder are flushed to disk and the folder is renamed to ``DIR`` (an old
  ``DIR`` is first renamed to ``DIR.old-<pid>`` and removed after). On an error or an interrupt
  the partial folder is removed and ``DIR`` keeps what it had. A process killed outright leaves
  ``DIR`` as it was beside a ``DIR.partial-<pid>``; killed between the two renames, ``DIR`` is
  missing and ``DIR.old-<pid>`` (the previous output, whole) and ``DIR.partial-<pid>`` (the new
  one, whole) lie beside it. A ``DIR`` that is a mount point (a container's volume) cannot be
  renamed: the files are staged in ``DIR/.partial-<pid>`` and renamed in one by one, each whole.
  The staging place is made and removed once before the work, so a folder that cannot be written
  is refused before, not after.
- ``staged_files``: several files written together, by path (a study's rewritten
  ``results.jsonl``): each to a staging name beside it (``pagesim.engine.outputs.staging_name``: a fresh
  hidden name, created with ``O_EXCL``, never a user's file), all renamed once every one is
  complete, none left behind on failure. Each target must be a regular file or nothing
  (``pagesim.engine.outputs.OutputFile``, own: a symbolic link is refused, not replaced).
- ``writing(path)`` (``pagesim.engine.outputs``'s, here too): an error while writing ``path`` as one
  ``OSError`` naming it, including a full disk met inside a compressed stream (matplotlib's PDF
  writer then fails again on closing, with a ``zlib.error`` that hides the ``OSError``).

Invariant: a folder is replaced only when everything in it is a file the command itself writes
(``owned``, shell patterns; ``NAME.tmp`` leftovers of older versions and staged leftovers too), so
``--out`` never deletes a file pagesim did not write; a folder holding anything else is refused
before any work, as are ``/``, the home folder and the current folder or one holding it
(``pagesim.engine.output_folders.refuse_unsafe_folder``), and a symbolic link to nothing. Where pagesim may
write at all is ``pagesim.engine.outputs``'s to say; this module makes what it writes whole or nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from pagesim.engine.output_folders import refuse_unsafe_folder
from pagesim.engine.outputs import (STAGING_PATTERN, OutputFile, fsync_path as _fsync_path, naming as _naming, stage_beside,
                            writing)

__all__ = ["OutputFolder", "staged_files", "writing"]


class OutputFolder:
    """``with OutputFolder(out, owned) as staging:`` write the files into ``staging``; a clean exit
    of the block puts them at ``out`` (see the module docstring). Constructing one checks ``out``
    and makes its parent folder, so a bad ``--out`` is refused before the work; entering makes the
    partial folder. An ``OSError`` leaving the block names ``out`` (or its file), not the partial
    folder."""

    def __init__(self, target: str | os.PathLike, owned: tuple[str, ...]):
        self.target = Path(target)  # as the user named it, for messages
        self.owned = owned
        self._real = Path(os.path.realpath(self.target))  # a symlinked folder is replaced where it lies
        self.staging: Path | None = None
        self._keep_staging = False
        self._check()
        self._real.parent.mkdir(parents=True, exist_ok=True)
        # A mount point (a container's volume) cannot be renamed onto: its files are staged inside
        # it and moved in one by one (each whole; the set of them is not one atomic step).
        self._in_place = self._real.is_dir() and (os.path.ismount(self._real) or
                                                   self._real.stat().st_dev != self._real.parent.stat().st_dev)
        self._stage_in = self._real if self._in_place else self._real.parent
        # NOTE: a folder made and removed now, so a place that cannot be written to is refused
        # before the work, not after it (when the work's output would be lost).
        _fresh_folder(self._stage_in, self._staging_name()).rmdir()

    def _staging_name(self) -> str:
        return f".partial-{os.getpid()}" if self._in_place else f"{self._real.name}.partial-{os.getpid()}"

    def __enter__(self) -> Path:
        self.staging = _fresh_folder(self._stage_in, self._staging_name())
        if self._real.is_dir():
            shutil.copymode(self._real, self.staging)  # a private folder stays private
        return self.staging

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None:
                try:
                    self._commit()
                except OSError as error:
                    raise self._named(error) from None
            elif isinstance(exc, OSError):
                raise self._named(exc) from None
        finally:
            if not self._keep_staging and self.staging is not None and self.staging.exists():
                shutil.rmtree(self.staging, ignore_errors=True)
        return False

    def _named(self, exc: OSError) -> OSError:
        """``exc`` naming the target (a file of the partial folder by its final name)."""
        name = exc.filename
        if name is None:
            return _naming(exc, self.target)
        if self.staging is not None and str(name).startswith(str(self.staging)):
            return _naming(exc, str(self.target) + str(name)[len(str(self.staging)):])
        return exc  # about another file

    def _check(self) -> None:
        target, real = self.target, self._real
        if self.target.is_symlink() and not os.path.lexists(real):
            raise ValueError(f"--out {target}: is a symbolic link to nothing ({os.readlink(target)}); give the folder "
                             "itself")
        if os.path.lexists(real) and not real.is_dir():
            raise ValueError(f"--out {target}: exists and is not a folder")
        refuse_unsafe_folder(target, "--out", replaces_whole=True)
        foreign = self._foreign()
        if foreign:
            entries = "an entry" if len(foreign) == 1 else f"{len(foreign)} entries"
            raise ValueError(f"--out {target}: holds {entries} pagesim did not write ({foreign[0][:80]!r}); "
                             "pagesim replaces the whole folder, so give a new or empty one")

    def _foreign(self) -> list[str]:
        """Entries of the target folder the command does not write (none when there is no folder)."""
        if not self._real.is_dir():
            return []
        patterns = [*self.owned, *(p + ".tmp" for p in self.owned), STAGING_PATTERN]

        def owned(entry: os.DirEntry) -> bool:
            if entry.name.startswith(".partial-") and entry.is_dir(follow_symlinks=False):
                return True  # staged in place by this command (a killed one's, or this one's)
            return entry.is_file(follow_symlinks=False) and any(fnmatch.fnmatchcase(entry.name, p) for p in patterns)

        with os.scandir(self._real) as entries:
            return sorted(e.name for e in entries if not owned(e))

    def _commit(self) -> None:
        foreign = self._foreign()
        if foreign:  # someone put a file there while the command ran: keep both, say where the output is
            self._keep_staging = True
            raise ValueError(f"--out {self.target}: {foreign[0][:80]!r} appeared in it during the run, so it was "
                             f"left as it was; this run's files are in {self.staging}")
        _fsync_folder(self.staging)
        if self._in_place:
            self._move_in()
            return
        old = None
        try:
            os.rename(self.staging, self._real)  # no folder there, or an empty one: one atomic step
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            old = _fresh_name(self._real.parent, f"{self._real.name}.old-{os.getpid()}")
            os.rename(self._real, old)
            try:
                os.rename(self.staging, self._real)
            except BaseException:  # (an interrupt too): the previous output goes back
                os.rename(old, self._real)
                raise
        _fsync_path(self._real.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def _move_in(self) -> None:
        """A mount point's files replaced one by one: the new ones renamed in (each whole), then
        the previous run's files that this one did not write removed."""
        new = set(os.listdir(self.staging))
        for name in sorted(new):
            os.replace(self.staging / name, self._real / name)
        with os.scandir(self._real) as entries:
            stale = [e for e in entries if e.name not in new and e.is_file(follow_symlinks=False)]
        for entry in stale:  # (only files the command owns: anything else was refused before)
            os.unlink(entry.path)
        self.staging.rmdir()
        _fsync_path(self._real)


def _fresh_name(parent: Path, name: str) -> Path:
    path, k = parent / name, 1
    while os.path.lexists(path):
        path, k = parent / f"{name}-{k}", k + 1
    return path


def _fresh_folder(parent: Path, name: str) -> Path:
    while True:
        path = _fresh_name(parent, name)
        try:
            path.mkdir()
            return path
        except FileExistsError:  # taken meanwhile: the next name
            continue


def _fsync_folder(folder: Path) -> None:
    """Flush every file directly in ``folder``, then the folder itself (its entries), to disk."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_file(follow_symlinks=False):
                _fsync_path(Path(entry.path))
    _fsync_path(folder)


@contextlib.contextmanager
def staged_files(paths: list[Path]) -> Iterator[dict[Path, Path]]:
    """Staged names (fresh, beside each of ``paths``) to write in the block; after a clean exit
    each is flushed to disk and renamed onto its path, after an error none is left behind. A
    target must be a regular file or nothing: a link, a FIFO or a device is refused at once."""
    real = [os.path.realpath(p) for p in paths]
    if len(set(real)) < len(real):
        raise ValueError(f"{next(p for p, r in zip(paths, real) if real.count(r) > 1)}: the same file given twice")
    outputs = [OutputFile(path, own=True) for path in paths]
    tmps: dict[Path, Path] = {}
    try:
        for output in outputs:
            with writing(output.path):
                output.target.parent.mkdir(parents=True, exist_ok=True)
                tmp, fd = stage_beside(output.target)
            os.close(fd)
            tmps[output.path] = tmp
        yield tmps
        for path, tmp in tmps.items():
            with writing(path):
                _fsync_path(tmp)
        for output in outputs:
            with writing(output.path):
                output.replace_with(tmps.pop(output.path))
    finally:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
