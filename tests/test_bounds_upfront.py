"""Bounds and checks before anything is allocated or run (issue 56, build item 4), and the silent
cases beside them:

- ``run`` refuses a model and KV cache that do not fit in memory, with each size (``llama3-8b``
  died inside torch's allocator), on a CPU and beside a GPU;
- an allocation a flag sizes names the flag (numpy's "Unable to allocate 16.0 GiB" named none: the
  random dataset's ``--random-input-len`` x ``--num-prompts``; ``--block-size 100000``);
- a study plans every run before the first one runs (``tp = 3`` against 32 heads, names that only
  fail together, arrivals without a rate) and refuses what could only fail;
- ``--strict`` refuses a profile of another device without ``--check-profile``;
- a ``config.json`` of an unknown architecture is noted, or refused where its shapes cannot be
  read as a Llama's;
- ``reproduce --figures ''`` names no figure and is refused;
- a plug-in's ``os._exit(0)`` is an error, not the end of pagesim with exit 0.

CLI refusals run the real command (``tests/bad_inputs_harness.py``): one error line, exit 2.
"""

from __future__ import annotations

import dataclasses
import json
import re
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pagesim.engine.memory_fit import GiB, Available, memory_error_words
from pagesim.reports.spec import SpecError, parse_spec
from tests.bad_inputs_harness import ENV, PAGESIM, ROOT, Outcome, error_line, run_pagesim

LIMIT_S = 60.0
SIM = ["simulate", "--no-progress", "--json", "--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "20"]
SOURCE = """\
name = "upfront"
[source]
workload = "shared-system-prompt"
rate = 6.0
num_requests = 20
"""


def refused(argv: list[str], cwd: Path, command: str) -> str:
    outcome = run_pagesim(argv, cwd=cwd, limit_s=LIMIT_S)
    assert outcome.returncode == 2 and outcome.killed_for is None, outcome.describe()
    return error_line(outcome, command)


# ------------------------------------------------------------------ run: the model and the KV cache
@pytest.fixture
def eight_gib(monkeypatch):
    """8 GiB available in RAM, whatever this machine has; and no model loaded."""
    import pagesim.engine.model
    import pagesim.engine.runtime.memory_check as memory_check

    monkeypatch.setattr(memory_check, "host_available", lambda: Available(8 * GiB, "available in RAM"))
    monkeypatch.setattr(pagesim.engine.model, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))


def test_run_refuses_a_model_that_does_not_fit_with_each_size(eight_gib, capsys):
    from pagesim.engine.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["run", "--model", "llama3-8b", "--num-gpu-blocks", "64", "--workload", "kwon2023-alpaca",
              "--num-requests", "4", "--no-progress"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    # 8.03 billion parameters x 8 bytes (float64 on a CPU); 64 blocks of 16 tokens x 32 layers x 8 KV heads
    # x 128 x 2 x 8 bytes = 0.5 GiB, and as many swap blocks; drawn, and built, in float32 first
    assert re.fullmatch(r"pagesim run: error: the model and its KV cache do not fit: need 59\.83 GiB for the weights "
                        r"\(8\.03 billion parameters in float64\) \+ 1\.00 GiB for the KV cache and swap space, and "
                        r"[\d.]+ GiB more while the weights are loaded \(drawn in float32, then built in float32 and "
                        r"cast\); 8\.00 GiB is available in RAM \(a smaller --model, or a smaller --dtype: float32 "
                        r"takes 4 bytes a parameter, bfloat16 2\)\n", err), err


def test_run_names_the_kv_flags_when_the_cache_is_what_does_not_fit(eight_gib, capsys):
    from pagesim.engine.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--kv-cache-gb", "12", "--workload", "kwon2023-alpaca", "--num-requests", "4", "--no-progress"])
    err = capsys.readouterr().err
    # 12 GiB of cache and vLLM's default 4 GiB of swap space beside tiny's 139,584 parameters
    assert err == ("pagesim run: error: the model and its KV cache do not fit: need 0.00104 GiB for the weights "
                   "(139,584 parameters in float64) + 16.00 GiB for the KV cache and swap space; 8.00 GiB is available "
                   "in RAM (fewer --num-gpu-blocks / --num-cpu-blocks, or a smaller --kv-cache-gb / --swap-space)\n")


def test_an_allocation_failing_past_the_check_is_one_line_naming_the_model(monkeypatch, capsys):
    """Memory taken by another process between the check and the load: torch's words, in one line."""
    import pagesim.engine.model
    import pagesim.engine.runtime.memory_check as memory_check
    from pagesim.engine.cli import main

    def fails(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 234881024 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(memory_check, "host_available", lambda: Available(1 << 50, "available in RAM"))
    monkeypatch.setattr(pagesim.engine.model, "load_model", fails)
    with pytest.raises(SystemExit) as exc:
        main(["run", "--workload", "kwon2023-alpaca", "--num-requests", "4", "--no-progress"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err == (
        "pagesim run: error: cannot allocate the model's weights (--model tiny): [enforce fail at alloc_cpu.cpp:127] "
        "err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 234881024 bytes. Error code 12 "
        "(Cannot allocate memory)\n")


def test_beside_a_gpu_the_weights_are_judged_against_its_free_memory(monkeypatch):
    """A CUDA run: the weights (built in float32, then cast) against the GPU's free memory, the
    float32 draw and the swap space against the host's."""
    import torch

    from pagesim.engine.model.config import LlamaConfig
    from pagesim.engine.policy import make_config
    from pagesim.engine.runtime import memory_check

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (16 * GiB, 80 * GiB))
    monkeypatch.setattr(memory_check, "host_available", lambda: Available(512 * GiB, "available in RAM"))
    config = LlamaConfig.named("llama3-8b")
    sched = make_config("pagesim", block_size=16, num_gpu_blocks=100, num_cpu_blocks=0, max_model_len=8192)
    with pytest.raises(ValueError) as exc:
        memory_check.check_memory(config, torch.bfloat16, torch.device("cuda"), sched, model="llama3-8b")
    assert re.fullmatch(r"the model and its KV cache do not fit: need 14\.96 GiB for the weights \(8\.03 billion "
                        r"parameters in bfloat16\) \+ [\d.]+ GiB for the KV cache, and 1[5-6]\.\d\d GiB more while the "
                        r"weights are built in float32 and cast; 16\.00 GiB is free on the GPU \(a smaller --model.*",
                        str(exc.value)), exc.value
    memory_check.check_memory(config, torch.bfloat16, torch.device("cuda"), sched)  # (loaded: the cache alone fits)


def test_a_bare_memory_error_gives_the_sizes_known():
    words = memory_error_words(MemoryError())
    assert re.fullmatch(r"not enough memory for what was asked \(this process held [\d.]+ GiB at most; [\d.]+ GiB is "
                        r"(available in RAM|left under .*)\)", words), words
    assert memory_error_words(MemoryError("Unable to allocate 1 GiB\nmore")) == "Unable to allocate 1 GiB"


# ------------------------------------------------------------------ allocations a flag sizes
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmSize from /proc")
@pytest.mark.parametrize("flags, named", [
    (["--dataset-name", "random", "--random-input-len", "2097152"],
     r"--random-input-len 2097152 and --random-prefix-len 0 x --num-prompts 1000: 2,097,152,000 token ids would "
     r"take 15\.70 GiB"),
    (["--dataset-name", "prefix_repetition", "--num-prompts", "10", "--prefix-repetition-prefix-len", "2000000000"],
     r"--prefix-repetition-prefix-len 2000000000 and --prefix-repetition-suffix-len 256 x --num-prompts 10: "),
])
def test_dataset_token_arrays_too_large_name_their_flags(tmp_path, flags, named):
    """Under a 4 GiB address-space limit (``ulimit -v``), whatever this machine has: the flags and
    the size, not numpy's "Unable to allocate"."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 * GiB, 4 * GiB))

    argv = ["simulate", "--no-progress", "--json", *flags]
    proc = subprocess.run([*PAGESIM, *argv], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120,
                          preexec_fn=limit, stdin=subprocess.DEVNULL)
    line = error_line(Outcome(tuple(argv), proc.returncode, proc.stdout, proc.stderr, 0.0, 0, None), "simulate")
    assert proc.returncode == 2 and re.match(named, line), line
    assert line.endswith("GiB is left under the address-space limit (ulimit -v)"), line


def test_a_block_size_past_the_bound_is_refused_by_name(tmp_path):
    line = refused([*SIM, "--block-size", "100000"], tmp_path, "simulate")
    assert line == "--block-size must be in [1, 4,096] tokens, got 100000"


# ------------------------------------------------------------------ a study plans every run first
@pytest.mark.parametrize("settings, message", [
    ("[[grid]]\ntp = [1, 2, 3]\n", "the run with tp=3 cannot be built: llama3-8b has 32 attention heads, not "
                                   "divisible by tensor-parallel degree 3"),
    ("[base]\nmodel = 'mixtral-8x7b'\ngpu = 'h100'\ntp = 2\nep = 4\n", "the run with base settings cannot be built: "
                                                                      "--ep 4: expert parallelism spreads"),
    ("[[grid]]\npreemption = ['swap', 'cost']\n", "the run with preemption=cost cannot be built: preemption mode "
                                                  "'cost' needs a cost function"),
    ("[base]\npolicy = 'vllm-v0'\n[[grid]]\nprefix_caching = [false, true]\n",
     "the run with prefix_caching=True cannot be built: step_order 'vllm-v0' reproduces vLLM 0.6.3, which needs "
     "enable_prefix_caching=False"),
    ("[[grid]]\nmax_model_len = [4096, 100000]\n", "the run with max_model_len=100000 cannot be built: "
                                                    "--max-model-len 100000 exceeds llama3-8b's context length"),
    ("[[grid]]\nmodel = ['llama3-8b', 'llama3-70b']\n", "the run with model=llama3-70b cannot be built: llama3-70b "
                                                        "does not fit on a100-40gb x1"),
    ("[[grid]]\nblock_size = [16, 100000]\n", "the run with block_size=100000 cannot be built: --block-size must be "
                                              "in [1, 4,096] tokens"),
    ("[base]\nengine_overhead_ms = -5.0\n", "engine_overhead_ms must be a finite number of milliseconds >= 0"),
])
def test_a_study_refuses_a_run_that_cannot_be_built_before_the_first_run(settings, message):
    with pytest.raises(SpecError) as exc:
        parse_spec(SOURCE + settings)
    assert message in str(exc.value), exc.value


def test_arrivals_that_need_a_rate_are_refused_before_the_first_run():
    with pytest.raises(SpecError, match="the run with base settings cannot be built: poisson arrivals need"):
        parse_spec(SOURCE.replace("rate = 6.0\n", ""))


VICTIM = """
from pagesim.engine.policy.scheduling.preemption import VictimPolicy


class Careful(VictimPolicy):
    name = "careful"

    def choose(self, candidates):
        return candidates[-1]
"""


@pytest.mark.usefixtures("plugin_registries")
def test_a_plugin_name_under_another_kind_is_refused_before_the_first_run(tmp_path):
    path = tmp_path / "careful.py"
    path.write_text(VICTIM)
    text = f'plugins = ["{path}:Careful"]\n' + SOURCE + "[[grid]]\nvictim = ['careful']\neviction = ['careful']\n"
    with pytest.raises(SpecError, match=r"eviction = 'careful' is not one of lru, fifo, lfu, radix-leaf"):
        parse_spec(text, allow_plugins=True)
    assert len(parse_spec(text.replace("eviction = ['careful']\n", ""), allow_plugins=True).runs()) == 1


def test_the_study_command_refuses_tp_3_in_one_line_and_creates_no_folder(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SOURCE + "[[grid]]\ntp = [1, 3]\n")
    line = refused(["study", str(spec), "-o", str(tmp_path / "out"), "--workers", "2", "--no-progress"], tmp_path,
                   "study")
    assert line.endswith("the run with tp=3 cannot be built: llama3-8b has 32 attention heads, not divisible by "
                         "tensor-parallel degree 3"), line
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ --strict and a profile of another device
def test_strict_refuses_a_profile_of_another_device_without_check_profile(tmp_path):
    from pagesim.sim.cost.profile import save_profile
    from tests.calibration_support import synthetic_profile

    profile = dataclasses.replace(synthetic_profile(), device={"type": "cuda", "name": "NVIDIA H100 80GB HBM3"})
    path = tmp_path / "h100.json"
    save_profile(profile, path)
    argv = [*SIM, "--model", "tiny", "--num-gpu-blocks", "1000", "--profile", str(path)]
    ran = run_pagesim(argv, cwd=tmp_path, limit_s=LIMIT_S)  # without --strict: the profile's timings, as asked
    assert ran.returncode == 0 and json.loads(ran.stdout)["cost_model"] == "calibrated", ran.describe()
    line = refused([*argv, "--strict"], tmp_path, "simulate")
    assert line.endswith("does not hold on this machine (1 warning(s) above) (--strict)"), line
    outcome = run_pagesim([*argv, "--strict"], cwd=tmp_path, limit_s=LIMIT_S)
    assert ("warning: the profile was measured elsewhere: device: profile CUDA (NVIDIA H100 80GB HBM3), here no CUDA"
            in outcome.stderr), outcome.describe()


# ------------------------------------------------------------------ config.json of an unknown architecture
LLAMA_KEYS = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
              "vocab_size": 92544, "intermediate_size": 14336, "max_position_embeddings": 32768,
              "torch_dtype": "bfloat16"}


def _config(tmp_path: Path, **fields) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**LLAMA_KEYS, **fields}))
    return folder


def test_an_unknown_architecture_is_simulated_with_a_note(tmp_path):
    folder = _config(tmp_path, architectures=["InternLM2ForCausalLM"], model_type="internlm2")
    outcome = run_pagesim([*SIM, "--model", str(folder)], cwd=tmp_path, limit_s=LIMIT_S)
    assert outcome.returncode == 0, outcome.describe()
    notes = [line for line in outcome.stderr.splitlines() if line.strip()]
    assert len(notes) == 1 and notes[0].startswith(
        f"pagesim simulate: warning: model config {folder}/config.json: architectures ['InternLM2ForCausalLM'] and "
        f"model_type 'internlm2' is not an architecture pagesim knows; its shapes are read with Llama's keys"), notes


def test_an_unknown_architecture_whose_shapes_a_llama_reading_gets_wrong_is_refused(tmp_path):
    folder = _config(tmp_path, architectures=["FalconForCausalLM"], model_type="falcon", multi_query=True)
    line = refused([*SIM, "--model", str(folder)], tmp_path, "simulate")
    assert "architectures ['FalconForCausalLM'] and model_type 'falcon' is not an architecture pagesim reads, and " \
           "its multi_query means multi-query attention (Falcon)" in line, line


def test_known_architectures_are_read_without_a_note(tmp_path):
    import warnings

    from pagesim.engine.catalog.hf_config import preset_from_hf_config

    folder = _config(tmp_path, architectures=["LlamaForCausalLM"], model_type="llama")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert preset_from_hf_config(folder / "config.json").num_kv_heads == 8


# ------------------------------------------------------------------ reproduce --figures ''
def test_reproduce_with_an_empty_figure_list_is_refused(tmp_path):
    line = refused(["reproduce", "kwon2023", "--figures", "", "--num-requests", "20"], tmp_path, "reproduce")
    assert line == "--figures takes some of 2,13,15,18b, got ''"


# ------------------------------------------------------------------ os._exit in a plug-in
EXITS = """
import os
from os import _exit

from pagesim.engine.policy.scheduling.preemption import VictimPolicy


class OsExit(VictimPolicy):
    name = "os-exit"

    def choose(self, candidates):
        os._exit(0)


class Imported(VictimPolicy):
    name = "imported-exit"

    def choose(self, candidates):
        _exit(0)
"""
TIGHT = ["--num-requests", "50", "--num-gpu-blocks", "300"]  # tight enough that victims are chosen


@pytest.mark.parametrize("cls, name", [("OsExit", "os-exit"), ("Imported", "imported-exit")])
def test_a_plugin_calling_os_exit_zero_is_an_error_naming_it(tmp_path, cls, name):
    (tmp_path / "exits.py").write_text(EXITS)
    line = refused([*SIM[:-2], *TIGHT, "--plugin", f"exits.py:{cls}", "--victim", name], tmp_path, "simulate")
    lineno = next(n for n, text in enumerate(EXITS.splitlines(), 1) if "_exit(0)" in text and
                  (cls == "OsExit") == ("os._exit" in text))
    assert line == (f"plugin 'exits.py:{cls}': choose() called os._exit(0) (exits.py line {lineno}); a plug-in "
                    f"cannot end pagesim"), line


def test_a_plugin_file_calling_os_exit_while_it_loads_is_an_error(tmp_path):
    (tmp_path / "leaves.py").write_text("import os\n\nos._exit(0)\n")
    line = refused([*SIM, "--plugin", "leaves.py:X"], tmp_path, "simulate")
    assert line == ("plugin 'leaves.py:X': leaves.py line 3: SystemExit: the file called os._exit(0); a plug-in "
                    "cannot end pagesim"), line


def test_in_a_study_a_plugin_calling_os_exit_fails_its_runs_not_the_study(tmp_path):
    (tmp_path / "exits.py").write_text(EXITS)
    spec = tmp_path / "spec.toml"
    spec.write_text('plugins = ["exits.py:OsExit"]\n' + SOURCE.replace("rate = 6.0", "rate = 30.0") +
                    "[base]\nkv_cache_gb = 0.1\nvictim = 'os-exit'\n[[grid]]\nblock_size = [8, 16]\n")
    proc = subprocess.run([*PAGESIM, "study", str(spec), "-o", str(tmp_path / "out"), "--allow-plugins", "--workers",
                           "2", "--no-progress"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["status"] == "error" for r in records)
    assert all("choose() called os._exit(0)" in r["error"] for r in records), [r["error"] for r in records]


def test_os_exit_outside_a_plugin_still_exits():
    """The stand-in leaves pagesim's own ``os._exit`` (a worker's watchdog) as it was."""
    script = textwrap.dedent("""
        import os, sys
        from pagesim.engine.policy.plugins.exit_guard import watch
        watch(sys.argv[1])
        os._exit(7)
    """)
    proc = subprocess.run([sys.executable, "-c", script, str(ROOT / "no_such_plugin.py")], cwd=ROOT, env=ENV,
                          timeout=60)
    assert proc.returncode == 7
