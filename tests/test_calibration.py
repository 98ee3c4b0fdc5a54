"""Calibration profiles, their interpolation, the calibrated cost model, and ``pagesim calibrate``.

The cost-model tests use synthetic profiles whose tables follow known formulas, so every
prediction has an exact expected value; the calibration tests time the real code on tiny grids
(a few seconds) and check the profile's structure, never a timing.
"""

from __future__ import annotations

import json
import math

import pytest

from pagesim.sim.cost.base import StepWork
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.interpolate import TableModel, fit_roofline
from pagesim.sim.cost.profile import TABLES, Profile, ProfileError, Table, grid_points, load_profile, save_profile
from tests.calibration_support import TINY_GRID, calibrate_tiny, synthetic_profile


# ---------------------------------------------------------------- profile file
def test_profile_round_trips(tmp_path):
    p = synthetic_profile()
    save_profile(p, tmp_path / "p.json")
    q = load_profile(tmp_path / "p.json")
    assert q.tables == p.tables and q.model == p.model and q.complete


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(schema="other"), "not a pagesim calibration profile"),
    (lambda d: d.update(schema_version=99), "schema version 99"),
    (lambda d: d.update(complete=False), "incomplete"),
    (lambda d: d["tables"].pop("policy"), "missing policy"),
    (lambda d: d["tables"].update(extra=d["tables"]["policy"]), "unknown table"),
    (lambda d: d["tables"]["policy"].update(median_s=[1.0]), "grid points but 1 medians"),
    (lambda d: d["tables"]["policy"]["grid"][0].reverse(), "ascending"),
    (lambda d: d["tables"]["policy"].update(axes=["tokens"]), "this version reads axes"),
    (lambda d: d["model"].pop("num_layers"), "lack num_layers"),
    (lambda d: d["tables"]["policy"].update(median_s=[float("nan")] * len(d["tables"]["policy"]["median_s"])),
     "finite"),
])
def test_malformed_profiles_are_refused_by_name(tmp_path, edit, message):
    d = synthetic_profile().to_dict()
    edit(d)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ProfileError, match=message):
        load_profile(path)


def test_a_missing_or_non_json_profile_says_so(tmp_path):
    with pytest.raises(ProfileError, match="no such file"):
        load_profile(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ProfileError, match="not JSON"):
        load_profile(tmp_path / "bad.json")


# -------------------------------------------------------------- interpolation
def _table(name, grid, fn, samples=None):
    axes = tuple(tuple(map(float, g)) for g in grid)
    med = tuple(fn(*p) for p in grid_points(axes))
    return Table(name, TABLES[name][0], axes, med, (0.0,) * len(med), tuple((m,) * (samples or 3) for m in med),
                 TABLES[name][1])


def test_multilinear_interpolation_is_exact_for_multilinear_costs():
    fn = lambda bs, n, c: 1e-5 + 2e-6 * n + 3e-9 * n * c + 1e-7 * n * c / bs  # noqa: E731
    t = _table("decode_attention", [[8, 16, 32], [1, 4, 16], [1, 64, 256]], fn)
    model = TableModel(t)
    for point in [(8, 1, 1), (16, 4, 64), (12, 3, 100), (32, 16, 256), (20, 10, 17)]:
        got, inside = model.predict(point)
        assert inside
        # multilinear in (n, c) exactly; 1/bs is convex, so linear in bs overestimates between grid values
        if point[0] in (8, 16, 32):
            assert got == pytest.approx(fn(*point), rel=1e-9)
        else:
            assert fn(*point) <= got <= fn(*point) * 1.2


def test_outside_the_grid_the_fitted_roofline_form_extrapolates():
    fn = lambda tokens: 5e-5 + 2e-7 * tokens  # noqa: E731
    t = _table("dense_layer", [[1, 2, 4, 8, 16, 32]], fn)
    coef = fit_roofline(t)
    assert coef == pytest.approx((5e-5, 2e-7), rel=1e-6)
    model = TableModel(t)
    got, inside = model.predict((4096,))
    assert not inside and got == pytest.approx(fn(4096), rel=1e-6)


def test_the_fit_keeps_coefficients_non_negative():
    # decreasing samples would fit a negative slope: the slope is dropped instead
    t = _table("policy", [[1, 2, 4]], lambda n: 1e-4 / n)
    assert all(c >= 0 for c in fit_roofline(t))


# --------------------------------------------------------- calibrated model
def test_step_cost_composes_the_tables_as_documented():
    p = synthetic_profile()
    cm = CalibratedCostModel(p)
    L = p.num_layers
    f = synthetic_profile.formulas
    work = StepWork(num_seqs=5, num_tokens=20, num_prefill_seqs=1, num_prefill_tokens=16,
                    prefill_attention_pairs=16 * 8 + 16 * 17 // 2, prefill_context_tokens=8, num_decode_seqs=4,
                    decode_context_tokens=4 * 32, num_sampled=5, num_cow_blocks=2, num_swap_out_blocks=3,
                    num_swap_in_blocks=1, block_size=16)
    terms = cm.step_cost(work).terms
    assert terms["linear"] == pytest.approx(L * f["dense_layer"](20) + f["model_outer"](20) + f["lm_head"](5))
    assert terms["cache_write"] == pytest.approx(L * f["cache_write"](20))
    assert terms["decode_attention"] == pytest.approx(L * f["decode_attention"](16, 4, 32))
    assert terms["prefill_attention"] == pytest.approx(L * f["prefill_attention"](16, 8))
    assert terms["cow_copy"] == pytest.approx(L * f["cow_copy"](16, 2))
    assert terms["swap"] == pytest.approx(L * (f["swap_out"](16, 3) + f["swap_in"](16, 1)))
    assert terms["sampling"] == pytest.approx(f["sampling"](5))
    assert terms["cpu_overhead"] == pytest.approx(f["policy"](5) + f["batch_prep"](5))
    assert not cm.extrapolated


def test_unequal_prefill_chunks_cost_their_extra_attention_pairs():
    cm = CalibratedCostModel(synthetic_profile())
    equal = StepWork(num_seqs=2, num_tokens=64, num_prefill_seqs=2, num_prefill_tokens=64,
                     prefill_attention_pairs=2 * (32 * 33 // 2), block_size=16)
    unequal = StepWork(num_seqs=2, num_tokens=64, num_prefill_seqs=2, num_prefill_tokens=64,
                       prefill_attention_pairs=60 * 61 // 2 + 4 * 5 // 2, block_size=16)
    pair_s = synthetic_profile.formulas["pair_s"]
    extra = unequal.prefill_attention_pairs - equal.prefill_attention_pairs
    diff = cm.step_cost(unequal).terms["prefill_attention"] - cm.step_cost(equal).terms["prefill_attention"]
    assert diff == pytest.approx(synthetic_profile().num_layers * pair_s * extra, rel=1e-6)


def test_steps_beyond_the_grid_are_counted_as_extrapolated():
    cm = CalibratedCostModel(synthetic_profile())
    cm.step_cost(StepWork(num_seqs=1, num_tokens=100_000, num_prefill_seqs=1, num_prefill_tokens=100_000,
                          prefill_attention_pairs=100_000 * 100_001 // 2, num_sampled=1, block_size=16))
    assert cm.extrapolated["dense_layer"] == 1 and cm.extrapolated["prefill_attention"] == 1
    assert cm.describe()["extrapolated"]["dense_layer"] == 1


def test_a_profile_of_other_shapes_is_refused():
    from pagesim.engine.model_presets import get_model_preset

    cm = CalibratedCostModel(synthetic_profile())
    cm.check_model(get_model_preset("tiny"))
    with pytest.raises(ProfileError, match="measured for tiny"):
        cm.check_model(get_model_preset("small"))


# ---------------------------------------------------------------- calibrate
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    return calibrate_tiny(tmp_path_factory.mktemp("cal") / "profile.json")


def test_calibrate_writes_a_complete_profile_with_raw_samples(tiny_profile):
    p = load_profile(tiny_profile.path)
    assert p.complete and set(p.tables) == set(TABLES)
    assert p.model["name"] == "tiny" and p.model["dtype"] == "float64" and p.model["num_layers"] == 2
    assert p.device["type"] == "cpu" and p.settings["threads"] == 1 and p.versions["torch"]
    for name, table in p.tables.items():
        assert [list(g) for g in table.grid] == [list(map(float, g)) for g in TINY_GRID[name]]
        assert all(len(s) == 3 and all(x > 0 for x in s) for s in table.samples_s), name
        assert all(math.isclose(m, sorted(s)[1]) for m, s in zip(table.median_s, table.samples_s)), name
    CalibratedCostModel(p)  # usable


def test_an_interrupted_calibration_resumes_keeping_finished_tables(tmp_path):
    from pagesim.engine.calibrate.calibrate import SettingsMismatch, calibrate
    from pagesim.engine.model.config import LlamaConfig

    out = tmp_path / "p.json"
    kwargs = dict(out=out, device=torch.device("cpu"), dtype=torch.float64, backend="torch", threads=1, warmup=0,
                  repeats=2, grid=TINY_GRID)
    seen = []

    def stop_at_third(name, points):
        seen.append(name)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        calibrate(LlamaConfig.named("tiny"), on_table=stop_at_third, **kwargs)
    partial = load_profile(out, require_complete=False)
    assert not partial.complete and set(partial.tables) == set(seen[:2])
    with pytest.raises(ProfileError, match="incomplete"):
        load_profile(out)
    resumed_tables = []
    done = calibrate(LlamaConfig.named("tiny"), on_table=lambda name, n: resumed_tables.append(name), **kwargs)
    assert done.complete and seen[0] not in resumed_tables and seen[2] in resumed_tables
    assert done.tables[seen[0]] == partial.tables[seen[0]]  # kept, not measured again
    with pytest.raises(SettingsMismatch, match="other settings"):
        calibrate(LlamaConfig.named("tiny"), **{**kwargs, "repeats": 3})
    calibrate(LlamaConfig.named("tiny"), force=True, **{**kwargs, "repeats": 1})
    assert load_profile(out).settings["repeats"] == 1


def test_calibrate_cli_errors_are_one_line(tmp_path, capsys):
    from pagesim.engine.cli import main

    for argv, message in [
        (["--repeats", "0"], "--repeats must be >= 1"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--out", str(tmp_path)], "is a folder"),
        (["--out", str(tmp_path / "no" / "p.json")], "does not exist"),
        (["--model", "nosuch"], "unknown model preset"),
        (["--device", "cpu", "--backend", "triton", "--dtype", "float64"], "float64|TRITON_INTERPRET"),
    ]:
        with pytest.raises(SystemExit) as exc:
            main(["calibrate", "--device", "cpu", *argv])
        assert exc.value.code == 2
        assert __import__("re").search(message, capsys.readouterr().err), argv


def test_simulate_with_a_profile_uses_the_calibrated_model(tiny_profile, capsys):
    from pagesim.engine.cli import main

    argv = ["simulate", "--workload", "kwon2023-alpaca", "--num-requests", "30", "--rate", "20", "--model", "tiny",
            "--num-gpu-blocks", "64", "--profile", tiny_profile.path, "--json", "--no-progress"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["cost_model"] == "calibrated" and summary["requests_completed"] == 30
    assert "cost_model_extrapolated" in summary
    for extra, message in [(["--tp", "2"], "--tp 2"), (["--cost-param", "mfu=0.5"], "--cost-param"),
                           (["--model", "small"], "measured for tiny")]:
        with pytest.raises(SystemExit):
            main([*argv, *extra])
        assert message in capsys.readouterr().err


def test_profile_describes_its_device(tiny_profile):
    assert "tiny (float64)" in tiny_profile.describe() and "1 thread" in tiny_profile.describe()
    assert isinstance(tiny_profile, Profile)
