"""The module's own checkpoint entry (``checkpoint["ibpo_lit"]``): `PolicyUpdate`'s counters
travel as its ``state_dict`` under ``update``, and a checkpoint written before that (the counters
flat beside ``rollout_step``) still resumes with them."""
from __future__ import annotations

from ibpo_lit.config import AlgorithmConfig, OptimConfig, RolloutConfig
from ibpo_lit.module import IBPOModule
from ibpo_lit.training.update import PolicyUpdate


def _updater() -> PolicyUpdate:
    return PolicyUpdate(AlgorithmConfig(), RolloutConfig(), OptimConfig(), max_nonfinite_steps=5,
                        logprob_chunk_tokens=None)


def test_policy_update_counters_round_trip():
    saved = _updater()
    saved.weights_version, saved.nonfinite_run, saved.nonfinite_total = 7, 1, 3
    state = saved.state_dict()
    assert state == {"weights_version": 7, "nonfinite_run": 1, "nonfinite_total": 3}
    restored = _updater()
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    restored.load_state_dict({})  # a checkpoint from before the counters: all start at 0
    assert restored.state_dict() == {"weights_version": 0, "nonfinite_run": 0, "nonfinite_total": 0}


def test_the_module_saves_the_counters_as_the_updaters_state_dict():
    module = IBPOModule()
    module.updater.load_state_dict({"weights_version": 4, "nonfinite_run": 0, "nonfinite_total": 2})
    checkpoint = {"state_dict": {}}
    module.on_save_checkpoint(checkpoint)
    saved = checkpoint["ibpo_lit"]
    assert saved["update"] == {"weights_version": 4, "nonfinite_run": 0, "nonfinite_total": 2}
    assert not {"weights_version", "nonfinite_run", "nonfinite_total"} & set(saved)  # one home each

    resumed = IBPOModule()
    resumed.on_load_checkpoint(checkpoint)
    assert resumed.updater.state_dict() == module.updater.state_dict()


def test_a_checkpoint_with_the_old_flat_counters_still_resumes_them():
    # The layout `IBPOModule.on_save_checkpoint` wrote before `PolicyUpdate.state_dict` existed.
    old = {"state_dict": {}, "ibpo_lit": {
        "rollout_step": 6, "nonfinite_total": 2, "weights_version": 5, "nonfinite_run": 1,
        "reward_counts": {"timeout": 1, "error": 0, "none": 0}, "unscorable_streak": {"run": 0},
        "logger_version": 0, "rng_per_rank": None,
    }}
    module = IBPOModule()
    module.on_load_checkpoint(old)
    assert module.rollout_step == 6 and module.weights_version == 5
    assert module.updater.state_dict() == {"weights_version": 5, "nonfinite_run": 1, "nonfinite_total": 2}
