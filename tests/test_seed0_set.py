"""``pagesim/engine/policy/offload/seed0_set.py``: strings that hash as under ``PYTHONHASHSEED=0``, so the
policy's sets of request ids walk in vLLM's order whatever seed this process has.

Checked against a real child interpreter started with ``PYTHONHASHSEED=0``, and end to end: the
oracle's offload cases (whose CPU block choices follow a set's order) replayed in processes with
other seeds must still make vLLM's decisions. (CI runs ``pytest`` without the variable: a replay
that needed it passed or failed by the draw.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pagesim.engine.policy.offload.seed0_set import Seed0Str, seed0_hash
from tests.conftest import ORACLE_CASES, golden_log

# every storage width CPython uses (1, 2 and 4 bytes a character), lengths around SipHash's
# 8-byte words, and the ids pagesim and vLLM make
STRINGS = ["", "a", "r005", "abcdefg", "abcdefgh", "abcdefghi", "0123456789abcdef", "é-latin1", "ĀĀx", "€uro",
           "𝄞z", "a𝄞€é", "cmpl-" + "x" * 40, "chatcmpl-3f2a9c1e-0d5b-4c6e-9a8f-1b2c3d4e5f60"] + [
    f"r{i:03d}" for i in range(120)]


def _in_seed0_child(code: str) -> object:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          check=True)
    return json.loads(done.stdout)


def test_hashes_are_cpythons_with_hash_seed_zero():
    hashes = _in_seed0_child(f"import json; print(json.dumps([hash(s) for s in {STRINGS!r}]))")
    assert [seed0_hash(s) for s in STRINGS] == hashes
    assert [hash(Seed0Str(s)) for s in STRINGS] == hashes


def test_a_set_walks_as_a_set_of_strings_does_with_hash_seed_zero():
    # adds, removes and re-adds (a set's order depends on that history as well as on the hashes)
    code = (f"import json; ids = {STRINGS!r}; s = set(ids[14:90]); s -= set(ids[30:50]); s |= set(ids[40:45]); "
            "print(json.dumps(list(s)))")
    ids = [Seed0Str(x) for x in STRINGS]
    s = set(ids[14:90])
    s -= set(ids[30:50])
    s |= set(ids[40:45])
    assert [str(x) for x in s] == _in_seed0_child(code)
    assert Seed0Str("r005") == "r005" and Seed0Str("r005") in s


OFFLOAD_CASES = [p for p in ORACLE_CASES if p.parent.name == "vllm-0.33-v1-offload"]


@pytest.mark.skipif(not OFFLOAD_CASES, reason="shared/oracle is absent")
@pytest.mark.parametrize("hash_seed", ["1", "2"])  # (each made another decision before seed0_set.py)
def test_offload_cases_make_vllms_decisions_under_another_hash_seed(hash_seed):
    cases = [(str(p), str(golden_log(p))) for p in OFFLOAD_CASES]
    code = ("import contextlib, io, json; from pagesim.engine.cli import main\n"
            "out = []\n"
            f"for spec, golden in {cases!r}:\n"
            "    buf = io.StringIO()\n"
            "    with contextlib.redirect_stdout(buf):\n"
            "        main(['oracle', 'compare', spec, golden])\n"
            "    out.append(buf.getvalue().splitlines()[-1])\n"
            "print(json.dumps(out))")
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.splitlines()[-1])
    assert results == ["identical"] * len(cases), dict(zip((c[0] for c in cases), results))
