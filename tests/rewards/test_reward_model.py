"""``reward_model:<path>``: a tiny sequence classifier made in code and saved to a folder.

Scores equal a direct forward of the model on the text the docs describe (chat template or plain
concatenation), batched equals one by one (right padding), no gradient, the settings' errors, the
weighted sum with math, and 2 processes under FSDP2 (each holding a shard) equal 1 process.
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from ibpo_lit.errors import ConfigError
from ibpo_lit.model_rewards import (
    InTrainerPool,
    ModelRewardContext,
    RewardModel,
    RewardModelOptions,
    check_model_reward,
    model_reward_pool,
)
from ibpo_lit.rewards import RewardSpec, WeightedRewards, resolve_specs
from ibpo_lit.rewards.functions import reward_label
from ibpo_lit.tasks import scoring_pool
from ibpo_lit.tasks import task_for_rewards as data_task

from model_reward_fixtures import save_tiny_reward_model

PROBLEMS = ["What is 2+3?", "Add 1 and 1.", "Is 7 prime?", "x", "Compute 12*3, then add 4."]
RESPONSES = ["5", "The sum is 2 #### 2", "yes", "a much longer response than the others, " * 3, "40"]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    return save_tiny_reward_model(tmp_path_factory.mktemp("tiny_rm") / "tiny-rm")


@pytest.fixture(scope="module")
def rm(rm_dir):
    return RewardModel(str(rm_dir), ModelRewardContext(), RewardModelOptions(batch_size=2))


def direct(rm_dir, ids: list[int]) -> float:
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir).eval()
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


def test_the_score_is_the_models_logit_on_the_chat_formatted_pair(rm, rm_dir):
    # The tiny tokenizer's ChatML template: user turn, assistant turn, each closed by <|im_end|>\n.
    text = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n"
    ids = rm.tokenizer(text, add_special_tokens=False).input_ids
    assert rm.encode("What is 2+3?", "5") == ids
    assert rm(["What is 2+3?"], ["5"]) == [pytest.approx(direct(rm_dir, ids), abs=1e-5)]


def test_batched_equals_one_by_one_whatever_the_batch(rm):
    one = [rm([p], [c])[0] for p, c in zip(PROBLEMS, RESPONSES)]
    assert len(set(round(v, 4) for v in one)) == len(one)  # different texts, different scores
    for batch_size in (1, 2, 5):
        rm.batch_size = batch_size
        assert rm(PROBLEMS, RESPONSES) == pytest.approx(one, abs=1e-5)
    rm.batch_size = 2
    # order kept: reversed inputs, reversed scores
    assert rm(PROBLEMS[::-1], RESPONSES[::-1]) == pytest.approx(one[::-1], abs=1e-5)
    assert rm([], []) == []


def test_no_gradient_and_eval_mode(rm):
    assert not rm.model.training
    assert not any(p.requires_grad for p in rm.model.parameters())
    with torch.enable_grad():
        rm(PROBLEMS[:2], RESPONSES[:2])
    assert all(p.grad is None for p in rm.model.parameters())


def test_without_a_chat_template_problem_and_response_are_concatenated(tmp_path):
    folder = save_tiny_reward_model(tmp_path / "plain-rm", chat_template=False)
    plain = RewardModel(str(folder), ModelRewardContext())
    assert plain.encode("What is 2+3?", " 5") == plain.tokenizer("What is 2+3? 5").input_ids
    assert plain(["What is 2+3?"], [" 5"]) == [pytest.approx(direct(folder, plain.encode("What is 2+3?", " 5")), abs=1e-5)]


def test_truncation_keeps_the_end_cuts_the_start_or_refuses(rm_dir):
    long = "y" * 50
    ctx = ModelRewardContext()
    left = RewardModel(str(rm_dir), ctx, RewardModelOptions(max_length=40))
    full = left.encode("q", long)
    assert left._bounded("q", long) == full[-40:]
    assert left(["q"], [long]) == [pytest.approx(direct(rm_dir, full[-40:]), abs=1e-5)]
    right = RewardModel(str(rm_dir), ctx, RewardModelOptions(max_length=40, truncation="right"))
    assert right(["q"], [long]) == [pytest.approx(direct(rm_dir, full[:40]), abs=1e-5)]
    refuse = RewardModel(str(rm_dir), ctx, RewardModelOptions(max_length=40, truncation="refuse", min_score=-3.0))
    scores = refuse(["q", "q", "q" * 50], [long, "ok", "ok"])
    # too long by the response's doing: the declared minimum; by the problem's alone: unscorable
    assert scores[0] == -3.0 and scores[2] is None and refuse.truncated == 2
    assert refuse.last_report.penalized == 1
    assert left.max_length == 40 and RewardModel(str(rm_dir), ctx).max_length == 2048  # the tokenizer's limit


def test_a_nan_score_is_unscorable(rm):
    pool = InTrainerPool("reward_model:x", lambda prompts, completions, **_: [float("nan"), 1.0])
    assert pool.score([("a", "1"), ("b", "1")]) == [None, 1.0]
    assert pool.stats == {"ok": 1, "timeout": 0, "error": 0, "none": 1, "penalized": 0}


def test_a_failing_batch_is_unscorable_as_a_whole_and_counted(caplog):
    def raises(prompts, completions, **_):
        raise RuntimeError("out of memory")

    pool = InTrainerPool("reward_model:x", raises)
    assert pool.score([("a", "1"), ("b", "1")]) == [None, None]
    assert pool.stats["error"] == 2 and pool.last_error == "raised RuntimeError: out of memory"
    assert "reward 'reward_model:x' raised RuntimeError: out of memory, on a batch of 2 response(s)" in caplog.text
    short = InTrainerPool("reward_model:x", lambda prompts, completions, **_: [1.0])
    assert short.score([("a", "1"), ("b", "1")]) == [None, None] and short.last_error == "returned 1 values for 2 completions"
    odd = InTrainerPool("reward_model:x", lambda prompts, completions, **_: [float("inf"), "high"])
    assert odd.score([("a", "1"), ("b", "1")]) == [None, None] and odd.stats["error"] == 2


def test_errors_name_the_reward_and_what_is_wrong(tmp_path, rm_dir):
    with pytest.raises(ConfigError, match="not a sequence-classification model .*LlamaForCausalLM"):
        from ibpo_lit.models.tiny import build_tiny_model, build_tiny_tokenizer

        build_tiny_model().save_pretrained(tmp_path / "lm")
        build_tiny_tokenizer().save_pretrained(tmp_path / "lm")
        check_model_reward(RewardSpec(f"reward_model:{tmp_path / 'lm'}"))
    with pytest.raises(ConfigError, match=r"has 3 outputs \(num_labels=3\)"):
        check_model_reward(RewardSpec(f"reward_model:{save_tiny_reward_model(tmp_path / 'three', num_labels=3)}"))
    with pytest.raises(ConfigError, match="does not exist"):
        check_model_reward(RewardSpec(f"reward_model:{tmp_path / 'nothing'}"))
    with pytest.raises(ConfigError, match="built in code, not a reward model"):
        check_model_reward(RewardSpec("reward_model:tiny-llama"))
    with pytest.raises(ConfigError, match="has no option 'batch'; its options: batch_size"):
        check_model_reward(RewardSpec(f"reward_model:{rm_dir}", options={"batch": 2}))
    with pytest.raises(ConfigError, match="truncation must be one of left, right, refuse"):
        check_model_reward(RewardSpec(f"reward_model:{rm_dir}", options={"truncation": "unscorable"}))
    with pytest.raises(ConfigError, match="min_score must be a finite number"):
        check_model_reward(RewardSpec(f"reward_model:{rm_dir}", options={"min_score": float("-inf")}))
    with pytest.raises(ConfigError, match="time_limit_s must be"):
        check_model_reward(RewardSpec(f"reward_model:{rm_dir}", options={"time_limit_s": -1}))
    with pytest.raises(ValueError, match="names no model after 'reward_model:'"):
        RewardSpec("reward_model:")
    with pytest.raises(ValueError, match="'math' takes no options"):
        RewardSpec("math", options={"batch_size": 2})
    with pytest.raises(ConfigError, match="not a sequence-classification model"):  # the module, at config time
        from ibpo_lit.module import IBPOModule

        IBPOModule(rewards=[RewardSpec("math"), RewardSpec(f"reward_model:{tmp_path / 'lm'}", 0.5)])


def test_specs_labels_and_the_data_task(rm_dir):
    name = f"reward_model:{rm_dir}"
    assert reward_label(name) == "tiny-rm" and reward_label(name + "/") == "tiny-rm"
    assert reward_label("reward_model:Org/Skywork-RM") == "Skywork-RM"
    specs = resolve_specs(None, [{"name": "math"}, {"name": name, "weight": 0.5, "options": {"batch_size": 4}}])
    assert specs[1] == RewardSpec(name, 0.5, {"batch_size": 4})
    assert data_task(name) == "custom"  # a reward model alone: records need no answer
    assert data_task(None, [{"name": "math"}, {"name": name}]) == "math"


def test_weighted_with_math(rm, rm_dir):
    name = f"reward_model:{rm_dir}"
    specs = [RewardSpec("math"), RewardSpec(name, 0.5, {"batch_size": 2})]
    ctx = ModelRewardContext()

    def make_pool(reward: str):
        spec = next(s for s in specs if s.name == reward)
        return model_reward_pool(spec, ctx) if reward == name else scoring_pool(reward)

    pairs = [("so #### 5", "5"), ("so #### 3", "2")]  # right, wrong
    problems = ["What is 2+3?", "Add 1 and 1."]
    with WeightedRewards(specs, make_pool) as rewards:
        total = rewards.score(pairs, problems)
        rm_scores = rm(problems, [c for c, _ in pairs])
        assert rewards.last_parts == {"math": [1.0, 0.0], "tiny-rm": pytest.approx(rm_scores, abs=1e-5)}
        assert total == pytest.approx([1.0 + 0.5 * rm_scores[0], 0.5 * rm_scores[1]], abs=1e-5)


# ---------------------------------------------------------------- 2 processes, FSDP2 (gloo)
@pytest.mark.slow
def test_sharded_on_two_processes_scores_as_one_process(tmp_path, rm_dir, rm):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scale"))
    from fit_runs import two_process_results

    (tmp_path / "model").write_text(str(rm_dir))
    ranks = two_process_results(Path(__file__).with_name("reward_model_fsdp2.py"), tmp_path)
    for rank in ranks:
        assert rank["local_numel"] <= 0.6 * rank["full_numel"]  # a shard, not a full copy
        assert rank["still_sharded"]
        # each rank's texts, scored alone in one process
        expected = [rm([p], [c])[0] for p, c in zip(rank["problems"], rank["responses"])]
        assert rank["scores"] == pytest.approx(expected, abs=1e-5)
        assert rank["empty"] == [] or rank["empty"] == pytest.approx(expected[:3], abs=1e-5)
    assert [len(r["problems"]) for r in ranks] == [5, 1]  # unequal batches: 3 forwards and 1
    assert not math.isnan(ranks[1]["scores"][0])
    json.dumps(ranks)
