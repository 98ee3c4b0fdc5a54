"""Offload eviction policies as user plug-ins (``--plugin FILE.py:CLASS --kv-offloading-policy
NAME``): the example loads and really decides what the offload store gives up; a plug-in that
returns what the store cannot use is one clear error; the flag names its choices."""

from __future__ import annotations

import json
import random
import textwrap

import pytest

from pagesim.engine.cli import main
from pagesim.engine.policy import Request, Scheduler, make_config
from pagesim.engine.policy.offload.policies import OFFLOAD_POLICIES
from pagesim.engine.policy.plugins.guard import PluginError
from pagesim.engine.policy.plugins.user import load_plugin
from tests.test_plugins import ROOT

EXAMPLE = f"{ROOT / 'examples' / 'first_stored_offload.py'}:FirstStored"


def _drive(policy: str, *, num_offload_blocks: int = 10, seed: int = 0) -> Scheduler:
    """A workload of shared prefixes on a GPU pool too small to keep them: the offload store fills."""
    cfg = make_config("pagesim", block_size=4, num_gpu_blocks=24, num_offload_blocks=num_offload_blocks,
                      offload_eviction_policy=policy, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    s = Scheduler(cfg)
    rng = random.Random(seed)
    prefixes = [[rng.randrange(100) for _ in range(16)] for _ in range(4)]
    for i in range(40):
        prompt = rng.choice(prefixes) + [rng.randrange(100) for _ in range(rng.randrange(1, 9))]
        s.add_request(Request(f"r{i}", len(prompt), rng.randrange(1, 10), prompt_token_ids=prompt))
    while s.has_unfinished_requests:
        out = s.schedule()
        s.update(out, {(x.request_id, x.seq_index): 1 for x in out.scheduled if x.samples})
        s.check()
    return s


def test_the_example_policy_loads_and_decides_the_evictions():
    plugin = load_plugin(EXAMPLE)
    assert plugin.kind == "kv_offloading_policy" and OFFLOAD_POLICIES["first-stored"] is plugin.cls
    s = _drive("first-stored", num_offload_blocks=20)
    store = s.offload.store
    assert isinstance(store.policy, plugin.cls)
    assert store.num_evictions > 0 and s.num_offload_hit_tokens > 0
    assert list(store.policy.order) and all(key in store.slot_of for key in store.policy.order)
    # It, not a built-in, chose the victims: the same workload hits differently under lru.
    assert s.num_offload_hit_tokens != _drive("lru", num_offload_blocks=20).num_offload_hit_tokens


@pytest.fixture(autouse=True)
def _unregister_plugins():
    """The plug-ins these tests load leave the registry with their test: other tests draw names
    from it, or list its names in their messages."""
    yield
    for name in ("first-stored", "greedy-offload", "ghost-offload"):
        OFFLOAD_POLICIES.pop(name, None)


def test_a_plugin_evicting_a_protected_key_is_one_clear_error(tmp_path):
    path = tmp_path / "greedy_offload.py"
    path.write_text(textwrap.dedent("""
        from examples.first_stored_offload import FirstStored

        class Greedy(FirstStored):
            name = "greedy-offload"

            def evict(self, count, protected):  # one of the offered keys, then first stored first
                if not protected:
                    return super().evict(count, protected)
                rest = super().evict(count - 1, protected) if count > 1 else []
                return [next(iter(protected))] + (rest or [])
    """))
    load_plugin(f"{path}:Greedy")
    with pytest.raises(PluginError, match=r"greedy_offload\.py:Greedy'.*evict\(\) returned a key of the blocks "
                                          r"being stored \(protected\)"):
        _drive("greedy-offload", num_offload_blocks=6)


def test_a_plugin_evicting_what_the_store_does_not_hold_is_refused(tmp_path):
    path = tmp_path / "ghost_offload.py"
    path.write_text(textwrap.dedent("""
        from examples.first_stored_offload import FirstStored

        class Ghost(FirstStored):
            name = "ghost-offload"

            def evict(self, count, protected):
                return [("not", "a", "stored", "key", i) for i in range(count)]
    """))
    load_plugin(f"{path}:Ghost")
    with pytest.raises(ValueError, match="offload eviction policy 'ghost-offload' evicted a key the store does not hold"):
        _drive("ghost-offload", num_offload_blocks=6)


SIM = ["simulate", "--no-progress", "--json", "--workload", "shared-system-prompt", "--rate", "6",
       "--num-requests", "120", "--num-gpu-blocks", "300", "--enable-prefix-caching", "--num-offload-blocks", "3000"]


def _error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_the_flag_lists_its_choices_and_selects_a_plugin(capsys):
    assert ("--kv-offloading-policy: unknown offload eviction policy 'nope'; choose one of lru, arc, lfu"
            in _error([*SIM, "--kv-offloading-policy", "nope"], capsys))
    assert ("but --kv-offloading-policy does not select it (add --kv-offloading-policy first-stored)"
            in _error([*SIM, "--plugin", EXAMPLE], capsys))
    assert main([*SIM, "--plugin", EXAMPLE, "--kv-offloading-policy", "first-stored"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests_completed"] == 120
