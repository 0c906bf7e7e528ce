"""``CorrectionRollouts``: turns IBPO's compare-and-correct rollouts on.

The callback is the Lightning hook; the work is ``ibpo_lit.training.corrections.Corrector`` and
every setting is ``model.algorithm.ibpo`` (alpha, k, the reference rule, joint training, the
prompt's wording). It acts through ibpo-lit's one extra hook, ``on_rollouts_scored``, which
``IBPOModule.training_step`` calls on every callback that defines it; removing the callback
turns corrections off (``algorithm.ibpo.variant`` must then be ``none``: the run refuses to
start otherwise, before any weights load).
"""
from __future__ import annotations

from typing import Optional

from lightning.pytorch.callbacks import Callback

from ibpo_lit.training.corrections import Corrector
from ibpo_lit.training.step_types import ScoredRollouts


class CorrectionRollouts(Callback):
    """Generates IBPO's correction rollouts for every wrong rollout (settings: ``model.algorithm.ibpo``)."""

    def __init__(self) -> None:
        self.corrector: Optional[Corrector] = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.corrector = Corrector(pl_module.algorithm.ibpo)

    def on_rollouts_scored(self, trainer, pl_module, step: ScoredRollouts) -> None:
        if self.corrector is None:  # called outside trainer.fit (tests)
            self.setup(trainer, pl_module, "fit")
        step.corrections = self.corrector(step, pl_module.correction_context())
