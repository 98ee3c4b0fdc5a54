"""Folders pagesim fills, and the files it makes inside them (``pagesim.engine.outputs`` judges the files a
user names).

- **A folder pagesim fills** (``study -o``, ``demo -o``, ``simulate`` / ``run`` / ``validate
  --out``): ``refuse_unsafe_folder`` refuses ``/``, the home folder and the current folder's
  ancestors (and the current folder itself where the whole folder is replaced);
  ``check_fill_folder`` refuses one holding an entry pagesim did not write (its own names, as
  regular files: a symbolic link, a FIFO or a folder under one of those names is someone else's).
- **A file pagesim makes or changes inside its own folder** (``.lock``, ``results.jsonl``,
  ``study.json``): ``own_opener`` opens it with ``O_NOFOLLOW | O_NONBLOCK`` and refuses it unless
  ``fstat`` says it is a regular file, so a link planted there never redirects a write;
  ``create_text`` makes a new file in a folder pagesim has just made (``O_EXCL | O_NOFOLLOW``).

Errors are ``ValueError`` with one line naming the path. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import pwd
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Callable

from pagesim.engine.outputs import STAGING_PATTERN, PathArg, kind_of, lstat_or_none


def create_text(path: PathArg, *, encoding: str = "utf-8", newline: str | None = None) -> IO[str]:
    """``create_file`` as a text file object (files of a folder pagesim has just made)."""
    return open(path, "x", encoding=encoding, newline=newline, opener=_create_opener)


def _create_opener(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)


def own_opener(path: str, flags: int) -> int:
    """An ``opener`` for ``open()``: a file of pagesim's own folder, never through a link, and
    only a regular file (a FIFO or device under its name is refused, without blocking)."""
    st = lstat_or_none(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise _not_own(path, st.st_mode)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # made a link or a FIFO since the lstat
            raise _not_own(path, os.lstat(path).st_mode) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_own(path, mode)
    return fd


def _not_own(path: PathArg, mode: int) -> ValueError:
    return ValueError(f"{path}: is {kind_of(mode)}, not a file pagesim wrote (pagesim does not write through it "
                      "inside its own folder): remove it, or give another folder")



def refuse_unsafe_folder(path: PathArg, flag: str, *, replaces_whole: bool = False) -> None:
    """A ``ValueError`` when ``path`` is ``/``, the home folder, or holds the current folder
    (or, with ``replaces_whole``, is it): no place for pagesim to fill or replace."""
    real = Path(os.path.realpath(path))
    label = f"{flag} {path}"
    if real == Path(real.anchor):
        raise ValueError(f"{label}: is the root folder; give a folder of its own for pagesim's files")
    if real in _homes():
        raise ValueError(f"{label}: is the home folder; give a folder of its own for pagesim's files, e.g. {path}/out")
    with contextlib.suppress(OSError):  # (a current folder removed meanwhile holds nothing)
        cwd = Path(os.path.realpath(os.getcwd()))
        if real in cwd.parents or (replaces_whole and real == cwd):
            what = "is the current folder or holds it" if replaces_whole else "holds the current folder"
            why = "pagesim replaces the whole folder" if replaces_whole else "pagesim fills it with its own files"
            raise ValueError(f"{label}: {what}; {why}, so give one below it")


def _homes() -> set[Path]:
    homes = {Path(os.path.realpath(os.path.expanduser("~")))}
    with contextlib.suppress(KeyError, OSError):
        homes.add(Path(os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir)))
    return homes


FolderCheck = Callable[[Path], None]


def check_fill_folder(path: PathArg, flag: str, files: tuple[str, ...],
                      folders: Mapping[str, FolderCheck] | None = None, *, what: str = "folder") -> None:
    """``path`` as a folder pagesim fills: refused if unsafe (``refuse_unsafe_folder``), if it is
    not a folder, or if it holds an entry pagesim did not write: a regular file matching one of
    ``files`` (shell patterns; staged leftovers are pagesim's too), or a folder of ``folders``
    (each checked by its function). Nothing there is fine: it will be made."""
    p = Path(path)
    refuse_unsafe_folder(p, flag)
    st = lstat_or_none(p)
    if st is None:
        return
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(p)
        except FileNotFoundError:
            raise ValueError(f"{flag} {p}: is a symbolic link to nothing ({os.readlink(p)}); give the folder "
                             "itself") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{flag} {p}: exists and is not a folder")
    folders = folders or {}
    patterns = (*files, STAGING_PATTERN)
    foreign = []
    with os.scandir(p) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.name in folders and entry.is_dir(follow_symlinks=False):
                folders[entry.name](Path(entry.path))
            elif not (entry.is_file(follow_symlinks=False) and any(fnmatch.fnmatchcase(entry.name, pat)
                                                                    for pat in patterns)):
                foreign.append(entry)
    if foreign:
        entry = foreign[0]
        kind = kind_of(entry.stat(follow_symlinks=False).st_mode)
        entries_words = "an entry" if len(foreign) == 1 else f"{len(foreign)} entries"
        raise ValueError(f"{flag} {p}: holds {entries_words} pagesim did not write ({entry.name[:80]!r}, {kind}); "
                         f"a {what} holds only pagesim's own files, so give a new or empty folder")
