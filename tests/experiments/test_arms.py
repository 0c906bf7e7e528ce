"""Arms of the compute-matched comparison: what each changes, and what all share."""
import pytest
import yaml

from ibpo_lit.experiments.arms import ArmSettings, build_arm_config

BASE = yaml.safe_load(open("configs/smollm2_135m_cpu.yaml"))
SETTINGS = ArmSettings(small_group=8, budget_flops=1e13)


def classes(cfg):
    return [cb["class_path"] for cb in cfg["trainer"]["callbacks"]]


def test_gspo_arm_has_a_4x_group_and_no_corrections():
    cfg = build_arm_config(BASE, "gspo_large_group", 3, SETTINGS, "/tmp/x")
    assert cfg["model"]["rollout"]["group_size"] == 32
    assert cfg["model"]["algorithm"]["ibpo"]["variant"] == "none"
    assert "callbacks.CorrectionRollouts" not in classes(cfg)
    assert "callbacks.CorrectionMetrics" not in classes(cfg)


@pytest.mark.parametrize("arm, variant", [("ibpo_plain", "plain"), ("ibpo_ratio", "ratio"), ("ibpo_mask", "mask")])
def test_ibpo_arms_use_the_small_group_and_corrections(arm, variant):
    cfg = build_arm_config(BASE, arm, 0, SETTINGS, "/tmp/x")
    assert cfg["model"]["rollout"]["group_size"] == 8
    assert cfg["model"]["algorithm"]["ibpo"]["variant"] == variant
    assert classes(cfg).count("callbacks.CorrectionRollouts") == 1


def test_every_arm_shares_budget_seed_validation_and_constant_lr():
    for arm in ("gspo_large_group", "ibpo_plain"):
        cfg = build_arm_config(BASE, arm, 7, SETTINGS, "/tmp/root")
        stopper = next(cb for cb in cfg["trainer"]["callbacks"] if cb["class_path"] == "callbacks.ComputeBudgetStopper")
        assert stopper["init_args"] == {"max_flops": 1e13}
        assert classes(cfg).count("callbacks.ComputeBudgetStopper") == 1  # the base's own is replaced
        assert "callbacks.GradientVarianceLogger" in classes(cfg)
        assert cfg["seed_everything"] == 7 and cfg["model"]["rollout"]["seed"] == 7
        assert cfg["data"]["arithmetic"] == BASE["data"]["arithmetic"]  # same problems
        assert cfg["data"]["val_size"] == 16 and cfg["trainer"]["val_check_interval"] == 4
        assert cfg["model"]["optim"]["min_lr_ratio"] == 1.0
        assert cfg["trainer"]["default_root_dir"] == "/tmp/root"
    assert BASE["model"]["rollout"]["group_size"] == 8  # the base is not modified


def test_budget_and_arm_name_are_checked():
    with pytest.raises(ValueError, match="budget"):
        build_arm_config(BASE, "ibpo_plain", 0, ArmSettings(), "/tmp/x")
    with pytest.raises(ValueError, match="valid: alpha_0.5, .*dapo, dapo_ciw, gspo, gspo_ciw, .*ibpo_plain, ibpo_ratio, k1, lambda_0, lambda_0.2"):
        build_arm_config(BASE, "ibpo_sometimes", 0, SETTINGS, "/tmp/x")


@pytest.mark.parametrize(
    "arm, loss, agg, ibpo, ciw",
    [
        ("dapo", "grpo", "token-mean", "none", None),
        ("dapo_ciw", "grpo", "token-mean", "none", "ciw"),
        ("gspo", "gspo", None, "none", None),
        ("gspo_ciw", "gspo", None, "none", "ciw"),
        ("ibpo_mask_ciw", "gspo", None, "mask", "ciw"),
        ("gspo_ciw_inverted", "gspo", None, "none", "inverted"),
    ],
)
def test_ciw_arms(arm, loss, agg, ibpo, ciw, tmp_path):
    cfg = build_arm_config(BASE, arm, 0, SETTINGS, "/tmp/x")
    algo = cfg["model"]["algorithm"]
    assert algo["loss"] == loss and algo.get("agg_mode") == agg and algo["ibpo"]["variant"] == ibpo
    assert (algo.get("ciw") or {}).get("mode") == ciw
    assert cfg["model"]["rollout"]["group_size"] == 8
    assert ("callbacks.CorrectionRollouts" in classes(cfg)) == (ibpo != "none")
    if loss == "grpo":
        assert (algo["eps_low"], algo["eps_high"]) == (0.2, 0.28)
    # the arm is a valid config: it parses and instantiates (no model loads)
    path = tmp_path / "arm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    import sys

    from ibpo_lit.__main__ import main

    sys.argv = sys.argv[:1]
    cli = main(["--config", str(path), "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert (cli.model.algorithm.ciw.mode if cli.model.algorithm.ciw else None) == ciw


BASE_IBPO = {"variant": "plain", "lam": 0.6, "beta": 0.5, "alpha": 0.6, "max_new_tokens": 64}  # the smollm2 base's


@pytest.mark.parametrize(
    "arm, changed",
    [
        ("k1", {"reference": "none"}),
        ("shaping_only", {"train_on_corrections": False}),
        ("lambda_0.2", {"lam": 0.2}),
        ("lambda_0.4", {"lam": 0.4}),
        ("lambda_0.6", {}),
        ("lambda_0.8", {"lam": 0.8}),
        ("lambda_1.0", {"lam": 1.0}),
        ("alpha_0.5", {"alpha": 0.5}),
        ("alpha_0.6", {}),
        ("alpha_0.7", {"alpha": 0.7}),
        ("alpha_adaptive", {"alpha": "adaptive"}),
    ],
)
def test_ablation_and_sweep_arms_change_one_setting_of_ibpo_plain(arm, changed, tmp_path):
    cfg = build_arm_config(BASE, arm, 0, SETTINGS, "/tmp/x")
    ibpo = {**BASE_IBPO, **changed}
    assert cfg["model"]["algorithm"]["ibpo"] == ibpo
    assert cfg["model"]["rollout"]["group_size"] == 8
    assert classes(cfg).count("callbacks.CorrectionRollouts") == 1
    assert "callbacks.CorrectionMetrics" in classes(cfg)
    # every key but the arm's own matches ibpo_plain
    plain = build_arm_config(BASE, "ibpo_plain", 0, SETTINGS, "/tmp/x")
    plain["model"]["algorithm"]["ibpo"].update(changed)
    assert cfg == plain
    # the arm is a valid config: it parses and instantiates (no model loads); lambda * beta < 1 holds
    path = tmp_path / "arm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    import sys

    from callbacks.correction import CorrectionRollouts
    from ibpo_lit.__main__ import main

    sys.argv = sys.argv[:1]
    cli = main(["--config", str(path), "--trainer.default_root_dir", str(tmp_path)], run=False)
    parsed = cli.model.algorithm.ibpo
    assert (parsed.lam, parsed.alpha, parsed.reference, parsed.train_on_corrections) == (
        ibpo["lam"], ibpo["alpha"], ibpo.get("reference", "group"), ibpo.get("train_on_corrections", True))
    assert [c for c in cli.trainer.callbacks if isinstance(c, CorrectionRollouts)]


def test_arm_families_partition_the_arms():
    from ibpo_lit.experiments.arms import ARM_FAMILIES, ARMS

    names = [name for family in ARM_FAMILIES.values() for name in family]
    assert len(names) == len(set(names)) == len(ARMS)
    assert list(ARM_FAMILIES["ablations"]) == ["k1", "shaping_only"]
    assert list(ARM_FAMILIES["lambda"]) == [
        "lambda_0", "lambda_0.2", "lambda_0.4", "lambda_0.6", "lambda_0.8", "lambda_1.0"]
    assert list(ARM_FAMILIES["alpha"]) == ["alpha_0.5", "alpha_0.6", "alpha_0.7", "alpha_adaptive"]


def test_same_config_arm_finds_the_twin_run_and_nothing_else():
    from ibpo_lit.experiments.arms import same_config_arm

    ran = ["gspo_large_group", "ibpo_plain", "k1"]
    # the paper's own setting of a sweep is ibpo_plain on this base
    assert same_config_arm(BASE, "lambda_0.6", 0, SETTINGS, ran) == "ibpo_plain"
    assert same_config_arm(BASE, "alpha_0.6", 1, SETTINGS, ran) == "ibpo_plain"
    # any changed setting is a run of its own
    for arm in ("lambda_0.2", "lambda_1.0", "alpha_0.5", "alpha_adaptive", "shaping_only"):
        assert same_config_arm(BASE, arm, 0, SETTINGS, ran) is None
    # an arm is never its own twin, and a base with another lambda makes lambda_0.6 different
    assert same_config_arm(BASE, "ibpo_plain", 0, SETTINGS, ["ibpo_plain"]) is None
    algorithm = BASE["model"]["algorithm"]
    other = {**BASE, "model": {**BASE["model"], "algorithm": {**algorithm, "ibpo": {**algorithm["ibpo"], "lam": 0.4}}}}
    assert same_config_arm(other, "lambda_0.6", 0, SETTINGS, ran) is None
    assert same_config_arm(other, "lambda_0.4", 0, SETTINGS, ran) == "ibpo_plain"
