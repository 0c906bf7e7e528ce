"""The command line's LightningCLI (`IBPOCLI`) and `main`; ``python -m ibpo_lit`` enters
through ``ibpo_lit/__main__.py``, which imports this module only when it needs it.

Three subcommands of ibpo-lit's own sit beside LightningCLI's ``fit`` and ``validate``:
``fetch`` (download and convert a built-in model), ``evaluate`` (avg@k / pass@k / maj@k on a
benchmark or your own data) and ``export`` (a checkpoint as a Hugging Face folder).

The wiring adds to LightningCLI: ``trainer.precision: auto`` (`ibpo_lit.trainer`); every
unknown key reported at once with a "did you mean" (`ibpo_lit.config_keys`), and parse errors
as one line; an always-on ``ModelCheckpoint`` (``checkpoint.*``) writing
``<trainer.default_root_dir>/checkpoints/last.ckpt``; atomic checkpoint writes
(`ibpo_lit.training.checkpoint_io`); the strategy checked before Lightning builds it, the other
cross-section checks before anything loads (`ibpo_lit.config_checks`); validation switched off
when there is nothing to validate on, and on a default interval when there is; progress by
optimizer step (`callbacks.progress`); a resumed run logging into its TensorBoard version; a
resumed ``fit`` seeded with its checkpoint's ``seed_everything`` (`_keep_checkpoint_seed`).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from jsonargparse import ArgumentError, DefaultHelpFormatter
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.callbacks.progress import ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from callbacks.progress import StepProgress
from ibpo_lit import __version__
from ibpo_lit.config_checks import check_fit_settings, read_checkpoint_error, strategy_config_problem
from ibpo_lit.config_keys import known_keys, unknown_key_problems, user_keys
from ibpo_lit.data.datamodule import PromptDataModule
from ibpo_lit.errors import ConfigError
from ibpo_lit.help_cache import keep_help, kept_help
from ibpo_lit.module import IBPOModule
from ibpo_lit.plan.plan import PlanSettings
from ibpo_lit.scale import strategy as _registers_fsdp2  # noqa: F401 - `trainer.strategy: fsdp2`
from ibpo_lit.seeds import run_seed
from ibpo_lit.tasks import task_for_rewards as _rewards_task
from ibpo_lit.trainer import Trainer
from ibpo_lit.training.checkpoint_io import AtomicCheckpointIO, run_state

# The module steps its optimizer itself, and a checkpoint after the step is exactly what resume
# needs; Lightning's advice to stash pre-step weights does not apply.
warnings.filterwarnings("ignore", message="Using ModelCheckpoint with manual optimization", category=UserWarning)
# Lightning 2.6's own `lightning/pytorch/utilities/_pytree.py` builds torch's `LeafSpec()`, which
# torch 2.13 deprecates (FutureWarning) - on every fit, from Lightning's code, not ours: nothing
# for a user to act on. Only that message, that category, raised from that Lightning module.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning,
                        module=r"lightning\.pytorch\.utilities\._pytree")


def _not_a_lightning_cloud_tip(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("💡 Tip: For seamless cloud")


# Lightning 2.6 logs an advert at INFO on every fit without a LitLogger ("💡 Tip: For seamless
# cloud logging ... litlogger", and "... cloud uploads ... litmodels" when it adds its own
# ModelCheckpoint); no Trainer argument or environment variable turns it off. Only those two
# messages of Lightning's rank-zero logger are dropped; its other lines ("GPU available", ...) stay.
logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_not_a_lightning_cloud_tip)


def _checkpoint_dir(root_dir: str | None) -> str:
    return os.path.join(root_dir or os.getcwd(), "checkpoints")


def _validation_schedule(trainer, datamodule) -> None:
    """When validation runs.

    Nothing to validate on (``data.val_size: 0``, no ``data.val_path``, no ``data.val_benchmarks``):
    ``limit_val_batches = 0``, Lightning's own switch for "no validation"; otherwise fit asks for
    the data module's ``val_dataloader()``, gets ``[]`` and warns "Total length of `list` across
    ranks is zero". (A ``val_path`` that yields no prompts still warns: that one is news.)

    Something to validate on but no ``trainer.val_check_interval`` (Lightning's default, 1.0,
    means "at the end of each epoch", and the prompt stream has no end): validate every tenth
    of ``trainer.max_steps`` (at least every step), and say so, instead of never."""
    if not isinstance(datamodule, PromptDataModule):
        return
    if datamodule.val_path is None and datamodule.val_size == 0 and not datamodule.val_benchmarks:
        trainer.limit_val_batches = 0
        return
    if trainer.val_check_interval == 1.0 and isinstance(trainer.val_check_interval, float):
        every = max(1, trainer.max_steps // 10) if trainer.max_steps > 0 else 100
        trainer.val_check_interval, trainer.check_val_every_n_epoch = every, None
        rank_zero_info(f"validating every {every} steps (the data has validation sets and trainer.val_check_interval "
                       "is unset; set it to change this)")


def _keep_help_texts(parser) -> None:
    """Keep the help this parser prints (`ibpo_lit.help_cache`), while it is built anyway: after
    one run (the quick start's ``fit``), ``--help`` and ``fit --help`` answer without Lightning.
    The text is the parser's own ``format_help()``, what ``--help`` prints."""
    if parser._subcommands_action is None:  # (`main(run=False)`: not what `--help` prints)
        return
    parsers = {(): parser, **{(name,): sub for name, sub in parser._subcommands_action._name_parser_map.items()}}
    for prefix, each in parsers.items():
        argv = [*prefix, "--help"]
        if kept_help(argv) is None:
            keep_help(argv, each.format_help())


SEED_EVERYTHING_HELP = (
    "The run's seed: Lightning seeds Python, NumPy and torch with it, and every random stream that "
    "does not set its own seed takes it: sampling and a model built in code (model.rollout.seed), the "
    "data order (data.seed, data.arithmetic.seed), CIW's random ablation, gradient variance's splits "
    "(docs/configuration.md, Seeds). An int; true: Lightning's pick (PL_GLOBAL_SEED, else 0); false: "
    "no global seeding, the streams take PL_GLOBAL_SEED or 0. A resumed fit keeps its checkpoint's.")


class IBPOCLI(LightningCLI):
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """``fit`` and ``validate``: Lightning's ``test`` and ``predict`` call ``test_step`` and
        ``predict_step``, which an RL policy does not have (``evaluate`` is ibpo-lit's test), and
        each subcommand's parser is built at every start."""
        return {name: skip for name, skip in LightningCLI.subcommands().items() if name in ("fit", "validate")}

    def add_default_arguments_to_parser(self, parser) -> None:
        super().add_default_arguments_to_parser(parser)
        # Lightning's text ("True: a random seed") says neither what the knob decides here nor
        # what Lightning 2.6 does with `true` (PL_GLOBAL_SEED, else 0).
        action = next(a for a in parser._actions if a.dest == "seed_everything")
        action.help = SEED_EVERYTHING_HELP

    def add_arguments_to_parser(self, parser) -> None:
        # Always present, so `<trainer.default_root_dir>/checkpoints/last.ckpt` exists;
        # tune it under `checkpoint.*`.
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.save_top_k": 0})
        parser.link_arguments("trainer.default_root_dir", "checkpoint.dirpath", compute_fn=_checkpoint_dir)
        # The data module tokenizes prompts with the policy's own tokenizer.
        parser.link_arguments("model.model", "data.tokenizer")
        # The prompts' task is the verifier that scores them: one setting (`model.reward`), so a
        # code run cannot build math prompts (or the reverse) by forgetting a second line.
        parser.link_arguments(("model.reward", "model.rewards"), "data.task", compute_fn=_rewards_task)
        # A rollout engine one step ahead needs the next step's prompts from the data module.
        parser.link_arguments("model.rollout.max_staleness", "data.steps_ahead")
        # The hardware the memory and time plan is for, and whether fit refuses a failing plan.
        parser.add_class_arguments(PlanSettings, "plan")

    def parse_arguments(self, parser, args) -> None:
        """Every unknown key at once, each with a "did you mean" (`ibpo_lit.config_keys`), before
        jsonargparse stops at the first; jsonargparse's own errors as one line."""
        argv = sys.argv[1:] if args is None else args
        if isinstance(argv, (list, tuple)):
            self._check_keys(parser, list(argv))
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as e:
            message = " ".join(str(e).split())  # jsonargparse's messages span lines
            raise ConfigError(f"{message} (`python -m ibpo_lit fit --help` lists every setting)") from e
        _keep_help_texts(parser)

    def _check_keys(self, parser, argv: list[str]) -> None:
        subcommand = "fit"
        if parser._subcommands_action is not None:  # (`main(run=False)` parses without subcommands)
            subcommand = next((a for a in argv if a in self.subcommands()), None)
            if subcommand is None:
                return
            parser = parser._subcommands_action._name_parser_map[subcommand]
            argv = argv[argv.index(subcommand) + 1:]
        known = known_keys(parser)
        problems = unknown_key_problems(known, user_keys(argv, known.sections))
        if problems:
            head = "unknown setting" if len(problems) == 1 else f"{len(problems)} unknown settings"
            raise ConfigError(f"{head}: " + "; ".join(problems)
                              + f" (`python -m ibpo_lit {subcommand} --help` lists every setting)")

    def before_instantiate_classes(self) -> None:
        # Lightning builds the strategy when it builds the Trainer, before `check_fit_settings`
        # can look at it: an unsupported one would fail there with Lightning's own traceback.
        if self.subcommand is None:
            return
        strategy = self.config[self.subcommand].get("trainer", {}).get("strategy")
        problem = strategy_config_problem(getattr(strategy, "class_path", strategy), getattr(strategy, "init_args", None))
        if problem:
            raise ConfigError(problem)

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads the checkpoint's hyperparameters here: a truncated or foreign file
        # would fail inside torch.load with a traceback.
        try:
            super()._parse_ckpt_path()
        except (RuntimeError, EOFError, OSError, ValueError) as e:
            subcommand = self.config.get("subcommand")
            raise read_checkpoint_error(self.config[subcommand].get("ckpt_path"), e) from e
        self._keep_checkpoint_seed()

    def _keep_checkpoint_seed(self) -> None:
        """A resumed ``fit`` samples with the seeds it started with: ``seed_everything`` becomes
        the one its checkpoint recorded, before LightningCLI seeds with it and before anything is
        built (so a ``--seed_everything`` other than the run's, or ``true``, cannot switch the
        streams mid-run; said when it differs). LightningCLI already takes ``model.*`` from the
        checkpoint; an explicit ``data`` seed that differs is refused when the checkpoint loads."""
        if self.config.get("subcommand") != "fit":
            return
        config = self.config["fit"]
        saved = run_state(config.get("ckpt_path")).get("seeds", {}).get("seed_everything")
        if saved is None:  # no checkpoint file yet, or one from before checkpoints recorded seeds
            return
        given = config.get("seed_everything")
        # (`False`: Lightning seeds nothing, and the run's seed is PL_GLOBAL_SEED's or 0; `True`: Lightning's pick.)
        now = run_seed() if given is False else None if given is True else int(given)
        if now != saved:
            config["seed_everything"] = saved
            rank_zero_info(f"resuming with the checkpoint's seed_everything: {saved} (the command asked for "
                           f"{given}); every stream continues as it started")

    def after_instantiate_classes(self) -> None:
        if self.subcommand in (None, "fit"):
            # Before anything loads (the data module's tokenizer, the weights); `IBPOModule.setup`
            # runs them for a `Trainer.fit` without this command line.
            ckpt_path = self.config[self.subcommand].get("ckpt_path") if self.subcommand else None
            plan = self._get(self.config_init, "plan")
            check_fit_settings(self.model, self.datamodule, self.trainer, ckpt_path, plan)
            self.model.settings_checked = True
            _validation_schedule(self.trainer, self.datamodule)

    def instantiate_trainer(self, **kwargs):
        # Atomic checkpoint writes unless trainer.plugins names another CheckpointIO.
        config = self._get(self.config_init, "trainer", default={})
        plugins = kwargs.get("plugins", config.get("plugins")) or []
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO()]
        return super().instantiate_trainer(**kwargs)

    def _instantiate_trainer(self, config, callbacks):
        # Progress by optimizer step, in a terminal and in a log (`callbacks.progress`), unless
        # the progress bar is off or the config names one of its own.
        given = list(config.get("callbacks") or []) + list(callbacks)
        if config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in given):
            callbacks = [*callbacks, StepProgress()]
        # A resumed run logs on in the TensorBoard version it started in (Lightning's default
        # logger would open version_N+1 and split the run's curves in two).
        version = run_state(self.config[self.subcommand].get("ckpt_path") if self.subcommand else None).get("logger_version")
        if version is not None and config.get("logger") in (None, True):
            from lightning.pytorch.loggers import TensorBoardLogger

            config = {**config, "logger": TensorBoardLogger(save_dir=config.get("default_root_dir") or os.getcwd(),
                                                            version=version)}
        return super()._instantiate_trainer(config, callbacks)


DESCRIPTION = """ibpo-lit: GSPO with IBPO counterfactual reward shaping.

Subcommands: fit (train), validate (Lightning's: the validation sets only), and
  fetch      download and convert a built-in model (python -m ibpo_lit fetch --help)
  evaluate   avg@k, pass@k, maj@k on a math or code benchmark, and the test-time
             correction and Best-of-N baselines (python -m ibpo_lit evaluate --help)
  export     a checkpoint (one file or sharded) as a Hugging Face model folder
             (python -m ibpo_lit export --help)
  plan       memory per GPU by phase, time per step and the timeout a config needs,
             before any GPU (python -m ibpo_lit plan --help)
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """Keeps DESCRIPTION's line breaks."""


def main(args: list[str] | None = None, run: bool = True, cli_class: type = None):
    """Parse ``args`` (default: the command line) and run Lightning's subcommand (``fit``,
    ``validate``); ``run=False`` parses a config without a subcommand and only instantiates (used
    to check configs). Returns the LightningCLI. ``cli_class``: an `IBPOCLI` subclass (the
    plan's, which builds no Trainer). ibpo-lit's own subcommands (``fetch``, ``export``,
    ``evaluate``, ``plan``) are dispatched before this, by `ibpo_lit.__main__.main`."""
    cli_class = cli_class or IBPOCLI
    return cli_class(
        IBPOModule,
        PromptDataModule,
        trainer_class=Trainer,  # Lightning's, with `trainer.precision: auto`
        args=args,
        run=run,
        # The optimizer and its schedule are `model.optim` (config_keys.REMOVED_KEYS says so to a
        # user who writes `optimizer`); LightningCLI's own would replace them.
        auto_configure_optimizers=False,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"default_root_dir": "runs/default", "log_every_n_steps": 1},
        # `--version` (jsonargparse's `version=`: prints "<prog> <version>" and exits); the usage
        # line names the command as typed, not "__main__.py".
        parser_kwargs={"description": DESCRIPTION, "formatter_class": _HelpFormatter, "version": __version__,
                       "prog": "python -m ibpo_lit" if sys.argv[0].endswith("__main__.py") else None,
                       # A parse error raises (IBPOCLI.parse_arguments makes it one line), not 180 lines of usage.
                       "exit_on_error": False,
                       **{sub: {"exit_on_error": False} for sub in IBPOCLI.subcommands()}},
    )
