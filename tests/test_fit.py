"""``pagesim calibrate --from-measurements`` (pagesim/sim/fit/): the cost model fitted to measured runs.

The fit is checked where the answer is known: vLLM bench result files written by ``pagesim
simulate`` with perturbed efficiencies, with noise added to every request's latencies, are fitted
back within the uncertainty the fit reports, and a held-out file is predicted as well as the
fitted ones. The profile it writes is applied by ``simulate --profile`` exactly as the same
parameters given by hand; bad measurements and mismatched profiles are one-line errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pagesim.engine.cli import main

TRUTH = {"mem_efficiency": 0.6, "mfu": 0.45, "cpu_step_s": 0.0005, "frontend_in_s": 0.002}
DEPLOYMENT = ["--gpu", "h100-sxm", "--model", "llama3-8b"]
WORKLOADS = {  # prefill-bound, decode-bound and mixed: together they tell the parameters apart
    "long": ["--dataset-name", "random", "--random-input-len", "3000", "--random-output-len", "16",
             "--num-requests", "200", "--rate", "2"],
    "short": ["--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "256",
              "--num-requests", "300", "--rate", "4"],
    "sharegpt": ["--workload", "kwon2023-sharegpt", "--num-requests", "1000", "--rate", "10"],
    "alpaca": ["--workload", "kwon2023-alpaca", "--num-requests", "1000", "--rate", "20", "--seed", "2"],
    "sharegpt-slow": ["--workload", "kwon2023-sharegpt", "--num-requests", "400", "--rate", "5", "--seed", "1"],
}


def measure(folder: Path, name: str, noise: float, rng: np.random.Generator) -> Path:
    """A vLLM bench result file of ``WORKLOADS[name]`` simulated at ``TRUTH``, its latencies
    multiplied by log-normal noise: ``noise`` for the whole run (a server a little faster or slower
    from one run to the next) and a quarter of that per request (a jitter, which widens the
    percentiles)."""
    truth = [f"--cost-param={k}={v}" for k, v in TRUTH.items() if k != "frontend_in_s"]
    status = main(["simulate", *WORKLOADS[name], *DEPLOYMENT, "--policy", "vllm-v1", *truth,
                   "--frontend-latency-ms", str(TRUTH["frontend_in_s"] * 1e3), "1", "--save-result", "--save-detailed",
                   "--result-dir", str(folder), "--result-filename", f"{name}.json", "--json", "--no-progress"])
    assert status == 0
    path = folder / f"{name}.json"
    doc = json.loads(path.read_text())
    n = len(doc["latencies"])
    run = rng.lognormal(0, noise)
    ttfts = np.array(doc["ttfts"]) * run * rng.lognormal(0, noise / 4, n)
    doc["ttfts"] = ttfts.tolist()
    doc["latencies"] = np.maximum(np.array(doc["latencies"]) * run * rng.lognormal(0, noise / 4, n), ttfts).tolist()
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("measured")
    rng = np.random.default_rng(1)
    return {name: measure(folder, name, 0.02, rng) for name in WORKLOADS}


@pytest.fixture(scope="module")
def fitted(measured, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("fit") / "profile.json"
    report = out.parent / "report"
    report.mkdir()
    status = main(["calibrate", "--from-measurements", str(measured["long"]), str(measured["short"]),
                   str(measured["sharegpt"]), str(measured["alpaca"]), "--holdout", str(measured["sharegpt-slow"]),
                   *DEPLOYMENT,
                   "--server-flags", "--policy vllm-v1", "--jobs", "1", "--out", str(out), "--report", str(report)])
    assert status == 0
    return out, json.loads(out.read_text())


def test_fit_recovers_the_parameters_within_its_uncertainty(fitted):
    _, doc = fitted
    for name, truth in TRUTH.items():
        p = doc["params"][name]
        assert p["std"] is not None and p["std"] > 0, name
        assert abs(p["value"] - truth) <= 3 * p["std"], (name, p, truth)
    assert doc["fit"]["cost_after"] < 0.01 * doc["fit"]["cost_before"]


def test_fit_predicts_the_held_out_rate(fitted, measured):
    from pagesim.sim.fit.evaluate import FULL, Evaluator
    from pagesim.sim.replay import median_abs_errors

    _, doc = fitted
    held = doc["errors"]["held_out"][0]
    assert held["measurement"] == "sharegpt-slow"
    # the noise alone: the held-out file against the simulator at the true parameters (its percentiles
    # are widened by the noise, its means hardly)
    settings = {"gpu": "h100-sxm", "model": "llama3-8b", "tp": None, "server_flags": ["--policy", "vllm-v1"], "seed": 0}
    floor = median_abs_errors(Evaluator([(str(measured["sharegpt-slow"]), settings)]).rows([(0, FULL, TRUTH)])[0])
    for figure in ("e2e", "ttft", "per_token"):
        assert held["before"][figure] > 0.1  # the start values are far off (efficiencies 0.8 and 0.7) ...
        assert held["after"][figure] < floor[figure] + 0.05, (figure, held["after"], floor)  # ... the fitted ones not
    folds = doc["errors"]["leave_one_out"]
    assert [f["measurement"] for f in folds] == ["long", "short", "sharegpt", "alpaca"]
    assert all(f["after"]["e2e"] < f["before"]["e2e"] for f in folds)


def test_profile_records_what_it_was_fitted_on(fitted, measured):
    _, doc = fitted
    assert doc["schema"] == "pagesim-fitted-profile" and doc["kind"] == "fitted" and doc["gpu"] == "h100-sxm"
    import hashlib

    first = doc["fitted_on"][0]
    assert first["path"] == str(measured["long"]) and first["kind"] == "vllm-bench"
    assert first["sha256"] == hashlib.sha256(b"long.json\0" + measured["long"].read_bytes()).hexdigest()
    assert set(doc["roofline"]) == {"mem_efficiency", "mfu", "cpu_step_s"}
    assert doc["serving_path"]["frontend_in_s"] == doc["params"]["frontend_in_s"]["value"]
    assert doc["fit"]["simulations"]["full"] > 0


def test_report_pages(fitted):
    out, _ = fitted
    from pypdf import PdfReader

    assert len(PdfReader(out.parent / "report" / "fit.pdf").pages) == 2
    page = (out.parent / "report" / "fit.html").read_text()
    assert "Measured vs predicted, before and after the fit" in page and "sharegpt-slow" in page


def test_simulate_applies_a_fitted_profile_as_its_parameters(fitted, capsys):
    out, doc = fitted
    source = ["--workload", "kwon2023-sharegpt", "--num-requests", "200", "--rate", "8", *DEPLOYMENT, "--json",
              "--no-progress"]
    assert main(["simulate", *source, "--profile", str(out)]) == 0
    with_profile = json.loads(capsys.readouterr().out)
    by_hand = [f"--cost-param={k}={v!r}" for k, v in doc["roofline"].items()]
    frontend = [str(doc["serving_path"]["frontend_in_s"] * 1e3), str(doc["serving_path"]["frontend_out_s"] * 1e3)]
    assert main(["simulate", *source, *by_hand, "--frontend-latency-ms", *frontend]) == 0
    given = json.loads(capsys.readouterr().out)
    assert with_profile.pop("profile") == {"kind": "fitted", "path": str(out),
                                           "words": f"fitted profile {out} (4 measurement(s) of llama3-8b on h100-sxm)"}
    assert with_profile["cost_model"] == given["cost_model"] == "roofline"
    for summary in (with_profile, given):
        summary.pop("sim_wall_s")
    assert with_profile == given


def test_fitted_profile_refusals(fitted, capsys):
    out, _ = fitted
    base = ["simulate", "--workload", "kwon2023-sharegpt", "--num-requests", "20", "--rate", "8", "--no-progress"]
    with pytest.raises(SystemExit) as exc:
        main([*base, "--gpu", "a100-80gb", "--profile", str(out)])
    assert exc.value.code == 2
    assert "was fitted on h100-sxm" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--gpu", "h100-sxm", "--profile", str(out), "--check-profile"])
    assert "fitted to measurements and has none" in capsys.readouterr().err


@pytest.mark.parametrize("problem, edit, words", [
    ("no lists", lambda d: d.pop("latencies"), "no per-request latencies"),
    ("all failed", lambda d: d.update(errors=["timeout"] * len(d["input_lens"])), "every request failed"),
    ("bad rate", lambda d: d.update(request_rate=-3), "request_rate: must be a number > 0"),
    ("mismatched lists", lambda d: d["ttfts"].pop(), "entries but"),
    ("unknown model", lambda d: d.update(model_id="no-such/model-xyz"), "no-such/model-xyz"),
    ("other model", lambda d: None, "measured on llama3-8b"),
    ("no send times", lambda d: (d.pop("request_rate"), d.pop("start_times")), "no request_rate and no start_times"),
])
def test_bad_measurements_are_one_clear_error(measured, tmp_path, capsys, problem, edit, words):
    doc = json.loads(measured["short"].read_text())
    edit(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    model = {"unknown model": [], "other model": ["--model", "mixtral-8x7b"]}.get(problem, ["--model", "llama3-8b"])
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--from-measurements", str(path), "--gpu", "h100-sxm", *model, "--out",
              str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and "Traceback" not in err, err
    assert len([line for line in err.splitlines() if "error" in line]) == 1, err
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("flags, words", [
    ([], "needs --gpu"),
    (["--gpu", "h100-sxm", "--device", "cpu"], "--device is for timing kernels"),
    (["--gpu", "h100-sxm", "--server-flags", "--no-such-flag 3"], "not flags pagesim replay takes"),
    (["--gpu", "h100-sxm", "--rounds", "0"], "--rounds must be >= 1"),
])
def test_bad_fit_flags(measured, tmp_path, capsys, flags, words):
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--from-measurements", str(measured["short"]), "--model", "llama3-8b", *flags,
              "--out", str(tmp_path / "p.json")])
    assert exc.value.code == 2 and words in capsys.readouterr().err


def test_missing_measurement(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["calibrate", "--from-measurements", str(tmp_path / "nothing.json"), "--gpu", "h100-sxm",
              "--out", str(tmp_path / "p.json")])
    assert "no such file or folder" in capsys.readouterr().err


def test_replay_refuses_a_kernel_timed_profile(capsys):
    from tests.test_inference_perf_reader import GROUNDTRUTH

    experiments = sorted(GROUNDTRUTH.glob("*/*llama*")) if GROUNDTRUTH.is_dir() else []
    if not experiments:
        pytest.skip("../shared/groundtruth is absent")
    with pytest.raises(SystemExit):
        main(["replay", str(experiments[0]), "--gpu", "h100-sxm", "--profile", "tiny-cpu"])
    assert "replay takes a fitted profile" in capsys.readouterr().err


def test_a_study_runs_on_a_fitted_profile(fitted):
    from pagesim.reports.pdf import _cost_model_words
    from pagesim.reports.runner import _run_spec, _serving_path
    from pagesim.reports.spec import SpecError, parse_spec

    out, doc = fitted
    text = (f'name = "fitted"\nprofile = "{out}"\n[source]\nworkload = "kwon2023-sharegpt"\nnum_requests = 50\n'
            f'rate = 4.0\n[base]\nmodel = "llama3-8b"\ngpu = "h100"\npolicy = "vllm-v1"\n[grid]\nblock_size = [16, 32]\n')
    spec = parse_spec(text)
    configs = spec.runs()
    assert len(configs) == 2
    for config in configs:
        assert {k: _run_spec(config).cost_params[k] for k in doc["roofline"]} == doc["roofline"]
        assert _serving_path(config).frontend_in_s == pytest.approx(doc["serving_path"]["frontend_in_s"])
    assert "fitted profile" in _cost_model_words(spec.base)
    with pytest.raises(SpecError, match="was fitted on h100-sxm"):
        parse_spec(text.replace('gpu = "h100"', 'gpu = "a100-80gb"'))
    with pytest.raises(SpecError, match="not a fitted profile"):
        parse_spec(text.replace(str(out), "tiny-cpu"))


def test_objective_counts_a_saturated_stage_by_its_failures():
    from pagesim.sim.fit.objective import CLIP, layout, residuals
    from pagesim.sim.replay import Comparison

    measured = {"e2e": {"mean": 2.0, "p90": 3.0, "p99": 4.0}, "ttft": {"mean": 0.1, "p90": 0.2, "p99": 0.4},
                "per_token": {"mean": 0.01}}
    clean = Comparison(0, 2.0, 100, measured=measured, measured_counts=(100, 0), predicted_counts=(98, 2),
                       predicted={"e2e": {"mean": 2.2, "p99": 4.0}, "ttft": {"mean": 0.05, "p99": None},
                                  "per_token": {"mean": 0.01}})
    saturated = Comparison(1, 9.0, 100, measured=measured, measured_counts=(40, 60), predicted_counts=(50, 50),
                           predicted={"e2e": {"mean": 9.9}, "ttft": {"mean": 9.9}, "per_token": {"mean": 9.9}})
    whole = Comparison(None, None, 200, measured=measured, measured_counts=(140, 60), predicted_counts=(148, 52),
                       predicted=clean.predicted)
    rows = [clean, saturated, whole]
    terms = layout(rows)  # (the stages; the whole run is theirs summed)
    assert terms == [(0, "e2e", "mean"), (0, "e2e", "p99"), (0, "ttft", "mean"), (0, "ttft", "p99"),
                     (0, "per_token", "mean"), (0, "failures", "fraction"), (1, "failures", "fraction")]
    r = residuals(rows, terms)
    assert r[0] == pytest.approx(np.log(1.1)) and r[1] == 0.0 and r[2] == pytest.approx(np.log(0.5))
    assert r[3] == CLIP  # (a latency the simulator did not produce)
    assert r[5] == pytest.approx(0.02) and r[6] == pytest.approx(-0.1)


def test_parameters_stay_in_their_bounds():
    from pagesim.sim.fit.params import FREE_PARAMS, bounds, free_params, simulation_settings, values

    assert [p.name for p in free_params(1)] == ["mem_efficiency", "mfu", "cpu_step_s", "frontend_in_s"]
    assert "interconnect_efficiency" in [p.name for p in free_params(2)]
    assert "cpu_per_seq_s" in [p.name for p in free_params(1, overlapped=False)]
    free = tuple(FREE_PARAMS.values())
    lo, hi = bounds(free)
    assert (lo < 0).all() and (hi >= 0).all()
    assert values(free, np.full(len(free), 50.0)) == {p.name: p.upper for p in free}
    assert values(free, np.full(len(free), -50.0)) == {p.name: p.lower for p in free}
    roofline, frontend = simulation_settings({"mfu": 0.5, "frontend_in_s": 0.004})
    assert roofline == {"mfu": 0.5} and frontend == (4.0, 1.0)
