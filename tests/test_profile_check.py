"""A profile that knows when it no longer describes the machine (``pagesim.engine.calibrate.probe``):
the load it was measured under, its probe re-timed, and its fingerprint, in ``validate`` and
``simulate --check-profile``."""

from __future__ import annotations

import json

import pytest

from pagesim.engine.calibrate.probe import BUSY_SHARE, PROBE_POINT_S, PROBE_TABLES, busy_words
from pagesim.sim.cost.profile import ProfileError, load_profile

torch = pytest.importorskip("torch")

from pagesim.engine.cli import main  # noqa: E402
from tests.calibration_support import calibrate_tiny  # noqa: E402


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe") / "profile.json"
    calibrate_tiny(out)
    return out


def _edited(profile_path, tmp_path, edit):
    data = json.loads(profile_path.read_text())
    edit(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    return str(path)


def _slower_at_calibration(data, factor=20.0, tables=True):
    """A profile measured ``factor`` times slower than this machine runs now: its probe, and its
    tables (unless not ``tables``), the probe then equal to the tables at its points (steady)."""
    if tables:
        for table in data["tables"].values():
            table["median_s"] = [x * factor for x in table["median_s"]]
            table["samples_s"] = [[x * factor for x in s] for s in table["samples_s"]]
    for point in data["probe"]["points"]:
        if tables:
            table = data["tables"][point["table"]]
            grid = [tuple(map(float, p)) for p in __import__("itertools").product(*table["grid"])]
            point["median_s"] = table["median_s"][grid.index(tuple(point["point"]))]
        else:
            point["median_s"] *= factor
    data["probe"]["total_s"] = sum(p["median_s"] for p in data["probe"]["points"])
    data["conditions"].update(load_average_max=0.5, cpus=2, cpu_share=1.0)  # quiet (this test machine may not be)


def test_a_profile_records_its_load_and_a_probe_of_its_own_grid_points(profile_path):
    p = load_profile(profile_path)
    c = p.conditions
    assert c["cpus"] >= 1 and 0 < c["cpu_share"] <= 1 and isinstance(c["busy"], bool) and c["wall_s"] > 0
    # (the start is the minute before the run, reported but not judged: the load may fall below it)
    assert c["load_average_start"] >= 0 and c["load_average_max"] >= 0
    points = p.probe["points"]
    tables = [q["table"] for q in points]
    assert set(tables) == set(PROBE_TABLES) and all(1 <= tables.count(t) <= 2 for t in PROBE_TABLES)
    for q in points:
        assert tuple(q["point"]) in p.tables[q["table"]].points()  # one of the profile's own grid points
        assert q["median_s"] > 0
    assert p.probe["total_s"] == pytest.approx(sum(q["median_s"] for q in points))
    # what re-timing it costs is bounded by its choice of cheap points, not asserted on the wall clock
    # (a quick profile's probe took 14 s and 38 s on a busy 2-core machine, 0.1 s of it timed calls)
    assert p.probe["repeats"] >= 5 and p.probe["wall_s"] > 0
    for q in points:
        table = p.tables[q["table"]]
        cheap = [m for m in table.median_s if m <= PROBE_POINT_S]
        assert table.median_s[table.points().index(tuple(q["point"]))] <= PROBE_POINT_S or not cheap


def test_busy_conditions_are_named_in_words():
    assert busy_words({"cpus": 2, "load_average_max": 1.5, "cpu_share": 0.97}) is None
    assert busy_words(None) is None
    words = busy_words({"cpus": 2, "load_average_max": 6.6, "cpu_share": BUSY_SHARE - 0.4})
    assert "load average up to 6.6 on 2 CPUs" in words and "got 45% of a CPU" in words


def test_the_probe_re_timed_now_flags_a_profile_measured_slower(profile_path, tmp_path):
    from pagesim.engine.calibrate.probe import check_profile

    stale = load_profile(_edited(profile_path, tmp_path, _slower_at_calibration))
    check = check_profile(stale)
    assert check.ratio is not None and check.ratio < 0.75 and check.probe_ok is False
    words = " ".join(check.warnings)
    assert "no longer describes this machine" in words and "did not hold steady" not in words
    assert (f"took {check.probe_then_s * 1e3:.3g} ms at calibration and takes {check.probe_now_s * 1e3:.3g} ms now"
            in words) and f"per point it takes {check.ratio:.2f}x its time at calibration (geometric mean), more than 20% off" in words
    points = check.to_dict()["probe_points"]
    assert len(points) == len(stale.probe["points"])
    assert all(q["profile_s"] > 0 and q["now_s"] > 0 and q["then_s"] > 0 for q in points)
    steady = _edited(profile_path, tmp_path, lambda d: _slower_at_calibration(d, 1.0))  # (tables == probe then)
    relaxed = check_profile(load_profile(steady), tolerance=9.0)  # the profile against itself, leniently
    assert relaxed.probe_ok is True and not [w for w in relaxed.warnings if "probe" in w]


def test_a_probe_that_moved_during_calibration_says_the_machine_was_unsteady(profile_path, tmp_path):
    from pagesim.engine.calibrate.probe import check_profile

    unsteady = load_profile(_edited(profile_path, tmp_path, lambda d: _slower_at_calibration(d, 1000.0, tables=False)))
    words = " ".join(check_profile(unsteady, tolerance=9.0).warnings)
    assert "did not hold steady while the profile was measured" in words and "re-timed at the end" in words


def test_no_probe_a_busy_calibration_and_another_machine_are_each_a_warning(profile_path, tmp_path):
    from pagesim.engine.calibrate.probe import check_profile

    def edit(data):
        del data["probe"]
        data["conditions"].update(load_average_max=9.0, cpus=2, cpu_share=0.3)
        data["device"]["name"] = "Some Other CPU"
        data["versions"]["torch"] = "0.0.1"

    check = check_profile(load_profile(_edited(profile_path, tmp_path, edit)))
    words = "\n".join(check.warnings)
    assert "has no probe" in words and "busy machine (1-minute load average up to 9.0 on 2 CPUs" in words
    assert "device name: profile Some Other CPU, here" in words and "torch: profile 0.0.1, here" in words
    assert not check.ok and check.probe_then_s is None


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["probe"].update(points=[]), "malformed 'probe'"),
    (lambda d: d["probe"]["points"][0].update(table="nosuch"), "malformed 'probe'"),
    (lambda d: d["probe"]["points"][0].update(median_s=float("nan")), "malformed 'probe'"),
    (lambda d: d["probe"].update(total_s=1e9), "malformed 'probe'"),
    (lambda d: d["probe"]["points"][0].update(point="11"), "malformed 'probe'"),
    (lambda d: d["probe"]["points"][0].update(median_s=True), "malformed 'probe'"),
    (lambda d: d.update(conditions=[1, 2]), "malformed 'conditions'"),
    (lambda d: d["conditions"].update(load_average_max="high"), "malformed 'conditions'"),
    (lambda d: d["conditions"].update(cpus=0), "malformed 'conditions'"),
    (lambda d: d["conditions"].update(cpus=True), "malformed 'conditions'"),
    (lambda d: d["conditions"].update(cpu_share=float("inf")), "malformed 'conditions'"),
])
def test_a_malformed_probe_or_conditions_is_refused(profile_path, tmp_path, edit, message):
    with pytest.raises(ProfileError, match=message):
        load_profile(_edited(profile_path, tmp_path, edit))


def _run(argv, capsys):
    threads = torch.get_num_threads()
    try:
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    finally:
        torch.set_num_threads(threads)
    return code, capsys.readouterr()


SMALL = ["--workload", "kwon2023-alpaca", "--num-requests", "6", "--rate", "40", "--num-gpu-blocks", "32",
         "--block-size", "8"]


def test_validate_warns_with_both_figures_and_strict_stops(profile_path, tmp_path, capsys):
    stale = _edited(profile_path, tmp_path, _slower_at_calibration)
    code, cap = _run(["validate", *SMALL, "--profile", stale, "--noise-runs", "0", "--no-reference", "--json"], capsys)
    assert code == 0
    report = json.loads(cap.out)
    check = report["profile_check"]
    assert check["ok"] is False and check["probe_ok"] is False and check["probe_ratio"] < 0.75
    assert "pagesim validate: warning: the profile no longer describes this machine" in cap.err
    then_s = load_profile(stale).probe["total_s"]  # (the report's figures are rounded to 4 digits, the message's to 3)
    assert f"took {then_s * 1e3:.3g} ms at calibration" in cap.err
    code, cap = _run(["validate", *SMALL, "--profile", stale, "--noise-runs", "0", "--strict"], capsys)
    assert code == 2 and "does not hold on this machine" in cap.err and "(--strict)" in cap.err
    code, cap = _run(["validate", *SMALL, "--profile", stale, "--profile-tolerance", "0"], capsys)
    assert code == 2 and "--profile-tolerance must be in (0, 10)" in cap.err


def test_simulate_checks_a_profile_when_asked(profile_path, tmp_path, capsys):
    base = ["simulate", *SMALL, "--model", "tiny", "--json", "--no-progress"]
    stale = _edited(profile_path, tmp_path, _slower_at_calibration)
    code, cap = _run([*base, "--profile", stale], capsys)
    assert code == 0 and "warning" not in cap.err  # no re-timing unless asked
    code, cap = _run([*base, "--profile", stale, "--check-profile"], capsys)
    assert code == 0 and "no longer describes this machine" in cap.err
    assert json.loads(cap.out)["cost_model"] == "calibrated"
    code, cap = _run([*base, "--profile", stale, "--check-profile", "--strict"], capsys)
    assert code == 2 and "(--strict)" in cap.err
    busy = _edited(profile_path, tmp_path, lambda d: d["conditions"].update(load_average_max=50.0, cpus=2,
                                                                                  cpu_share=1.0))
    code, cap = _run([*base, "--profile", busy], capsys)  # measured busy: said without re-timing
    assert code == 0 and "measured on a busy machine (1-minute load average up to 50.0 on 2 CPUs)" in cap.err
    code, cap = _run([*base, "--check-profile"], capsys)
    assert code == 2 and "give --profile FILE" in cap.err


def test_a_resumed_calibration_keeps_the_worst_load(monkeypatch):
    import pagesim.engine.calibrate.probe as probe

    class Clock:  # this stretch as a quiet machine gives it (2 s, all on the CPU), whatever this one is doing
        now_s = 0.0

        def perf_counter(self) -> float:
            return self.now_s

        process_time = perf_counter

    clock = Clock()
    monkeypatch.setattr(probe, "time", clock)
    monkeypatch.setattr(probe, "load_average", lambda: 0.5)
    earlier = {"load_average_max": 40.0, "cpu_share": 0.2, "wall_s": 3.0, "busy": True, "cpus": 2}
    monitor = probe.LoadMonitor("cpu", 1, earlier=earlier)
    clock.now_s = 2.0
    c = monitor.conditions()
    assert c["load_average_max"] == 40.0 and c["cpu_share"] == 0.2 and c["busy"] is True and c["resumed"] is True
    assert c["wall_s"] == 5.0


def test_load_share_is_judged_for_one_thread_only():
    from pagesim.engine.calibrate.probe import LoadMonitor

    assert "cpu_share" in LoadMonitor("cpu", 1).conditions()
    assert "cpu_share" not in LoadMonitor("cpu", 2).conditions()  # serial parts keep it low on a quiet machine too
    assert "cpu_share" not in LoadMonitor("cuda", 1).conditions()


def test_a_probe_that_cannot_run_here_is_a_warning_not_a_traceback(profile_path, monkeypatch):
    import pagesim.engine.calibrate.probe as probe

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory\nmore lines")

    monkeypatch.setattr(probe, "run_probe", broken)
    check = probe.check_profile(load_profile(profile_path))
    assert "could not re-time the profile's probe here (RuntimeError: CUDA error: out of memory)" in check.warnings
    assert check.probe_now_s is None and not check.ok


def test_more_threads_than_cpus_is_a_fingerprint_difference(profile_path, tmp_path):
    from pagesim.engine.calibrate.probe import fingerprint_differences, usable_cpus

    wide = load_profile(_edited(profile_path, tmp_path, lambda d: d["settings"].update(threads=usable_cpus() + 3)))
    assert f"CPU threads: profile {usable_cpus() + 3}, here {usable_cpus()} CPUs usable" in fingerprint_differences(wide)


def test_calibrating_a_complete_profile_again_keeps_it_and_its_probe(profile_path, tmp_path):
    out = tmp_path / "again.json"
    out.write_bytes(profile_path.read_bytes())
    before = load_profile(out)
    again = calibrate_tiny(out)
    assert again.probe == before.probe and again.conditions == before.conditions  # not re-probed later
    assert load_profile(out).probe == before.probe


def test_the_load_judged_is_the_worst_sampled_during_the_run_not_the_minute_before(monkeypatch):
    """``load_average_max`` is the highest load sampled while the calibration ran (after each
    table and at the end); the load when it started is reported beside it, and may be higher."""
    from pagesim.engine.calibrate import probe

    loads = iter([3.0, 1.0, 2.0, 1.5])  # at the start, after two tables, at the end
    monkeypatch.setattr(probe, "load_average", lambda: next(loads))
    monitor = probe.LoadMonitor("cpu", threads=1)
    monitor.sample()
    monitor.sample()
    conditions = monitor.conditions()
    assert conditions["load_average_start"] == 3.0
    assert conditions["load_average_max"] == 2.0
