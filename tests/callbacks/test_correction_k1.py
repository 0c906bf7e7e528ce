"""The k = 1 ablation of IBPO's corrections (``algorithm.ibpo.reference: none``): its prompt,
which rows it corrects, its one-sided rewrite filter, and how a bad value is rejected."""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from callbacks.correction import CorrectionRollouts
from ibpo_lit.config import IBPOConfig
from ibpo_lit.data.correction_prompt import CorrectionPrompt
from ibpo_lit.tasks import CODE_REVISE_TEMPLATE as DEFAULT_SELF_REVISION_CODE_TEMPLATE
from ibpo_lit.tasks import COMPARE_TEMPLATE as DEFAULT_TEMPLATE
from ibpo_lit.tasks import REVISE_TEMPLATE as DEFAULT_SELF_REVISION_TEMPLATE
from ibpo_lit.training.corrections import Corrector, choose_references, is_rewrite

REPO = Path(__file__).resolve().parents[2]
nan = math.nan


def test_self_revision_prompt_shows_one_candidate():
    text = CorrectionPrompt().text("What is 2 + 2?", "It is 5.", None, "Answer after ####.")
    assert text == (
        f"{DEFAULT_SELF_REVISION_TEMPLATE}\n\nProblem:\nWhat is 2 + 2?\n\n"
        "Candidate solution:\nIt is 5.\n\nAnswer after ####."
    )
    custom = CorrectionPrompt.from_config(IBPOConfig(reference="none", self_revision_template="Fix it.",
                                                     answer_instruction="Box it."))
    assert custom.text("p", "a", None, "Answer after ####.") == (
        "Fix it.\n\nProblem:\np\n\nCandidate solution:\na\n\nBox it."
    )


def test_paired_prompt_is_unchanged_by_the_new_mode():
    text = CorrectionPrompt().text("p", "a", "b", "i")
    assert text == f"{DEFAULT_TEMPLATE}\n\nProblem:\np\n\nCandidate solution 1:\na\n\nCandidate solution 2:\nb\n\ni"


def test_self_revision_code_prompt_shows_the_code_alone():
    attempt = "Here:\n```python\ndef add(a, b):\n    return a - b\n```\nDone."
    text = CorrectionPrompt().text("Write add(a, b).", attempt, None, None, task="code")
    assert text == (
        f"{DEFAULT_SELF_REVISION_CODE_TEMPLATE}\n\nProblem:\nWrite add(a, b).\n\n"
        "Candidate solution:\n```python\ndef add(a, b):\n    return a - b\n```"
    )


def test_k1_corrects_every_wrong_rollout_and_draws_no_reference():
    rewards = [1, 0, 0, nan, 0, nan]
    groups = [0, 0, 0, 0, 1, 1]
    k1 = Corrector(IBPOConfig(reference="none")).correction_pairs(rewards, groups, seed=0, step=0)
    # row 4 is its group's only scored rollout: no partner, yet k = 1 corrects it; NaN rows never
    assert k1 == [(1, None), (2, None), (4, None)]
    paired = Corrector(IBPOConfig()).correction_pairs(rewards, groups, seed=0, step=0)
    assert paired == choose_references(rewards, groups, seed=0, step=0) == [(1, 0), (2, 0)]


def test_rewrite_filter_without_a_reference_uses_the_distance_alone():
    original = [1, 2, 3, 4, 5]
    corrected = [1, 2, 3, 9, 9]  # 2 substitutions: d(original, corrected) = 2/5 = 0.4
    far_reference = [7, 7, 7, 7, 7]  # d(corrected, far_reference) = 5/5 = 1.0
    near_reference = [1, 2, 3, 9, 9]  # d(corrected, near_reference) = 0
    # k = 1: rewrite iff 0.4 > alpha (strict)
    assert is_rewrite(original, corrected, None, alpha=0.3)
    assert not is_rewrite(original, corrected, None, alpha=0.4)
    # paired: also needs 0.4 > d(corrected, reference)
    assert not is_rewrite(original, corrected, far_reference, alpha=0.3)  # 0.4 > 1.0 fails
    assert is_rewrite(original, corrected, near_reference, alpha=0.3)  # 0.4 > 0 holds


def test_bad_reference_mode_names_the_field():
    with pytest.raises(ValueError, match="algorithm.ibpo.reference must be one of group, none; got 'self'"):
        IBPOConfig(reference="self")


def _fit_config(tmp_path, reference) -> str:
    cfg = yaml.safe_load(open(REPO / "configs" / "tiny.yaml"))
    cfg["model"]["algorithm"]["ibpo"]["reference"] = reference
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_config_with_a_bad_reference_mode_fails_before_training(tmp_path, monkeypatch, capsys):
    import ibpo_lit.module
    from ibpo_lit.__main__ import entry_point

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    monkeypatch.setattr(ibpo_lit.module, "load_policy", lambda *a, **k: pytest.fail("weights loaded"))
    args = ["fit", "--config", _fit_config(tmp_path, "self"), "--trainer.default_root_dir", str(tmp_path / "run")]
    assert entry_point(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ibpo-lit: error: ") and "Literal['group', 'none']. Got value: self" in err[-1]


def test_config_with_reference_none_reaches_the_corrector(tmp_path, monkeypatch):
    from ibpo_lit.__main__ import main

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    cli = main(["--config", _fit_config(tmp_path, "none"), "--trainer.default_root_dir", str(tmp_path)], run=False)
    (cb,) = [c for c in cli.trainer.callbacks if isinstance(c, CorrectionRollouts)]
    cb.setup(cli.trainer, cli.model, "fit")
    assert cb.corrector.cfg.reference == "none" == cli.model.algorithm.ibpo.reference


def test_help_lists_the_reference_modes():
    done = subprocess.run([sys.executable, "-m", "ibpo_lit", "fit", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--model.algorithm.ibpo.reference {group,none}" in done.stdout
