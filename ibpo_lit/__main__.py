"""``python -m ibpo_lit fit --config configs/tiny.yaml``: LightningCLI wiring only.

Two subcommands of ibpo-lit's own sit beside LightningCLI's (fit, validate, ...):
``fetch`` (download and convert a built-in model) and ``evaluate`` (avg@k / pass@k / maj@k
on a math benchmark).
"""
from __future__ import annotations

import os
import sys

import argparse

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from ibpo_lit.data.datamodule import PromptDataModule
from ibpo_lit.module import IBPOModule


def _checkpoint_dir(root_dir: str | None) -> str:
    return os.path.join(root_dir or os.getcwd(), "checkpoints")


class IBPOCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # Always present, so `<trainer.default_root_dir>/checkpoints/last.ckpt` exists;
        # tune it under `checkpoint.*`.
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.save_top_k": 0})
        parser.link_arguments("trainer.default_root_dir", "checkpoint.dirpath", compute_fn=_checkpoint_dir)
        # The data module tokenizes prompts with the policy's own tokenizer.
        parser.link_arguments("model.model", "data.tokenizer")


DESCRIPTION = """ibpo-lit: GSPO with IBPO counterfactual reward shaping.

Subcommands: fit (train), validate/test/predict (Lightning's), and
  fetch      download and convert a built-in model (python -m ibpo_lit fetch --help)
  evaluate   avg@k, pass@k, maj@k on a math benchmark (python -m ibpo_lit evaluate --help)
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """Keeps DESCRIPTION's line breaks."""


def main(args: list[str] | None = None, run: bool = True):
    """Parse ``args`` (default: the command line) and run the subcommand; ``run=False``
    parses a config without a subcommand and only instantiates (used to check configs).
    Returns the LightningCLI, or the exit code of ``fetch``/``evaluate``."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["fetch"]:
        from ibpo_lit.models.fetch_cli import fetch_main

        return fetch_main(argv[1:])
    if argv[:1] == ["evaluate"]:
        from ibpo_lit.evaluation.cli import evaluate_main

        return evaluate_main(argv[1:])
    return IBPOCLI(
        IBPOModule,
        PromptDataModule,
        args=args,
        run=run,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"default_root_dir": "runs/default", "log_every_n_steps": 1},
        parser_kwargs={"description": DESCRIPTION, "formatter_class": _HelpFormatter},
    )


def entry_point() -> int:
    """``python -m ibpo_lit`` and the ``ibpo-lit`` command: an exit status, not the CLI object."""
    result = main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(entry_point())
