"""``RolloutSamples``: keep what the policy actually wrote, every few steps.

Scalars cannot show *how* a reward was earned. On SmolLM2 they hid a reward hack: reward and
validation accuracy went to 1.0 while responses shrank to 6 tokens, because the verifier
accepted the question restated as its answer (docs/results.md, "Found here: a reward
hack"). Reading a handful of rollouts would have shown it at once, which is why TRL and verl
print completions too.

What it writes, at every ``every_n_steps``-th rollout step (the first step included):
    * ``samples.jsonl`` (or ``path``) in the run's own folder: TensorBoard's (or the CSV
      logger's) version folder, else ``trainer.default_root_dir`` (beside ``checkpoints/``; a
      W&B or MLflow logger's save folder is shared by every run, so not there). One JSON object
      per kept rollout with ``step``, ``uid``, ``problem``, ``prompt`` (the prompt exactly as
      the policy saw it: chat template, system prompt and instruction included), ``gold``,
      ``response``, ``reward`` (the verifier's; null = unscorable), ``shaped_reward`` (after
      IBPO's shaping) and, when the step had corrections, ``correction_reward``. Appended, so a
      resumed run continues the same file.
    * the same rollouts to each of the trainer's loggers that can show them: TensorBoard's Text
      tab (a markdown table, tag ``samples``), a W&B table (key ``samples``), an MLflow text
      artifact (``samples/step_<step>.md``). Other loggers get the JSON Lines file only.

Which rollouts: the first ``per_group`` responses of each of the step's first ``num_prompts``
prompts, so both right and wrong answers to one problem sit side by side.

Not covered: correction texts (the correction callback does not keep them decoded) and
validation samples.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Optional

from lightning.pytorch.callbacks import Callback

from ibpo_lit.training.step_types import ScoredRollouts


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def sample_records(step: ScoredRollouts, num_prompts: int, per_group: int,
                   render: Optional[Callable[[list[int]], str]] = None) -> list[dict[str, Any]]:
    """The kept rollouts of ``step`` as plain dicts (see the module docstring); ``render`` turns
    a prompt's token ids into its text (the ``prompt`` field; left out without it)."""
    group = step.rollouts.group_index.tolist()
    corrections = step.corrections
    out: list[dict[str, Any]] = []
    taken: dict[int, int] = {}
    for row, g in enumerate(group):
        if g >= num_prompts or taken.get(g, 0) >= per_group:
            continue
        taken[g] = taken.get(g, 0) + 1
        prompt = step.prompts[g]
        record = {
            "step": step.step,
            "uid": prompt.uid,
            "problem": prompt.problem,
            **({"prompt": render(prompt.prompt_ids)} if render is not None else {}),
            "gold": prompt.gold,
            "response": step.texts[row],
            "reward": _finite_or_none(float(step.rewards[row])),
            "shaped_reward": _finite_or_none(float(step.shaped_rewards[row])) if step.shaped_rewards is not None else None,
        }
        if corrections is not None:
            record["correction_reward"] = _finite_or_none(float(corrections.rewards[row]))
        out.append(record)
    return out


def markdown_table(records: list[dict[str, Any]]) -> str:
    """Records as a markdown table (TensorBoard renders it in the Text tab)."""

    def cell(value: Any) -> str:
        text = "" if value is None else str(value)
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(TABLE_KEYS) + " |", "|" + " --- |" * len(TABLE_KEYS)]
    lines += ["| " + " | ".join(cell(r.get(k)) for k in TABLE_KEYS) + " |" for r in records]
    return "\n".join(lines)


TABLE_KEYS = ["uid", "gold", "reward", "shaped_reward", "response"]


def log_samples(logger: Any, records: list[dict[str, Any]], step: int) -> None:
    """Show ``records`` in ``logger``'s own way (see the module docstring); nothing for a logger without one."""
    from lightning.pytorch.loggers import MLFlowLogger, TensorBoardLogger, WandbLogger

    if isinstance(logger, TensorBoardLogger):
        logger.experiment.add_text("samples", markdown_table(records), global_step=step)
    elif isinstance(logger, WandbLogger):
        logger.log_table("samples", columns=TABLE_KEYS, data=[[r.get(k) for k in TABLE_KEYS] for r in records],
                         step=step)
    elif isinstance(logger, MLFlowLogger):
        logger.experiment.log_text(logger.run_id, markdown_table(records), f"samples/step_{step:07d}.md")


class RolloutSamples(Callback):
    """Write a few rollouts (problem, response, rewards) every ``every_n_steps`` steps.

    Args:
        every_n_steps: Rollout steps between two writes (the first step is always written).
        num_prompts: Prompts of the step whose responses are kept.
        per_group: Responses kept per prompt.
        path: JSON Lines file; None = ``samples.jsonl`` in the run's folder (TensorBoard's
            version folder, else ``trainer.default_root_dir``).
    """

    def __init__(self, every_n_steps: int = 10, num_prompts: int = 2, per_group: int = 4, path: str | None = None) -> None:
        if every_n_steps < 1 or num_prompts < 1 or per_group < 1:
            raise ValueError(
                "RolloutSamples needs every_n_steps, num_prompts and per_group >= 1, got "
                f"{every_n_steps}, {num_prompts}, {per_group}"
            )
        self.every_n_steps = every_n_steps
        self.num_prompts = num_prompts
        self.per_group = per_group
        self.path = path

    def file_path(self, trainer) -> str:
        if self.path is not None:
            return self.path
        from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

        logger = trainer.logger
        # Only these two loggers have a folder of the run's own (version_N); `trainer.log_dir`
        # of any other is its save folder, shared by every run that logs there.
        own = isinstance(logger, (TensorBoardLogger, CSVLogger))
        return os.path.join(logger.log_dir if own else trainer.default_root_dir, "samples.jsonl")

    def on_before_update(self, trainer, pl_module, step: ScoredRollouts) -> None:
        if step.step % self.every_n_steps or trainer.global_rank != 0:
            return
        tokenizer = pl_module.tokenizer
        records = sample_records(step, self.num_prompts, self.per_group,
                                 render=lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        path = self.file_path(trainer)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "a") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
        for logger in trainer.loggers:
            log_samples(logger, records, trainer.global_step)
