"""``python -m ibpo_lit plan --config C [fit's overrides]``: the plan of a fit, before renting GPUs.

The config is parsed and its classes built exactly as ``fit`` builds them (the same parser, so
every key, default and override means what it means to ``fit``), except the Trainer, which would
need the GPUs it names: the plan reads the ``trainer`` section instead. The model is its config
on the meta device (`ibpo_lit.plan.shapes`): no weights, no GPU, no download for the shipped
configs' models (`ibpo_lit.models.known_configs`). Exit status 0 when the plan fits, 1 when
it names problems (``fit`` would refuse them unless ``plan.check: false``).
"""
from __future__ import annotations

import sys
from types import SimpleNamespace

USAGE = """usage: python -m ibpo_lit plan --config CONFIG [--key value ...]

Memory per GPU by phase (rollout, weight sync, corrections, update), the correction prompt's
budget, FLOPs and seconds per phase and the collective timeout they imply, with a verdict for
each: the checks `fit` runs before anything loads. Takes the same --config files and --key
overrides as `fit`; the hardware and rates are the config's `plan:` section (`fit --help`
lists plan.gpu_memory_gib, plan.peak_tflops, plan.mfu, plan.decode_tokens_per_s, ...).
Exit status: 0 when it fits, 1 when the plan names problems.
"""


def plan_main(argv: list[str] | None = None) -> int:
    argv = sys.argv[2:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    plan = plan_for_config(argv)
    print(plan.render())
    return 1 if plan.problems() else 0


def plan_for_config(argv: list[str]):
    """The `Plan` of ``fit`` with these arguments (``--config C`` and overrides)."""
    from ibpo_lit.cli import IBPOCLI, main
    from ibpo_lit.errors import ConfigError
    from ibpo_lit.models.loading import model_config
    from ibpo_lit.plan.plan import build_plan
    from ibpo_lit.plan.run import RunShape
    from ibpo_lit.plan.shapes import ModelShape

    class PlanCLI(IBPOCLI):
        def instantiate_trainer(self, **kwargs):  # the trainer's settings, not a Trainer
            config = self.config_init[self.subcommand] if self.subcommand else self.config_init
            trainer = SimpleNamespace(**dict(config["trainer"]))
            trainer.callbacks = list(trainer.callbacks or [])
            return trainer

        def after_instantiate_classes(self) -> None:  # the plan is the check
            pass

    # The plan reads no prompts: data files that are not there yet (planning before the data is
    # ready) must not stop it. (And `sys.argv` is hidden: LightningCLI warns when it sees both.)
    saved, sys.argv = sys.argv, sys.argv[:1]
    try:
        cli = main([*argv, "--data.train_path", "null", "--data.val_path", "null"], run=False, cli_class=PlanCLI)
    finally:
        sys.argv = saved
    config = model_config(cli.model.model_name)
    if config is None:
        raise ConfigError(f"model.model: {cli.model.model_name}'s config cannot be read offline (not downloaded, "
                          "not a local folder): download it once (or fetch a built-in model) and run the plan again")
    run = RunShape.from_fit(cli.model, cli.datamodule, cli.trainer)
    return build_plan(ModelShape.from_config(config, cli.model.attn_implementation), run, cli.config_init["plan"])
