"""``python -m ibpo_lit fit --config configs/tiny.yaml``: LightningCLI wiring only."""
from __future__ import annotations

import os

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


def main(args: list[str] | None = None, run: bool = True) -> IBPOCLI:
    """Parse ``args`` (default: the command line) and run the subcommand; ``run=False``
    parses a config without a subcommand and only instantiates (used to check configs)."""
    return IBPOCLI(
        IBPOModule,
        PromptDataModule,
        args=args,
        run=run,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"default_root_dir": "runs/default", "log_every_n_steps": 1},
    )


if __name__ == "__main__":
    main()
