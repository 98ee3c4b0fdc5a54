"""Outputs are whole or visibly partial: ``simulate --out`` and ``run --out`` build their folder
beside the target and rename it into place; a report is both files or neither; a full disk is one
line naming the file and leaves no temporary file."""

from __future__ import annotations

import errno
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from pagesim.engine.atomic import OutputFolder, staged_files, writing
from pagesim.engine.cli import main

SIM = ["simulate", "--no-progress", "--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "12"]
RUN = ["run", "--no-progress", "--offline", "--num-gpu-blocks", "64",
       "--columns", "arrival=arrival,prompt=prompt,output=output"]
TRACE = "arrival,prompt,output\n0,8,3\n0,5,2\n0,6,2\n"  # three short requests: a run of a few steps
SIM_FILES = {"summary.json", "run_info.json", "requests.csv", "steps.csv", "decisions.jsonl", "timeline.json"}
RUN_FILES = {"summary.json", "requests.csv", "steps.csv", "decisions.jsonl", "outputs.jsonl"}


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def beside(folder: Path) -> list[str]:
    """What lies next to ``folder`` besides it: partial or old folders left behind."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name != folder.name)


def one_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# ----------------------------------------------------------------------------- OutputFolder
def test_a_new_folder_appears_whole(tmp_path):
    out = tmp_path / "a" / "out"
    with OutputFolder(out, ("*.txt",)) as staging:
        assert staging.parent == out.parent and staging.name.startswith("out.partial-")
        (staging / "one.txt").write_text("1")
        assert not out.exists()  # nothing under the final name until the block ends
    assert snapshot(out) == {"one.txt": b"1"} and beside(out) == []


def test_an_old_output_is_replaced_whole_and_kept_on_failure(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    (out / "stale.txt.tmp").write_text("left by an older pagesim")
    for failure in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(failure)):
            with OutputFolder(out, ("*.txt",)) as staging:
                (staging / "new.txt").write_text("new")
                raise failure
        assert snapshot(out) == {"old.txt": b"old", "stale.txt.tmp": b"left by an older pagesim"}
        assert beside(out) == []
    with OutputFolder(out, ("*.txt",)) as staging:
        (staging / "new.txt").write_text("new")
    assert snapshot(out) == {"new.txt": b"new"} and beside(out) == []


def test_a_symlinked_folder_is_replaced_where_it_lies(tmp_path):
    real, link = tmp_path / "real", tmp_path / "link"
    real.mkdir()
    link.symlink_to(real)
    with OutputFolder(link, ("*.txt",)) as staging:
        (staging / "x.txt").write_text("x")
    assert link.is_symlink() and snapshot(real) == {"x.txt": b"x"}


def test_a_folder_holding_other_files_is_refused_before_any_work(tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "x.txt").write_text("x")
    with pytest.raises(ValueError, match=r"holds an entry pagesim did not write \('sub'\)"):
        OutputFolder(out, ("*.txt",))
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    with pytest.raises(ValueError, match="afile: exists and is not a folder"):
        OutputFolder(afile, ("*.txt",))
    with pytest.raises(ValueError, match="is the current folder or holds it"):
        OutputFolder(Path.cwd().parent, ("*",))
    assert afile.read_text() == "keep me" and (out / "x.txt").exists()


def test_a_file_put_there_during_the_run_is_not_deleted(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"'notes\.md' appeared in it during the run.*files are in .*out\.partial-"):
        with OutputFolder(out, ("*.txt",)) as staging:
            (staging / "x.txt").write_text("x")
            out.mkdir()
            (out / "notes.md").write_text("mine")
    assert snapshot(out) == {"notes.md": b"mine"}
    assert snapshot(staging) == {"x.txt": b"x"}  # kept, as the message says


def test_a_full_disk_names_the_target_not_the_partial_folder(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(OSError) as caught:
        with OutputFolder(out, ("*.txt",)) as staging:
            with open(staging / "x.txt", "w") as fh:
                fh.write("x")
                disk_full()
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(out)
    assert not out.exists() and beside(out) == []


# ----------------------------------------------------------------------------- simulate --out, run --out
def test_simulate_out_failing_midway_keeps_the_old_output(tmp_path, capsys, monkeypatch):
    import pagesim.sim.output

    out = tmp_path / "out"
    assert main([*SIM, "--seed", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    old = snapshot(out)
    assert set(old) == SIM_FILES
    monkeypatch.setattr(pagesim.sim.output, "write_timeline", disk_full)  # after the log, summary and tables
    line = one_error(capsys, [*SIM, "--seed", "2", "--out", str(out)])
    assert line == f"pagesim simulate: error: {out}: No space left on device"
    assert snapshot(out) == old and beside(out) == []
    monkeypatch.undo()
    assert main([*SIM, "--seed", "2", "--out", str(out)]) == 0
    assert set(snapshot(out)) == SIM_FILES and snapshot(out)["summary.json"] != old["summary.json"]
    assert beside(out) == []


def test_simulate_out_onto_a_foreign_folder_is_refused_before_simulating(tmp_path, capsys, monkeypatch):
    import pagesim.sim.cluster

    out = tmp_path / "results"
    out.mkdir()
    (out / "paper.tex").write_text("mine")
    monkeypatch.setattr(pagesim.sim.cluster, "build_replicas", lambda *a: pytest.fail("simulated anyway"))
    line = one_error(capsys, [*SIM, "--out", str(out)])
    assert "paper.tex" in line and "give a new or empty one" in line
    assert snapshot(out) == {"paper.tex": b"mine"}


def test_simulate_interrupted_leaves_no_partial_folder(tmp_path, capsys, monkeypatch):
    import pagesim.sim.cluster

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(pagesim.sim.cluster.Cluster, "run", interrupted)
    out = tmp_path / "out"
    assert main([*SIM, "--out", str(out)]) == 130
    assert list(tmp_path.iterdir()) == []


def test_run_out_failing_midway_keeps_the_old_output(tmp_path, capsys, monkeypatch):
    import pagesim.engine.runtime.run_output as run_output

    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    out = tmp_path / "o" / "out"
    assert main([*RUN, "--trace", str(trace), "--out", str(out)]) == 0
    capsys.readouterr()
    old = snapshot(out)
    assert set(old) == RUN_FILES
    real_write_out = run_output.write_out

    def full_after_some(folder, engine, summary):
        (folder / "decisions.jsonl").write_text("{}\n")  # a new log written, then the disk fills up
        disk_full()

    monkeypatch.setattr(run_output, "write_out", full_after_some)
    trace.write_text(TRACE.rsplit("0,", 1)[0])  # two requests
    line = one_error(capsys, [*RUN, "--trace", str(trace), "--out", str(out)])
    assert line == f"pagesim run: error: {out}: No space left on device"
    assert snapshot(out) == old and beside(out) == []
    monkeypatch.setattr(run_output, "write_out", real_write_out)
    assert main([*RUN, "--trace", str(trace), "--out", str(out)]) == 0
    assert set(snapshot(out)) == RUN_FILES and snapshot(out)["outputs.jsonl"].count(b"\n") == 2
    assert beside(out) == []


# ----------------------------------------------------------------------------- files: a report's PDF and HTML
def test_staged_files_are_all_renamed_or_none(tmp_path):
    a, b = tmp_path / "a.pdf", tmp_path / "b.html"
    a.write_text("old a")
    with pytest.raises(OSError, match="No space left"):
        with staged_files([a, b]) as tmp:
            tmp[a].write_text("new a")
            with writing(b):
                disk_full()
    assert a.read_text() == "old a" and sorted(p.name for p in tmp_path.iterdir()) == ["a.pdf"]
    with staged_files([a, b]) as tmp:
        tmp[a].write_text("new a")
        tmp[b].write_text("new b")
    assert a.read_text() == "new a" and b.read_text() == "new b" and len(list(tmp_path.iterdir())) == 2
    with pytest.raises(ValueError, match="is a folder"):
        with staged_files([tmp_path]):
            pass


def test_writing_finds_the_disk_error_under_a_zlib_error(tmp_path):
    import zlib

    target = tmp_path / "r.pdf"
    with pytest.raises(OSError) as caught:
        with writing(target):
            try:
                disk_full()
            except OSError:
                raise zlib.error("Error -2 while flushing: inconsistent stream state")  # as PdfPages' close does
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    with pytest.raises(OSError) as other:
        with writing(target):
            open(tmp_path / "missing.ttf")
    assert other.value.filename == str(tmp_path / "missing.ttf")  # another file's error stays its own


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from pagesim.reports.execute import run_study
    from pagesim.reports.spec import parse_spec
    from tests.test_results_store import TINY

    out = tmp_path_factory.mktemp("study") / "s"
    run_study(parse_spec(TINY), out, workers=1, progress=False)
    return out


@pytest.mark.parametrize("fail", ["pdf", "html"])
def test_report_onto_a_full_disk_is_one_line_and_leaves_nothing(study, tmp_path, capsys, monkeypatch, fail):
    from matplotlib.backends.backend_pdf import PdfPages

    from pagesim.reports.html import HtmlReport

    pdf, html = tmp_path / "r.pdf", tmp_path / "r.html"
    monkeypatch.setattr(*((PdfPages, "savefig", disk_full) if fail == "pdf" else (HtmlReport, "save", disk_full)))
    line = one_error(capsys, ["report", str(study), "-o", str(pdf), "--html", str(html)])
    assert line == f"pagesim report: error: {pdf if fail == 'pdf' else html}: No space left on device"
    assert list(tmp_path.iterdir()) == []


@contextmanager
def small_tmpfs(path: Path, size: str):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.mark.parametrize("size", ["16k", "48k"])  # 16k: the disk fills inside a compressed stream (zlib.error)
def test_report_onto_a_real_full_disk(study, tmp_path, capsys, size):
    with small_tmpfs(tmp_path / "full", size) as full:
        line = one_error(capsys, ["report", str(study), "-o", str(full / "r.pdf")])
        assert line == f"pagesim report: error: {full / 'r.pdf'}: No space left on device"
        assert os.listdir(full) == []


def test_simulate_out_onto_a_real_full_disk(tmp_path, capsys):
    with small_tmpfs(tmp_path / "full", "64k") as full:
        out = full / "out"
        line = one_error(capsys, [*SIM, "--out", str(out)])
        assert line.startswith(f"pagesim simulate: error: {out}") and line.endswith("No space left on device")
        assert os.listdir(full) == []


def test_out_that_is_a_mount_point_is_written_in_place(tmp_path, capsys):
    """A container's volume given as --out cannot be renamed onto: its files are staged inside it
    and moved in (before, the rename failed after the run and every output file was lost)."""
    with small_tmpfs(tmp_path / "volume", "64m") as volume:
        assert main([*SIM, "--out", str(volume)]) == 0
        first = snapshot(volume)
        assert set(first) == SIM_FILES
        assert main([*SIM, "--out", str(volume), "--seed", "1"]) == 0  # and replaced in place
        assert set(os.listdir(volume)) == SIM_FILES and snapshot(volume) != first
    capsys.readouterr()


def test_a_private_out_folder_stays_private(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    os.chmod(out, 0o700)  # (whatever the umask)
    assert main([*SIM, "--out", str(out)]) == 0
    assert set(os.listdir(out)) == SIM_FILES and (out.stat().st_mode & 0o777) == 0o700
    capsys.readouterr()


def test_an_out_folder_that_cannot_be_written_is_refused_before_the_work(tmp_path, monkeypatch):
    import pagesim.engine.atomic as atomic

    def read_only(parent, name):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(parent / name))

    monkeypatch.setattr(atomic, "_fresh_folder", read_only)
    with pytest.raises(PermissionError):
        OutputFolder(tmp_path / "out", ("*.json",))
