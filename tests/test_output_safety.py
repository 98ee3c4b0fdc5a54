"""pagesim writes only what the user named and replaces only a regular file (or nothing).

Every writer is pointed at what it must not replace, each made in the test's own temporary folder
(never the machine's real ``/dev`` nodes or ``/``): a copy of ``/dev/null`` and ``/dev/full``
(``os.mknod`` of their device numbers; root only, skipped otherwise), a FIFO with and without a
reader, a socket, symbolic links (to a file, to nothing, to a device), links planted among a
study's own files, folders holding other files, the home folder and the current folder's
ancestors, and a user's ``NAME.tmp`` beside an output. Each case runs the installed ``pagesim``
in a subprocess (``tests/bad_inputs_harness.py``) and asserts either a refusal (exit 2, one error
line naming the path) or the right stream (``/dev/null`` discards, a FIFO's reader gets the file,
a link's file is written where it lies), and that nothing else in the folder changed: a snapshot of
every entry (name, type, inode, mode, size, mtime, link target) before and after, a device or FIFO
keeping its inode and type.

The case classes (``CLASSES``) are those of issue 56's audit: write to a device, to a FIFO,
through a symbolic link, into a foreign folder, into a dangerous folder, over a stray ``.tmp``.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import stat
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import bad_inputs_harness as harness
from tests.bad_inputs_harness import ROOT, error_line, run_pagesim
from tests.test_bad_inputs import ORACLE_SPEC

CLASSES = ("device", "fifo", "symlink", "foreign folder", "dangerous folder", "stray tmp")
LIMIT_S = 120.0  # generous: a refusal takes a second; the watchdog only guards against a hang

SHIPPED_PROFILE = str(ROOT / "pagesim" / "sim" / "profiles" / "tiny-cpu.json")
TRACE_GEN = ["trace", "gen", "--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "5", "-o"]
SIM = ["simulate", "--no-progress", "--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "12"]
SIM_RESULT = [*SIM, "--save-result", "--result-filename"]
RUN_RESULT = ["run", "--no-progress", "--model", "tiny", "--workload", "kwon2023-alpaca", "--rate", "4",
              "--num-requests", "4", "--save-result", "--result-filename"]
VALIDATE = ["validate", "--workload", "kwon2023-alpaca", "--rate", "4", "--num-requests", "4", "--profile",
            SHIPPED_PROFILE, "--noise-runs", "0", "--no-reference", "--out"]
CALIBRATE = ["calibrate", "--quick", "--force", "--no-progress", "--out"]
DEMO = ["demo", "--workers", "1", "--no-progress", "-o"]

STUDY = """\
name = "safety"
[source]
workload = "shared-system-prompt"
rate = 6.0
num_requests = 12
[base]
kv_cache_gb = 1.0
[[grid]]
block_size = [8, 16]
"""


NULL, FULL = (1, 3), (1, 7)  # Linux's /dev/null and /dev/full


# ----------------------------------------------------------------------------- the folder and its snapshot
def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root``: type, inode, mode, size, mtime, link target (folders: type,
    inode and mode only; their entries are listed themselves)."""
    entries = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            st = os.lstat(path)
            kind = stat.S_IFMT(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                entries[str(path.relative_to(root))] = (kind, st.st_ino, stat.S_IMODE(st.st_mode))
            else:
                target = os.readlink(path) if stat.S_ISLNK(kind) else None
                entries[str(path.relative_to(root))] = (kind, st.st_ino, stat.S_IMODE(st.st_mode), st.st_size,
                                                        st.st_mtime_ns, target)
    return entries


def changed(before: dict, after: dict) -> set[str]:
    return {name for name in before.keys() | after.keys() if before.get(name) != after.get(name)}


class Folder:
    """A case's files, made in its folder; each method returns the path to give pagesim (relative
    to the folder, which is the command's current folder)."""

    def __init__(self, root: Path, shared: dict[str, Path]):
        self.root = root
        self.shared = shared

    def write(self, name: str, content: str = "") -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        return name

    def folder(self, name: str) -> str:
        (self.root / name).mkdir(parents=True, exist_ok=True)
        return name

    def device(self, name: str, numbers: tuple[int, int] = NULL) -> str:
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        try:
            os.mknod(self.root / name, 0o666 | stat.S_IFCHR, os.makedev(*numbers))
        except PermissionError:
            pytest.skip("cannot make a device node here")
        return name

    def fifo(self, name: str) -> str:
        os.mkfifo(self.root / name)
        return name

    def socket(self, name: str) -> str:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(self.root / name))
        sock.close()
        return name

    def link(self, name: str, target: str) -> str:
        (self.root / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, self.root / name)
        return name

    def spec(self) -> str:
        return self.write("spec.toml", STUDY)

    def oracle(self) -> str:
        return self.write("case.spec.json", json.dumps(ORACLE_SPEC))

    def study(self, name: str = "s") -> str:
        """A copy of a finished study of ``STUDY`` (so a study run on it resumes)."""
        shutil.copytree(self.shared["study"], self.root / name, symlinks=True)
        return name


class FifoReader:
    """Reads a FIFO in a thread from before the command starts (opened without blocking, so the
    FIFO has a reader when pagesim checks it) until its writer closes it or ``stop``."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.data = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while not self._stop.is_set():
            for _, events in poller.poll(100):
                if events & select.POLLIN:
                    chunk = os.read(self.fd, 1 << 16)
                    if not chunk:
                        return
                    self.data += chunk
                elif events & select.POLLHUP:  # (the writer came and went)
                    return

    def stop(self) -> bytes:
        self._stop.set()
        self._thread.join()
        os.close(self.fd)
        return bytes(self.data)


# ----------------------------------------------------------------------------- the cases
@dataclass(frozen=True)
class Case:
    id: str
    cls: str  # one of CLASSES
    argv: Callable[[Folder], list[str]]
    refused: bool  # exit 2 and one error line; else exit 0
    words: tuple[str, ...] = ()  # in the error line (refused) or in what the output holds (a stream)
    named: tuple[str, ...] = ()  # entries a successful command may change (a folder: everything below it too)
    reader: str | None = None  # a FIFO read while the command runs
    home: bool = False  # HOME is the folder's home/ (made empty)
    cwd: str = "."  # the command's current folder, inside the case's folder
    engine: bool = False  # the real engine: past the harness's memory guard (torch), so run without it


def _may_change(name: str, named: tuple[str, ...]) -> bool:
    return any(name == n or name.startswith(n + "/") for n in named)


def _report(f: Folder, flag: str = "-o") -> list[str]:
    return ["report", str(f.shared["study"]), flag]


def _study(f: Folder) -> list[str]:
    return ["study", f.spec(), "--workers", "1", "--no-progress", "-o"]


def _plant(f: Folder, name: str, victim: str = "victim.txt", damage: Callable[[Path], None] | None = None) -> list[str]:
    """A finished study with ``name`` a symbolic link to ``victim`` (a file outside it)."""
    folder = Path(f.root / f.study("s"))
    f.write(victim, "keep me\n")
    if (folder / name).exists():
        (folder / name).unlink()
    os.symlink(Path("..") / victim, folder / name)
    if damage is not None:
        damage(folder)
    return [*_study(f), "s"]


def _garble_middle_line(folder: Path) -> None:
    lines = (folder / "results.jsonl").read_text().splitlines(keepends=True)
    (folder / "results.jsonl").write_text(lines[0] + "not a record\n" + "".join(lines[1:]))


CASES = [
    # ---------------------------------------------------------------- device
    Case("trace-gen-null", "device", lambda f: [*TRACE_GEN, f.device("null")], False, named=("null",)),
    Case("trace-gen-full", "device", lambda f: [*TRACE_GEN, f.device("full", FULL)], True,
         ("full", "No space left on device")),
    Case("trace-gen-socket", "device", lambda f: [*TRACE_GEN, f.socket("sock")], True, ("sock", "socket")),
    Case("simulate-result-null", "device", lambda f: [*SIM_RESULT, f.device("null")], False, named=("null",)),
    Case("simulate-result-full", "device", lambda f: [*SIM_RESULT, f.device("full", FULL)], True,
         ("full", "No space left on device")),
    Case("study-report-null", "device", lambda f: [*_study(f), "s", "--report", f.device("null")], False,
         named=("null", "s")),
    Case("report-pdf-null", "device", lambda f: [*_report(f), f.device("null")], False, named=("null",)),
    Case("report-html-full", "device", lambda f: [*_report(f, "--html"), f.device("full", FULL)], True,
         ("full", "No space left on device")),
    Case("oracle-replay-null", "device", lambda f: ["oracle", "replay", f.oracle(), "-o", f.device("null")], False,
         named=("null",)),
    Case("calibrate-null", "device", lambda f: [*CALIBRATE, f.device("null")], True, ("null", "regular file")),
    Case("simulate-out-null", "device", lambda f: [*SIM, "--out", f.device("null")], True, ("null",)),
    Case("study-o-null", "device", lambda f: [*_study(f), f.device("null")], True, ("null",)),
    Case("validate-out-null", "device", lambda f: [*VALIDATE, f.device("null")], True, ("null",)),
    # ---------------------------------------------------------------- FIFO
    Case("trace-gen-fifo-reader", "fifo", lambda f: [*TRACE_GEN, f.fifo("fifo")], False, ('{"pagesim_trace"',),
         named=("fifo",), reader="fifo"),
    Case("trace-gen-fifo-no-reader", "fifo", lambda f: [*TRACE_GEN, f.fifo("fifo")], True, ("fifo", "no reader")),
    Case("simulate-result-fifo-reader", "fifo", lambda f: [*SIM_RESULT, f.fifo("fifo")], False, ('"completed"',),
         named=("fifo",), reader="fifo"),
    Case("simulate-result-fifo-no-reader", "fifo",  # refused before the run: --out is never made
         lambda f: [*SIM_RESULT, f.fifo("fifo"), "--out", "o"], True, ("fifo", "no reader")),
    Case("study-report-fifo-no-reader", "fifo",  # refused before the study: s is never made
         lambda f: [*_study(f), "s", "--report", f.fifo("fifo")], True, ("fifo", "no reader")),
    Case("report-pdf-fifo-reader", "fifo", lambda f: [*_report(f), f.fifo("fifo")], False, ("%PDF",),
         named=("fifo",), reader="fifo"),
    Case("report-html-fifo-no-reader", "fifo", lambda f: [*_report(f, "--html"), f.fifo("fifo")], True,
         ("fifo", "no reader")),
    Case("oracle-replay-fifo-reader", "fifo", lambda f: ["oracle", "replay", f.oracle(), "-o", f.fifo("fifo")], False,
         ('"step"',), named=("fifo",), reader="fifo"),
    Case("oracle-replay-fifo-no-reader", "fifo",
         lambda f: ["oracle", "replay", f.oracle(), "-o", f.fifo("fifo")], True, ("fifo", "no reader")),
    Case("calibrate-fifo", "fifo", lambda f: [*CALIBRATE, f.fifo("fifo")], True, ("fifo", "regular file")),
    Case("study-o-fifo", "fifo", lambda f: [*_study(f), f.fifo("fifo")], True, ("fifo",)),
    Case("validate-out-fifo", "fifo", lambda f: [*VALIDATE, f.fifo("fifo")], True, ("fifo",)),
    Case("study-results-fifo", "fifo", lambda f: [*_study(f), _fifo_results(f)], True, ("results.jsonl",)),
    # ---------------------------------------------------------------- symbolic links
    Case("trace-gen-link-to-file", "symlink",
         lambda f: [*TRACE_GEN, f.link("out.jsonl", f.write("real.jsonl", "old\n"))], False, named=("real.jsonl",)),
    Case("trace-gen-link-to-nothing", "symlink", lambda f: [*TRACE_GEN, f.link("out.jsonl", "gone/real.jsonl")], True,
         ("out.jsonl", "link to nothing")),
    Case("trace-gen-link-to-device", "symlink", lambda f: [*TRACE_GEN, f.link("out.jsonl", f.device("null"))], False,
         named=("null",)),
    Case("simulate-result-link-to-file", "symlink",
         lambda f: [*SIM_RESULT, f.link("r.json", f.write("real.json", "{}"))], False, named=("real.json",)),
    Case("report-pdf-link-to-file", "symlink", lambda f: [*_report(f), f.link("r.pdf", f.write("real.pdf", "old"))],
         False, named=("real.pdf",)),
    Case("report-html-link-to-nothing", "symlink", lambda f: [*_report(f, "--html"), f.link("r.html", "real.html")],
         True, ("r.html", "link to nothing")),
    Case("oracle-replay-link-to-file", "symlink",
         lambda f: ["oracle", "replay", f.oracle(), "-o", f.link("log.jsonl", f.write("real.jsonl", "old\n"))], False,
         named=("real.jsonl",)),
    Case("calibrate-link-to-nothing", "symlink", lambda f: [*CALIBRATE, f.link("p.json", "real.json")], True,
         ("p.json", "link to nothing")),
    Case("simulate-out-link-to-nothing", "symlink", lambda f: [*SIM, "--out", f.link("o", "real-o")], True,
         ("link to nothing",)),
    Case("study-planted-lock", "symlink", lambda f: _plant(f, ".lock"), True, (".lock",)),
    Case("study-planted-rejected", "symlink",
         lambda f: _plant(f, "results.rejected.jsonl", damage=_garble_middle_line), True, ("results.rejected.jsonl",)),
    Case("study-planted-results", "symlink",
         lambda f: _plant(f, "results.jsonl"), True, ("results.jsonl",)),
    Case("study-planted-study-json", "symlink", lambda f: _plant(f, "study.json"), True, ("study.json",)),
    # ---------------------------------------------------------------- folders holding other things
    Case("study-o-foreign-file", "foreign folder", lambda f: [*_study(f), _with(f, "s", "notes.txt")], True,
         ("notes.txt",)),
    Case("study-o-foreign-subfolder", "foreign folder", lambda f: [*_study(f), _with(f, "s", "sub/")], True,
         ("sub",)),
    Case("validate-out-foreign-file", "foreign folder", lambda f: [*VALIDATE, _with(f, "v", "notes.txt")], True,
         ("notes.txt",)),
    Case("demo-o-foreign-file", "foreign folder", lambda f: [*DEMO, _with(f, "out", "notes.txt")], True,
         ("notes.txt",)),
    Case("demo-study-foreign-file", "foreign folder", lambda f: [*DEMO, _with(f, "out", "demo-study/notes.txt")],
         True, ("notes.txt",)),
    Case("simulate-out-foreign-file", "foreign folder", lambda f: [*SIM, "--out", _with(f, "o", "notes.txt")], True,
         ("notes.txt",)),
    # ---------------------------------------------------------------- dangerous folders
    Case("study-o-home", "dangerous folder", lambda f: [*_study(f), f.folder("home")], True, ("home folder",),
         home=True),
    Case("demo-o-home", "dangerous folder", lambda f: [*DEMO, f.folder("home")], True, ("home folder",), home=True),
    Case("validate-out-home", "dangerous folder", lambda f: [*VALIDATE, f.folder("home")], True, ("home folder",),
         home=True),
    Case("simulate-out-home", "dangerous folder", lambda f: [*SIM, "--out", f.folder("home")], True, ("home folder",),
         home=True),
    Case("study-o-cwd-parent", "dangerous folder",
         lambda f: ["study", "../../" + f.spec(), "--workers", "1", "--no-progress", "-o", _cwd(f, "a/b", "..")],
         True, ("current folder",), cwd="a/b"),
    Case("demo-o-cwd-parent", "dangerous folder", lambda f: [*DEMO, _cwd(f, "a/b", "..")], True, ("current folder",),
         cwd="a/b"),
    # ---------------------------------------------------------------- a user's NAME.tmp beside the output
    Case("simulate-result-stray-tmp", "stray tmp", lambda f: [*SIM_RESULT, _beside_tmp(f, "r.json")], False,
         named=("r.json",)),
    Case("run-result-stray-tmp", "stray tmp", lambda f: [*RUN_RESULT, _beside_tmp(f, "r.json")], False,
         named=("r.json",), engine=True),
]


def _with(f: Folder, folder: str, entry: str) -> str:
    """``folder`` holding ``entry`` (a file, or a folder when it ends in /)."""
    if entry.endswith("/"):
        f.folder(f"{folder}/{entry}")
    else:
        f.write(f"{folder}/{entry}", "mine\n")
    return folder


def _cwd(f: Folder, cwd: str, out: str) -> str:
    f.folder(cwd)
    return out


def _beside_tmp(f: Folder, name: str) -> str:
    f.write(name + ".tmp", "a user's file\n")
    return name


def _fifo_results(f: Folder) -> str:
    folder = Path(f.root / f.study("s"))
    (folder / "results.jsonl").unlink()
    os.mkfifo(folder / "results.jsonl")
    return "s"


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, Path]:
    """A finished two-run study of ``STUDY`` (read by the report cases, copied by the study ones)."""
    from pagesim.reports.execute import run_study
    from pagesim.reports.spec import parse_spec

    out = tmp_path_factory.mktemp("output_safety") / "study"
    run_study(parse_spec(STUDY), out, workers=1, progress=False)
    return {"study": out}


def run_case(case: Case, root: Path, shared: dict[str, Path], monkeypatch) -> tuple[object, dict, dict, bytes]:
    """The case's files made in ``root``, the command run there: (outcome, before, after, read)."""
    f = Folder(root, shared)
    argv = case.argv(f)
    if case.home:
        monkeypatch.setitem(harness.ENV, "HOME", str(root / "home"))
    before = snapshot(root)
    reader = FifoReader(root / case.reader) if case.reader else None
    try:
        outcome = (run_plain if case.engine else run_pagesim)(argv, cwd=root / case.cwd, limit_s=LIMIT_S)
    finally:
        read = reader.stop() if reader is not None else b""
    return outcome, before, snapshot(root), read


def run_plain(argv: list[str], *, cwd: Path, limit_s: float) -> harness.Outcome:
    """``pagesim ARGV`` without the harness's watchdog (whose memory guard a torch run passes)."""
    done = subprocess.run([*harness.PAGESIM, *argv], cwd=cwd, env=harness.ENV, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=limit_s)
    return harness.Outcome(tuple(argv), done.returncode, done.stdout, done.stderr, 0.0, 0, None)


@pytest.mark.slow  # about two minutes on two cores: some fifty fresh pagesim processes
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_write_replaces_only_a_regular_file(case, shared, tmp_path, monkeypatch):
    outcome, before, after, read = run_case(case, tmp_path, shared, monkeypatch)
    assert outcome.killed_for is None, f"stopped by the watchdog ({outcome.killed_for}):\n" + outcome.describe()
    if case.refused:
        assert outcome.returncode == 2, "not a refusal:\n" + outcome.describe()
        message = error_line(outcome, outcome.argv[0])
        for word in case.words:
            assert word.lower() in message.lower(), f"{word!r} not in the error:\n" + outcome.describe()
        assert changed(before, after) == set(), f"the folder changed: {sorted(changed(before, after))}\n" \
                                                + outcome.describe()
        return
    assert outcome.returncode == 0, "failed:\n" + outcome.describe()
    assert "Traceback" not in outcome.stderr, outcome.describe()
    unexpected = {n for n in changed(before, after) if not _may_change(n, case.named)}
    assert not unexpected, f"changed beyond {case.named}: {sorted(unexpected)}\n" + outcome.describe()
    for name, entry in before.items():  # a device, FIFO or link written to is still that very node
        if not stat.S_ISREG(entry[0]) and not stat.S_ISDIR(entry[0]):
            assert name in after and after[name][:2] == entry[:2], f"{name} was replaced:\n" + outcome.describe()
    for word in case.words:
        assert word.encode() in read, f"{word!r} not in what the reader got ({read[:200]!r}):\n" + outcome.describe()
    for name in case.named:  # a file written where a link points is whole and new
        if name.startswith("real."):
            assert (tmp_path / name).stat().st_size > 10, outcome.describe()
    for name, entry in before.items():  # a user's NAME.tmp untouched (the snapshot says so), and the output there
        if name.endswith(".tmp"):
            assert (tmp_path / name[:-4]).stat().st_size > 10, outcome.describe()


# ----------------------------------------------------------------------------- `/` itself, in process
@pytest.mark.parametrize("command", ["study", "demo"])
def test_root_is_refused_before_anything_is_written(command, tmp_path, capsys, monkeypatch):
    """``study -o /`` and ``demo -o /``: run in this process with every path to the work replaced
    by a failure, so the test can never write into ``/``: the refusal must come first."""
    import pagesim.reports.execute
    from pagesim.engine.cli import main

    def never(*args, **kwargs):
        pytest.fail("pagesim went on to run the study in /")

    monkeypatch.setattr(pagesim.reports.execute, "run_study", never)
    monkeypatch.setattr(pagesim.reports.execute, "_run_locked", never)
    monkeypatch.setattr(pagesim.reports.execute, "_exclusive", never)
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "spec.toml"
    spec.write_text(STUDY)
    argv = ["study", str(spec), "--workers", "1", "--no-progress", "-o", "/"] if command == "study" else \
        ["demo", "--workers", "1", "--no-progress", "-o", "/"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pagesim {command}: error: -o /: is the root folder"), err


# ----------------------------------------------------------------------------- resuming in a study's own folder
@pytest.mark.slow  # one of the suite's slowest: CI runs it (pytest -m slow); see tests/conftest.py
def test_a_study_resumes_in_its_own_folder_beside_its_report(shared, tmp_path):
    f = Folder(tmp_path, shared)
    argv = [*_study(f), "s"]
    first = run_pagesim(argv, cwd=tmp_path, limit_s=LIMIT_S)
    assert first.returncode == 0, first.describe()
    report = run_pagesim(["report", "s", "-o", "s/report.pdf", "--html", "s/report.html"], cwd=tmp_path,
                         limit_s=LIMIT_S)
    assert report.returncode == 0, report.describe()
    again = run_pagesim([*argv, "--report", "s/report.pdf"], cwd=tmp_path, limit_s=LIMIT_S)
    assert again.returncode == 0 and "2 from before, 0 now" in again.stdout, again.describe()
    assert sorted(os.listdir(tmp_path / "s")) == [".lock", "report.html", "report.pdf", "results.jsonl", "study.json"]


# ----------------------------------------------------------------------------- stray NAME.tmp, in process
def test_saving_a_profile_leaves_a_users_tmp_file_alone(tmp_path):
    from pagesim.sim.cost.profile import load_profile, save_profile

    stray = tmp_path / "p.json.tmp"
    stray.write_text("a user's file\n")
    save_profile(load_profile(SHIPPED_PROFILE), tmp_path / "p.json")
    assert stray.read_text() == "a user's file\n"
    assert load_profile(tmp_path / "p.json").tables
    assert sorted(os.listdir(tmp_path)) == ["p.json", "p.json.tmp"]


def test_staged_files_never_take_a_users_file(tmp_path):
    from pagesim.engine.atomic import staged_files

    target = tmp_path / "a.pdf"
    stray = tmp_path / f"a.pdf.{os.getpid()}.tmp"  # the staging name of older versions
    stray.write_text("a user's file\n")
    with staged_files([target]) as staged:
        assert staged[target] != stray
        staged[target].write_text("new")
    assert target.read_text() == "new" and stray.read_text() == "a user's file\n"
    assert sorted(os.listdir(tmp_path)) == ["a.pdf", stray.name]


def test_trace_gen_leaves_a_users_tmp_file_alone(tmp_path):
    from pagesim.traces.generate import Fixed, Poisson, WorkloadSpec, generate
    from pagesim.traces.loaders import load_trace, write_jsonl

    trace = generate(WorkloadSpec(num_requests=5, arrivals=Poisson(4.0), prompt=Fixed(7), output=Fixed(3), seed=0))
    stray = tmp_path / f".t.jsonl.tmp{os.getpid()}"  # the staging name of older versions
    stray.write_text("a user's file\n")
    write_jsonl(trace, tmp_path / "t.jsonl")
    assert stray.read_text() == "a user's file\n" and len(load_trace(tmp_path / "t.jsonl")) == 5
    assert sorted(os.listdir(tmp_path)) == [stray.name, "t.jsonl"]


# ----------------------------------------------------------------------------- engine.outputs itself
def test_an_output_that_changes_kind_during_the_work_is_kept_and_named(tmp_path):
    from pagesim.engine.outputs import OutputFile

    target = tmp_path / "r.json"
    output = OutputFile(target, "-o")  # checked: nothing there
    with pytest.raises(ValueError, match=r"-o .*r\.json: became a FIFO .* the output is in .*\.r\.json\.pagesim-"):
        with output.open() as fh:
            fh.write("{}")
            os.mkfifo(target)  # someone else's doing, while pagesim worked
    assert stat.S_ISFIFO(os.lstat(target).st_mode)
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(".r.json.pagesim-")]
    assert len(kept) == 1 and kept[0].read_text() == "{}"


def test_an_own_file_is_never_opened_through_a_link_or_as_a_fifo(tmp_path):
    from pagesim.engine.output_folders import own_opener

    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    os.symlink(victim, tmp_path / ".lock")
    os.mkfifo(tmp_path / "results.jsonl")  # no reader, no writer: opening it to write would block
    for name, kind in ((".lock", "symbolic link"), ("results.jsonl", "FIFO")):
        with pytest.raises(ValueError, match=f"{name}: is a {kind}"):
            open(tmp_path / name, "a", opener=own_opener)
    assert victim.read_text() == "keep me\n"


def test_a_private_file_stays_private_when_replaced(tmp_path):
    from pagesim.engine.outputs import OutputFile

    target = tmp_path / "r.json"
    target.write_text("old")
    os.chmod(target, 0o600)
    with OutputFile(target).open() as fh:
        fh.write("new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o600


def test_appending_writes_through_a_link_and_never_replaces(tmp_path):
    from pagesim.engine.outputs import OutputFile

    real = tmp_path / "results.jsonl"
    real.write_text('{"a": 1}\n')
    os.symlink(real.name, tmp_path / "link.jsonl")
    with OutputFile(tmp_path / "link.jsonl", "--result-filename").append() as fh:
        fh.write('{"b": 2}\n')
    assert real.read_text() == '{"a": 1}\n{"b": 2}\n' and (tmp_path / "link.jsonl").is_symlink()
    output = OutputFile(tmp_path / "new.jsonl")  # nothing there yet: made by the append
    os.mkfifo(tmp_path / "new.jsonl")  # someone else's doing, after the check
    with pytest.raises(ValueError, match="new.jsonl: .*FIFO"):
        with output.append() as fh:
            fh.write("x")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "new.jsonl").st_mode)
