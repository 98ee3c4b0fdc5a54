"""One top-level name: everything pagesim installs is under ``pagesim`` (issue 59, part 1).

Before, pagesim installed ``engine``, ``kernels``, ``sim``, ``traces`` and ``reports``; Hugging
Face's ``kernels`` package (which transformers requires from 5.25) has the same import name, so
either one shadowed the other. The dev extra installs both beside a current transformers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OLD_NAMES = ("engine", "kernels", "sim", "traces", "reports")


def test_the_repository_has_one_package_at_its_top():
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
    assert packages == ["pagesim", "tests"]  # (tests/ is not installed: the wheel test checks what is)
    assert not any((ROOT / name).exists() for name in OLD_NAMES)


@pytest.mark.slow  # importing transformers takes about 10 s
def test_hugging_faces_kernels_and_transformers_live_beside_pagesim():
    pytest.importorskip("kernels", reason="Hugging Face's kernels (the [dev] extra)")
    pytest.importorskip("transformers", reason="transformers (the [dev] extra)")
    code = ("import kernels, transformers, pagesim.kernels, pagesim.kernels.ops, sys\n"
            "print(kernels.__file__); print(pagesim.kernels.__file__); print(transformers.__version__)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('engine', 'sim', 'traces', 'reports')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=os.sep,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    theirs, ours, _, stray = done.stdout.splitlines()
    assert "site-packages" in Path(theirs).parts and not Path(theirs).is_relative_to(ROOT / "pagesim")  # theirs
    assert Path(ours) == ROOT / "pagesim" / "kernels" / "__init__.py"
    assert stray == "[]"


CHECK = """
import json, sys, tempfile
import kernels, transformers, torch
import pagesim, pagesim.kernels
from pagesim.engine.model import LlamaConfig, logits_of, random_model, save_pretrained
# the engine's transformers check (tests/test_model.py): our Llama and transformers' give the same logits
model = random_model(LlamaConfig.named("tiny"), seed=5, dtype=torch.float32)
prompt = [7, 100, 3, 250, 42, 42, 9, 311, 18, 5, 77, 480, 1, 64, 200, 33, 90]
with tempfile.TemporaryDirectory() as folder:
    save_pretrained(model, folder)
    hf = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = hf(torch.tensor([prompt])).logits[0]
torch.testing.assert_close(logits_of(model, prompt), expected, rtol=1e-4, atol=1e-5)
print(json.dumps({"pagesim": pagesim.__file__, "kernels": kernels.__file__, "ours": pagesim.kernels.__file__}))
"""


@pytest.mark.slow  # builds the wheel, makes a virtual environment, imports transformers (about 40 s)
def test_the_wheel_in_a_fresh_environment_beside_transformers_and_kernels(tmp_path):
    """The wheel holds nothing but ``pagesim``; installed (alone) into a fresh virtual environment
    whose other packages come from this one's site-packages (a path, not an install: its editable
    pagesim is not seen), it imports beside transformers and Hugging Face's kernels, runs
    ``pagesim simulate``, and passes the engine's transformers check."""
    pytest.importorskip("kernels", reason="Hugging Face's kernels (the [dev] extra)")
    pytest.importorskip("transformers", reason="transformers (the [dev] extra)")
    wheels = tmp_path / "wheels"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(wheels), str(ROOT)], capture_output=True, text=True, check=False, timeout=600,
                          env={**os.environ, "PAGESIM_COMPILE": "0"})
    assert done.returncode == 0, done.stderr
    (wheel,) = wheels.glob("pagesim-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"  # (pagesim-VERSION.dist-info)
    assert {name.split("/")[0] for name in names} == {"pagesim", dist_info}
    top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["pagesim"]
    assert "pagesim/sim/profiles/tiny-cpu.json" in names  # (package data kept)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    fresh = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    (fresh / "dependencies.pth").write_text(f"{ours}\n")  # (a plain path line: its .pth files are not run)
    done = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                          capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    checked = subprocess.run([str(python), "-c", CHECK], capture_output=True, text=True, check=False, timeout=600,
                             cwd=tmp_path, env=env)
    assert checked.returncode == 0, checked.stderr
    where = json.loads(checked.stdout.splitlines()[-1])
    assert Path(where["pagesim"]).is_relative_to(fresh) and Path(where["ours"]).is_relative_to(fresh)
    assert Path(where["kernels"]).is_relative_to(ours)  # Hugging Face's
    ran = subprocess.run([str(venv / "bin" / "pagesim"), "simulate", "--workload", "kwon2023-sharegpt", "--rate", "4",
                          "--num-requests", "20", "--json", "--no-progress"], capture_output=True, text=True,
                         check=False, timeout=600, cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["requests_completed"] == 20
