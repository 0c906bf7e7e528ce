"""Active parameters (issue 31): a dense model's N is all of it; a mixture of experts counts its
shared weights and top_k / num_experts of its experts, so the compute budget charges what a
token really passes through."""
import os
import sys

from ibpo_lit.models.parameters import active_parameters
from ibpo_lit.models.tiny import build_tiny_model

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "rollout"))
from moe_engine_probe import tiny_qwen3_moe  # noqa: E402


def test_a_dense_model_uses_every_parameter():
    model = build_tiny_model(seed=0)
    assert active_parameters(model) == sum(p.numel() for p in model.parameters())


def test_a_mixture_of_experts_uses_top_k_of_its_experts():
    model = tiny_qwen3_moe()  # 4 experts, 2 per token, packed gate_up_proj / down_proj
    # per layer, by hand: gate_up 4 x 64 x 64 = 16384, down 4 x 64 x 32 = 8192 -> 24576 expert weights
    experts = 2 * (4 * 64 * 64 + 4 * 64 * 32)
    total = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for n, p in model.named_parameters() if ".experts." in n) == experts
    assert active_parameters(model) == total - experts + experts * 2 // 4
