"""Where pagesim may write: every output path is judged here, before any work, and written here.

pagesim writes only what the user named, and replaces only a regular file (or nothing).

- **A file the user names** (``trace gen -o``, ``--result-filename``, ``--report`` / ``--html``,
  ``report -o``, ``calibrate --out``, ``oracle replay -o``): ``OutputFile`` checks it at once:

  - nothing there, or a regular file: written whole under a staging name beside it
    (``.NAME.pagesim-PID-RANDOM.tmp``, created with ``O_CREAT | O_EXCL | O_NOFOLLOW``, so it never
    meets a user's file, and an existing ``NAME.tmp`` is never touched), flushed, renamed over
    ``NAME``, the folder flushed; a file's permission bits are kept;
  - a symbolic link is followed to what it names, judged the same way: a regular file is
    replaced where it lies (the link stays as it was and names the new file); a device or FIFO
    is streamed to; a link to nothing is refused (pagesim would create a file wherever it points);
  - a character device (``/dev/null``, a terminal): a stream, opened without creating or
    truncating; ``/dev/full``'s "No space left on device" is one error naming the path;
  - a FIFO: opened for writing at the check, without blocking. With no reader yet it is refused
    (a writer would block until a reader came, perhaps forever); with one it is held open until
    the output is written into it. Its reader leaving early is an error, not a silent success;
  - a socket, a block device, a folder: refused. Writers that rewrite their file again and again
    (``calibrate``, which resumes from it) take a regular file only (``streams=False``).

  ``OutputFile.open`` writes the file whole; ``OutputFile.append`` appends to it in place (a
  regular file, or a link's file, opened without following a link made since; or the stream).

- **A folder pagesim fills, and the files it makes inside it**: ``pagesim.engine.output_folders``. An
  ``OutputFile(..., own=True)`` (``study.json``, ``results.jsonl`` rewritten) is replaced whole as
  above but refuses a link instead of following it.

Every check happens when the object is made, so a command makes its outputs' objects before its
work and a bad path is refused before, not after, a long run. A file's kind can still change
between the check and the write (someone else's doing): the rename then re-checks what it
replaces and, if it is no longer a regular file or nothing, leaves both and says where the output
is. Errors are ``ValueError`` with one line naming the path, or an ``OSError`` naming it
(``writing``). Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, BinaryIO

PathArg = str | os.PathLike[str]

#: Names of files being staged (``.NAME.pagesim-PID-RANDOM.tmp``): a folder pagesim owns may hold a
#: killed command's leftovers under this pattern.
STAGING_PATTERN = ".*.pagesim-*.tmp"
_MAX_STAGED_STEM = 200  # a file name is at most 255 bytes: room for the prefix and suffix


def staging_name(name: str) -> str:
    """A fresh hidden name beside ``name`` for its staged copy (pid and 64 random bits)."""
    return f".{name[:_MAX_STAGED_STEM]}.pagesim-{os.getpid()}-{secrets.token_hex(8)}.tmp"


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def lstat_or_none(path: PathArg) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


class OutputFile:
    """A file pagesim will write, checked now (see the module docstring); ``open`` writes it.

    ``flag`` names it in messages (``--report r.pdf: ...``); ``streams=False`` refuses a device
    or FIFO; ``own=True`` (a file in pagesim's own folder) refuses a symbolic link instead of
    following it and refuses anything but a regular file or nothing.
    """

    def __init__(self, path: PathArg, flag: str | None = None, *, streams: bool = True, own: bool = False,
                 why_regular: str = "pagesim needs a regular file here"):
        self.path = Path(path)
        self.flag = flag
        self.streams = streams and not own
        self.own = own
        self.why_regular = why_regular
        self.target = self.path  # where the file is replaced: the path, or the file its link names
        self.linked = False
        self.stream = False  # written as a stream (a device or FIFO), not replaced
        self._fd: int | None = None  # a stream opened at the check, taken by the first write
        self._mode: int | None = None  # permission bits of the file replaced
        self._check()

    def __str__(self) -> str:
        return str(self.path)

    @property
    def label(self) -> str:
        return f"{self.flag} {self.path}" if self.flag else str(self.path)

    def refusal(self, why: str) -> ValueError:
        return ValueError(f"{self.label}: {why}")

    # ------------------------------------------------------------------ the check
    def _check(self) -> None:
        st = self._lstat()
        if st is not None and stat.S_ISLNK(st.st_mode):
            if self.own:
                raise self.refusal("is a symbolic link, which pagesim does not follow inside its own folder (it did "
                                   "not make it): remove it, or give another folder")
            st = self._follow()
            self.linked = True
        if st is None:
            self._check_folder(self.path)
        elif stat.S_ISREG(st.st_mode):
            if self.linked:
                self.target = Path(os.path.realpath(self.path))
            self._mode = stat.S_IMODE(st.st_mode) & 0o777
            self._check_folder(self.target)
        elif stat.S_ISDIR(st.st_mode):
            raise self.refusal("is a folder; give a file name")
        elif (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)) and self.streams:
            self.stream = True
            self._fd = self._open_stream()
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            raise self.refusal(f"is {kind_of(st.st_mode)}; {self.why_regular}")
        else:
            raise self.refusal(f"is {kind_of(st.st_mode)}, not a file pagesim writes to")

    def _lstat(self) -> os.stat_result | None:
        try:
            return lstat_or_none(self.path)
        except OSError as exc:  # e.g. a file where a folder of the path should be
            raise self.refusal(f"cannot be written ({exc.strerror})") from None

    def _follow(self) -> os.stat_result:
        """What the link at ``path`` names (``stat``); a link to nothing is refused."""
        try:
            return os.stat(self.path)
        except FileNotFoundError:
            raise self.refusal(f"is a symbolic link to nothing ({os.readlink(self.path)}); pagesim writes through a "
                               "link only to an existing file: give the file itself") from None
        except OSError as exc:
            raise self.refusal(f"is a symbolic link that cannot be followed ({exc.strerror})") from None

    def _check_folder(self, target: Path) -> None:
        require_writable_folder(target.parent, self.label)

    def _open_stream(self) -> int:
        """The device or FIFO opened for writing, without blocking on a FIFO with no reader."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                raise self.refusal("is a FIFO (named pipe) with no reader; pagesim does not wait for one (it could "
                                   "wait forever): start the reader first") from None
            raise self.refusal(f"cannot be opened for writing ({exc.strerror})") from None
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):  # swapped since the check: judge it again
            os.close(fd)
            raise self.refusal(f"changed while pagesim checked it (now {kind_of(mode)}); run again")
        os.set_blocking(fd, True)
        return fd

    # ------------------------------------------------------------------ writing
    def begin(self) -> Draft:
        """The file to write now: the stream itself, or a staged file beside the target."""
        if self.stream:
            fd, self._fd = (self._fd if self._fd is not None else self._open_stream()), None
            return Draft(self, fd, None)
        with writing(self.path):
            self.target.parent.mkdir(parents=True, exist_ok=True)
            tmp, fd = stage_beside(self.target)
        if self._mode is not None:
            os.fchmod(fd, self._mode)  # (a private file stays private)
        return Draft(self, fd, tmp)

    @contextlib.contextmanager
    def open(self, *, text: bool = True, encoding: str = "utf-8", newline: str | None = None) -> Iterator[IO]:
        """Write the file in the block (text, or bytes with ``text=False``); a clean exit puts it
        in place whole, an error leaves what was there (an ``OSError`` naming the path)."""
        with writing(self.path), written([self]) as (raw,):
            if not text:
                yield raw
                return
            with io.TextIOWrapper(raw, encoding=encoding, newline=newline) as fh:  # (closing it keeps the fd)
                yield fh

    @contextlib.contextmanager
    def append(self, *, encoding: str = "utf-8") -> Iterator[IO[str]]:
        """Append to the file in the block (text; e.g. vLLM bench's ``--append-result``): the
        stream, or the regular file itself (a link's file), opened without following a link made
        since the check and refused if it is no longer a regular file. Not atomic: an append
        cannot be staged; an error names the path."""
        if self.stream:
            with self.open(encoding=encoding) as fh:
                yield fh
            return
        with writing(self.path):
            self.target.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(self.target, flags, 0o666)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO):
                    raise self.refusal("changed while pagesim ran (now a link or a FIFO); left as it is") from None
                raise
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                os.close(fd)
                raise self.refusal(f"became {kind_of(mode)} while pagesim ran; left as it is")
            with open(fd, "a", encoding=encoding) as fh:
                yield fh
                fh.flush()
                os.fsync(fd)

    def replace_with(self, tmp: Path) -> None:
        """The staged ``tmp`` renamed over the target, if that is still a regular file or nothing
        (and, for a link, the link still names it); else both are left and the error says where."""
        st = lstat_or_none(self.target)
        moved = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            moved = f"became {kind_of(st.st_mode)}"
        elif self.linked and Path(os.path.realpath(self.path)) != self.target:
            moved = "was pointed elsewhere"
        if moved is not None:
            raise KeptStaged(self.refusal(f"{moved} while pagesim ran, so it was left as it was; the output is in "
                                          f"{tmp}"))
        os.replace(tmp, self.target)
        fsync_path(self.target.parent)

    def close(self) -> None:
        """Close a stream opened at the check and never written (a refusal after the check)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class KeptStaged(ValueError):
    """The target changed kind while pagesim ran: its staged output is kept and named."""

    def __init__(self, error: ValueError):
        super().__init__(str(error))


class Draft:
    """One output being written: ``file`` (binary, buffered; closing it keeps the descriptor),
    then ``finish`` (flush, and ``fsync`` for a staged file), ``commit`` (the rename) or
    ``discard`` (the staged file removed)."""

    def __init__(self, output: OutputFile, fd: int, tmp: Path | None):
        self.output, self.fd, self.tmp = output, fd, tmp
        self.file: BinaryIO = io.BufferedWriter(io.FileIO(fd, "wb", closefd=False))
        self._open = True
        self._kept = False

    def finish(self) -> None:
        if not self.file.closed:
            self.file.flush()
        if self.tmp is not None:
            os.fsync(self.fd)
        self._close()

    def commit(self) -> None:
        if self.tmp is not None:
            try:
                self.output.replace_with(self.tmp)
            except KeptStaged:
                self._kept = True
                raise

    def discard(self) -> None:
        with contextlib.suppress(Exception):  # (a full disk again while closing: the first error stands)
            self.file.close()
        self._close()
        if self.tmp is not None and not self._kept:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)

    def _close(self) -> None:
        if self._open:
            self._open = False
            os.close(self.fd)


@contextlib.contextmanager
def written(outputs: list[OutputFile]) -> Iterator[list[BinaryIO]]:
    """Each of ``outputs`` opened to write in the block (binary). After a clean exit each is
    flushed, then all are put in place (a regular file renamed over its name once every one is
    whole); after an error none is, and no staged file is left."""
    drafts: list[Draft] = []
    done = False
    try:
        for output in outputs:
            drafts.append(output.begin())
        yield [d.file for d in drafts]
        for d in drafts:
            with writing(d.output.path):
                d.finish()
        for d in drafts:
            with writing(d.output.path):
                d.commit()
        done = True
    finally:
        if not done:
            for d in drafts:
                d.discard()
            for output in outputs:
                output.close()


def stage_beside(target: Path) -> tuple[Path, int]:
    """A new staging file in ``target``'s folder: its path and a descriptor open for writing."""
    while True:
        tmp = target.with_name(staging_name(target.name))
        try:
            return tmp, create_file(tmp)
        except FileExistsError:  # (64 random bits: only in theory)
            continue


def create_file(path: PathArg, mode: int = 0o666) -> int:
    """A new file at ``path`` (nothing there: not a link, not a user's file), open for writing."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


# ---------------------------------------------------------------------- folders
def require_writable_folder(folder: PathArg, label: str) -> None:
    """``folder`` (or its nearest existing ancestor, where the missing ones will be made) is a
    folder this process can write into; else a ``ValueError`` starting with ``label``."""
    folder = Path(folder)
    while True:
        try:
            st = os.stat(folder)
            break
        except FileNotFoundError:
            if folder == folder.parent:
                raise ValueError(f"{label}: its folder cannot be found") from None
            folder = folder.parent
        except OSError as exc:
            raise ValueError(f"{label}: cannot be written ({exc.strerror}: {folder})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{label}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{label}: folder {folder} cannot be written to")


# ---------------------------------------------------------------------- errors and flushing
@contextlib.contextmanager
def writing(path: PathArg) -> Iterator[None]:
    """An error while writing ``path`` re-raised as one ``OSError`` naming ``path`` (or its
    staged file), found under a ``zlib.error`` too; an ``OSError`` about another file passes as it
    is. A stream whose reader left (``EPIPE``) is a ``ValueError`` saying so."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None and not _about(exc.filename, path):
            raise
        if exc.errno == errno.EPIPE:
            raise ValueError(f"{path}: its reader closed it before pagesim finished writing") from None
        raise naming(exc, path) from None
    except zlib.error as exc:  # a stream closed after a failed write
        cause = _os_error_under(exc)
        if cause is None:
            raise ValueError(f"{path}: could not be written ({exc})") from None
        raise naming(cause, path) from None


def _about(filename: object, path: PathArg) -> bool:
    """Whether an error's ``filename`` is ``path`` or its staged file."""
    name, p = str(filename), Path(path)
    return name.startswith(str(path)) or Path(name).name.startswith(f".{p.name[:_MAX_STAGED_STEM]}.pagesim-")


def _os_error_under(exc: BaseException | None) -> OSError | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def naming(exc: OSError, path: PathArg) -> OSError:
    """``exc`` as an ``OSError`` of the same kind about ``path`` (the command line prints it as
    ``pagesim CMD: error: PATH: No space left on device``)."""
    if exc.errno is None:
        return exc
    return type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))


def fsync_path(path: PathArg) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- outputs checked early, written late
_RESERVED: dict[str, OutputFile] = {}


def reserve(path: PathArg, flag: str | None = None, **kwargs) -> OutputFile:
    """Check ``path`` now, before the work, and hold it (a FIFO stays open for its reader) for
    ``reserved`` to hand to the writer after the work.

    NOTE: a process-wide table, deliberately: the writer of a result file is reached through
    layers that do not carry the checked object (``--save-result``'s path is rebuilt from the
    settings there), and a FIFO checked now must not be closed in between (its reader would see
    the end of the file)."""
    output = OutputFile(path, flag, **kwargs)
    _RESERVED[os.path.abspath(path)] = output
    return output


def reserved(path: PathArg, flag: str | None = None, **kwargs) -> OutputFile:
    """The output ``reserve`` checked for ``path``, or ``path`` checked now."""
    output = _RESERVED.pop(os.path.abspath(path), None)
    return output if output is not None else OutputFile(path, flag, **kwargs)
