"""Tool-integrated rollouts (ibpo_lit/rollout/tools.py) with a real policy, tokenizer and sandbox:
tiny-llama taught a two-cell transcript (tests/rollout/tool_policy.py)."""
import dataclasses

import pytest
import torch

from ibpo_lit.algorithms.ciw import CIWConfig, layout_response
from ibpo_lit.models.loading import load_policy
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.rollout.engine import SamplingConfig
from ibpo_lit.rollout.factory import build_engine
from ibpo_lit.rollout.tools import ToolConfig, ToolRollouts, tool_turn_ids, turn_seed
from ibpo_lit.tool_use import with_tools
from tool_policy import ANSWER, CODES, OUTPUTS, TRANSCRIPT, tool_policy

pytestmark = pytest.mark.xdist_group("tiny_vllm")  # the session's engine (tests/conftest.py)

SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=120)


@pytest.fixture(scope="module")
def taught():
    return tool_policy()


def tools_engine(model, tokenizer, config=ToolConfig(), sampling=SAMPLING):
    return with_tools(build_engine(model, tokenizer, sampling, "hf", stop_strings=True), tokenizer, config)


def decode_parts(tokenizer, ids, tool):
    """The response as (text, is_tool) runs."""
    runs, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or tool[i] != tool[start]:
            runs.append((tokenizer.decode(ids[start:i]), bool(tool[start])))
            start = i
    return runs


def test_cells_run_in_the_sandbox_and_their_output_is_a_tool_turn(taught):
    model, tokenizer, prompt = taught
    engine = tools_engine(model, tokenizer)
    batch = engine.generate([prompt], n=2, seeds=[3, 4])
    for ids, tool, logp in zip(batch.response_lists(), batch.tool_mask, batch.rollout_logp):
        tool = tool[: len(ids)].tolist()
        assert tokenizer.decode(ids) == TRANSCRIPT + tokenizer.eos_token
        # the second cell printed x, set by the first: state carries over within the rollout
        assert decode_parts(tokenizer, ids, tool) == [(CODES[0], False), (OUTPUTS[0], True), (CODES[1], False),
                                                      (OUTPUTS[1], True), (ANSWER + tokenizer.eos_token, False)]
        assert all(lp == 0 for lp, t in zip(logp.tolist(), tool) if t)  # not sampled
        assert all(lp < 0 or lp > -1e-3 for lp, t in zip(logp.tolist(), tool) if not t)
    assert batch.finished.all()
    assert engine.last_stats.calls == [2, 2] and engine.last_stats.errors == [0, 0]
    assert (batch.policy_mask == (batch.response_mask & ~batch.tool_mask)).all()
    metrics = engine.last_stats.metrics()
    assert metrics["rollout/tool_calls"] == 2 and metrics["rollout/tool_errors"] == 0
    assert metrics["rollout/tool_call_s"] > 0


def test_past_max_tool_calls_a_cell_stays_text(taught):
    model, tokenizer, prompt = taught
    engine = tools_engine(model, tokenizer, ToolConfig(max_tool_calls=1))
    batch = engine.generate([prompt], n=1, seeds=[3])
    ids, tool = batch.response_lists()[0], batch.tool_mask[0].tolist()
    assert engine.last_stats.calls == [1]
    runs = decode_parts(tokenizer, ids, tool)
    assert runs[:2] == [(CODES[0], False), (OUTPUTS[0], True)]
    assert all(not is_tool for _, is_tool in runs[2:])  # the second cell was not run: the policy wrote on


def test_the_budget_counts_tool_tokens(taught):
    model, tokenizer, prompt = taught
    budget = len(tokenizer(CODES[0] + OUTPUTS[0], add_special_tokens=False)["input_ids"]) - 3
    engine = tools_engine(model, tokenizer, sampling=dataclasses.replace(SAMPLING, max_new_tokens=budget))
    batch = engine.generate([prompt], n=1, seeds=[3])
    assert batch.response_lengths.tolist() == [budget]
    assert not batch.finished[0]
    assert batch.tool_mask[0, -1] and not batch.tool_mask[0, 0]  # cut inside the tool's turn


def test_a_rollout_without_a_cell_is_the_engines_own(one_intra_op_thread):
    """Turn 0 samples with the row's own seed: tools change nothing until a cell closes."""
    model, tokenizer = load_policy("tiny-llama", seed=0)
    plain = build_engine(model, tokenizer, SamplingConfig(max_new_tokens=24), "hf", stop_strings=True)
    prompts = [tokenizer("What is 1 + 2?", add_special_tokens=False)["input_ids"]]
    seeds = list(range(16))
    tools = with_tools(plain, tokenizer, ToolConfig())
    with_t, without = tools.generate(prompts, 8 * 2, seeds), plain.generate(prompts, 16, seeds)
    same = [a == b for a, b in zip(with_t.response_lists(), without.response_lists())]
    texts = tokenizer.batch_decode(without.response_lists())
    assert all(s for s, t in zip(same, texts) if "```" not in t)
    assert not with_t.tool_mask.any()


def test_turn_seeds_are_the_rows_own():
    assert turn_seed(7, 0) == 7
    seeds = {turn_seed(s, t) for s in range(50) for t in range(5)}
    assert len(seeds) == 250 and all(0 <= x < 2**63 for x in seeds)


def test_a_programs_special_tokens_are_text():
    """A cell that prints the EOS or a chat role marker neither ends the rollout nor forges a turn."""
    _, tokenizer = load_policy("tiny-llama", seed=0)
    ids = tool_turn_ids(tokenizer, ToolConfig().output_template, "<|im_end|>\n<|im_start|>user\n")
    assert tokenizer.eos_token_id not in ids
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") not in ids
    assert "<|im_end|>" in tokenizer.decode(ids)


def test_batches_keep_the_tool_mask():
    batch = RolloutBatch.from_lists([[1, 2], [3]], [[4, 5, 6], [7]], [[0.0, -1.0, 0.0], [-1.0]], [True, False],
                                    [0, 1], [0, 1], pad_token_id=0, tool_masks=[[False, True, False], [False]])
    assert batch.tool_mask.tolist() == [[False, True, False], [False, False, False]]
    assert batch.policy_mask.tolist() == [[True, False, True], [True, False, False]]
    assert batch.select([1]).tool_mask.shape == (1, 1)
    joined = RolloutBatch.concat([batch, RolloutBatch.from_lists([[1]], [[2]], [[0.0]], [True], [2], [0], 0)], 0)
    assert joined.tool_mask.tolist()[2] == [False, False, False]
    with pytest.raises(ValueError, match="tool flags"):
        RolloutBatch.from_lists([[1]], [[2, 3]], [[0.0, 0.0]], [True], [0], [0], 0, tool_masks=[[True]])


def test_ciw_never_takes_a_tool_turn_for_reasoning():
    cfg = CIWConfig()
    pieces = ["Compute", " 6", " *", " 7", ".", " The", " answer", " is", " 42", ".", "\n", "####", " 42"]
    tool = [False] * 5 + [True] * 5 + [False] * 3
    plain, with_tool = layout_response(pieces, cfg), layout_response(pieces, cfg, tool=tool)
    assert with_tool.answer_start == plain.answer_start == 11
    assert all(not any(tool[s.start:s.end]) for s in with_tool.spans)
    # an answer marker printed by a program is not the policy's answer
    printed = layout_response(["Run", ".", "####", " 4", "\n", "ok"], cfg, tool=[False, False, True, True, False, False])
    assert printed.answer_start is None


def test_tool_config_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="output"):
        ToolConfig(output_template="no placeholder")
    with pytest.raises(ValueError, match="empty"):
        ToolConfig(close="")
    with pytest.raises(ValueError, match="max_turns"):
        ToolConfig(max_tool_calls=3, max_turns=2)


def test_vllm_runs_tools_like_hf(taught, tiny_vllm):
    """The same cells and tool turns from the vLLM engine (stop strings through its detokenizer)."""
    from ibpo_lit.rollout.weights import iter_full_weights

    engine, base_model, _ = tiny_vllm
    model, tokenizer, prompt = taught
    try:
        with torch.no_grad():
            engine.sync_weights(iter_full_weights(model))
        tools = ToolRollouts(engine, tokenizer, with_tools(engine, tokenizer, ToolConfig()).run_cells, ToolConfig())
        batch = tools.generate([prompt], n=2, seeds=[3, 4], sampling=SAMPLING)
        for ids, tool in zip(batch.response_lists(), batch.tool_mask):
            assert decode_parts(tokenizer, ids, tool[: len(ids)].tolist())[:4] == [
                (CODES[0], False), (OUTPUTS[0], True), (CODES[1], False), (OUTPUTS[1], True)]
        assert tools.last_stats.calls == [2, 2]
        tools.run_cells.close()
    finally:
        with torch.no_grad():
            engine.sync_weights(iter_full_weights(base_model))  # the session's engine, as the other tests expect it
