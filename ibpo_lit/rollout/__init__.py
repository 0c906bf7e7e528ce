"""Rollout engines and the batch they produce."""
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.rollout.engine import RolloutEngine, SamplingConfig

__all__ = ["HFRolloutEngine", "RolloutBatch", "RolloutEngine", "SamplingConfig"]


def __getattr__(name: str):
    # Lazy: importing transformers' generation code costs ~3 s, which users of the batch
    # dataclass alone (losses, rewards, their tests) should not pay.
    if name == "HFRolloutEngine":
        from ibpo_lit.rollout.hf import HFRolloutEngine

        return HFRolloutEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
