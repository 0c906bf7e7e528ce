"""The rollout correction's formula (``ibpo_lit/algorithms/rollout_correction.py``): hand-derived
weights for every IS level and rejection kind, a loop reference for every option under seeds,
masks (padding, tool output), statistics that add up over micro-batches, and the settings' parser.

The config section's resolution (auto by the engine, the refused combination) is tested here too:
it decides whether the formula runs at all."""
from __future__ import annotations

import math

import pytest
import torch

from ibpo_lit.algorithms.rollout_correction import (
    REJECTION_OPTIONS,
    CorrectionStats,
    RolloutCorrectionSettings,
    rollout_correction,
)
from ibpo_lit.config import RolloutConfig, RolloutCorrectionConfig
from ibpo_lit.training.metric_reductions import undeclared

# One row of three policy tokens and one of two (then padding), shared by the hand-derived tests.
TRAINER = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, 0.0]])
ENGINE = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -0.2, -7.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])
# log r = trainer - engine: row 0 [0.5, -1, 0], row 1 [-0.2, 0] (its third token is padding)


def settings(rollout_is="token", cap=2.0, rs=None, rs_threshold=None) -> RolloutCorrectionSettings:
    return RolloutCorrectionSettings.parse(rollout_is, cap, rs, rs_threshold)


def test_token_tis_caps_each_token_on_its_own():
    w, stats = rollout_correction(TRAINER, ENGINE, MASK, settings("token", cap=1.5))
    # row 0: exp(0.5) = 1.6487 -> capped to 1.5; exp(-1) = 0.3679; exp(0) = 1
    # row 1: exp(-0.2) = 0.8187, 1, and 0 on the padding (whatever the log-probs there)
    expected = torch.tensor([[1.5, math.exp(-1), 1.0], [math.exp(-0.2), 1.0, 0.0]])
    torch.testing.assert_close(w, expected)
    m = stats.metrics()
    assert m["rollout_corr/truncated_frac"] == pytest.approx(1 / 5)
    assert m["rollout_corr/ratio_max"] == pytest.approx(math.exp(0.5))  # before the cap
    assert m["rollout_corr/ratio_min"] == pytest.approx(math.exp(-1))
    mean = (1.5 + math.exp(-1) + 1 + math.exp(-0.2) + 1) / 5
    assert m["rollout_corr/weight_mean"] == pytest.approx(mean)
    values = [1.5, math.exp(-1), 1, math.exp(-0.2), 1]
    assert m["rollout_corr/weight_std"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in values) / 5))
    assert m["rollout_corr/rejected_frac"] == 0 and m["rollout_corr/rejected_seq_frac"] == 0


def test_sequence_tis_puts_the_rows_product_on_every_token():
    w, stats = rollout_correction(TRAINER, ENGINE, MASK, settings("sequence", cap=2.0))
    # row 0: exp(0.5 - 1 + 0) = exp(-0.5) on each token; row 1: exp(-0.2 + 0) = exp(-0.2)
    torch.testing.assert_close(w, torch.tensor([[math.exp(-0.5)] * 3, [math.exp(-0.2)] * 2 + [0.0]]))
    assert stats.metrics()["rollout_corr/truncated_frac"] == 0
    # a cap below the product truncates every token of the row
    w, stats = rollout_correction(TRAINER, ENGINE, MASK, settings("sequence", cap=0.7))
    torch.testing.assert_close(w, torch.tensor([[math.exp(-0.5)] * 3, [0.7, 0.7, 0.0]]))
    assert stats.metrics()["rollout_corr/truncated_frac"] == pytest.approx(2 / 5)


def test_token_rejection_bounds_the_inverse_ratio_as_verl_does():
    # token_k1 keeps lower <= exp(k1) = pi_engine / pi_trainer = 1/r <= upper.
    # 1/r: row 0 [exp(-0.5) = 0.61, e = 2.72, 1], row 1 [exp(0.2) = 1.22, 1]
    w, stats = rollout_correction(TRAINER, ENGINE, MASK, settings(None, rs="token_k1", rs_threshold="0.5_2.0"))
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]))
    m = stats.metrics()
    assert m["rollout_corr/rejected_frac"] == pytest.approx(1 / 5) and m["rollout_corr/rejected_seq_frac"] == 0.5
    # one number u is the band [1/u, u]: 2.0 is the band above
    same, _ = rollout_correction(TRAINER, ENGINE, MASK, settings(None, rs="token_k1", rs_threshold=2.0))
    assert torch.equal(same, w)
    # an asymmetric band shows the direction: [0.25, 0.75] on 1/r keeps r in [1.33, 4]: only exp(0.5)
    w, _ = rollout_correction(TRAINER, ENGINE, MASK, settings(None, rs="token_k1", rs_threshold="0.25_0.75"))
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_sequence_rejection_keeps_or_rejects_whole_rows():
    # seq_sum_k1: exp(sum k1) = 1 / product: row 0 exp(0.5) = 1.65, row 1 exp(0.2) = 1.22
    w, _ = rollout_correction(TRAINER, ENGINE, MASK, settings(None, rs="seq_sum_k1", rs_threshold="0.5_1.5"))
    torch.testing.assert_close(w, torch.tensor([[0.0] * 3, [1.0, 1.0, 0.0]]))
    # seq_mean_k1 (the geometric mean, Geo-RS): row 0 exp(0.5 / 3) = 1.18, row 1 exp(0.2 / 2) = 1.105
    w, _ = rollout_correction(TRAINER, ENGINE, MASK, settings(None, rs="seq_mean_k1", rs_threshold="0.9_1.15"))
    torch.testing.assert_close(w, torch.tensor([[0.0] * 3, [1.0, 1.0, 0.0]]))
    # seq_max_k2: max (log r)^2 / 2: row 0 0.5 (from -1), row 1 0.02
    w, _ = rollout_correction(TRAINER, ENGINE, MASK, settings(None, rs="seq_max_k2", rs_threshold=0.1))
    torch.testing.assert_close(w, torch.tensor([[0.0] * 3, [1.0, 1.0, 0.0]]))
    # token_k3: r - 1 - log r: row 0 [0.149, 0.368, 0], row 1 [0.019, 0]; <= 0.2 keeps all but one
    w, _ = rollout_correction(TRAINER, ENGINE, MASK, settings(None, rs="token_k3", rs_threshold=0.2))
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]))


def test_is_and_rejection_together_and_several_options_must_all_pass():
    # token TIS (cap 1.5) times token_k1 [0.5, 2]: the e-token rejected, the rest weighted
    w, _ = rollout_correction(TRAINER, ENGINE, MASK, settings("token", 1.5, "token_k1", "0.5_2"))
    torch.testing.assert_close(w, torch.tensor([[1.5, 0.0, 1.0], [math.exp(-0.2), 1.0, 0.0]]))
    # token_k1 alone keeps tokens 0 and 2 of row 0; seq_sum_k2 (row 0: (0.25 + 1) / 2 = 0.625,
    # row 1: 0.02) <= 0.1 rejects row 0 whole: both must pass
    w, _ = rollout_correction(TRAINER, ENGINE, MASK, settings(None, rs="token_k1,seq_sum_k2", rs_threshold="2.0,0.1"))
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))


def test_tool_output_tokens_are_out_of_weights_and_products():
    # A tool turn (not sampled: its engine log-prob is 0) in the middle of row 0: out of the mask.
    trainer = torch.tensor([[-1.0, -3.0, -0.5]])
    engine = torch.tensor([[-1.5, 0.0, -0.5]])
    policy = torch.tensor([[True, False, True]])
    w, stats = rollout_correction(trainer, engine, policy, settings("sequence", cap=5.0))
    torch.testing.assert_close(w, torch.tensor([[math.exp(0.5), 0.0, math.exp(0.5)]]))  # not exp(0.5 - 3)
    assert float(stats.tokens) == 2
    # -inf on padding (a model's log-prob there) never leaks in
    trainer[0, 1] = -math.inf
    w2, stats2 = rollout_correction(trainer, engine, policy, settings("token", rs="seq_sum_k3", rs_threshold=9.0))
    assert torch.isfinite(w2).all() and math.isfinite(stats2.metrics()["rollout_corr/seq_kl_k3"])


def test_sequence_kl_metrics():
    _, stats = rollout_correction(TRAINER, ENGINE, MASK, settings())
    m = stats.metrics()
    # k1 = -log r summed per row: row 0 0.5, row 1 0.2 -> mean 0.35
    assert m["rollout_corr/seq_kl_k1"] == pytest.approx(0.35)
    k3 = lambda x: math.exp(x) - 1 - x  # noqa: E731
    assert m["rollout_corr/seq_kl_k3"] == pytest.approx((k3(0.5) + k3(-1) + k3(-0.2)) / 2)
    assert undeclared(m) == []  # every metric has its reduction across processes


def test_equal_log_probs_give_weight_one():
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 6, generator=g)
    mask = torch.rand(4, 6, generator=g) > 0.3
    w, stats = rollout_correction(logp, logp.clone(), mask, settings("sequence", rs="token_k1,seq_mean_k3",
                                                                        rs_threshold="1.01,1e-6"))
    assert torch.equal(w, mask.float())
    m = stats.metrics()
    assert m["rollout_corr/weight_std"] == 0 and m["rollout_corr/seq_kl_k3"] == 0


# ---------------------------------------------------------------------------- loop reference
def _reference(trainer, engine, mask, s: RolloutCorrectionSettings) -> torch.Tensor:
    """Each row and token in Python floats, from the definitions in the module docstring."""
    out = torch.zeros(trainer.shape)
    for b in range(trainer.shape[0]):
        tokens = [t for t in range(trainer.shape[1]) if mask[b, t]]
        lr = {t: max(-20.0, min(20.0, float(trainer[b, t]) - float(engine[b, t]))) for t in tokens}
        k = {"k1": {t: -lr[t] for t in tokens}, "k2": {t: 0.5 * lr[t] ** 2 for t in tokens},
             "k3": {t: math.exp(lr[t]) - 1 - lr[t] for t in tokens}}
        seq_log = max(-20.0, min(20.0, sum(float(trainer[b, t]) - float(engine[b, t]) for t in tokens)))
        for t in tokens:
            if s.rollout_is == "token":
                w = min(math.exp(lr[t]), s.rollout_is_threshold)
            elif s.rollout_is == "sequence":
                w = min(math.exp(seq_log), s.rollout_is_threshold)
            else:
                w = 1.0
            for bound in s.rejection:
                agg, est = bound.option.rsplit("_", 1)
                values = k[est]
                if agg == "token":
                    stat = values[t]
                elif agg == "seq_sum":
                    stat = sum(values.values())
                elif agg == "seq_mean":
                    stat = sum(values.values()) / len(values)
                else:
                    stat = max(values.values())
                if est == "k1":
                    ok = math.log(bound.lower) <= stat <= math.log(bound.upper)
                else:
                    ok = stat <= bound.upper
                w = w if ok else 0.0
            out[b, t] = w
    return out


# Thresholds inside each statistic's spread over the rows below (so some tokens pass and some
# do not); k1 bands asymmetric, so that a band on r instead of 1/r would fail.
THRESHOLDS = {"token_k1": "0.8_1.3", "seq_sum_k1": "0.5_1.8", "seq_mean_k1": "0.9_1.15", "token_k2": 0.02,
              "token_k3": 0.02, "seq_sum_k2": 0.2, "seq_sum_k3": 0.2, "seq_mean_k2": 0.04, "seq_mean_k3": 0.04,
              "seq_max_k2": 0.1, "seq_max_k3": 0.1}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rollout_is, option", [
    (level, option) for level in ("token", "sequence", None) for option in REJECTION_OPTIONS.names() + [None]
    if level is not None or option is not None])
def test_every_level_and_option_matches_the_loop(seed, rollout_is, option):
    g = torch.Generator().manual_seed(seed)
    trainer = -3 * torch.rand(5, 7, generator=g)
    spread = torch.tensor([0.05, 0.2, 0.3, 0.5, 0.8])[:, None]  # rows from near-agreement to far off
    engine = trainer + spread * torch.randn(5, 7, generator=g)
    mask = torch.rand(5, 7, generator=g) > 0.25
    mask[2] = False  # an empty row
    threshold = THRESHOLDS.get(option)
    s = settings(rollout_is, 1.3, option, threshold)
    w, _ = rollout_correction(trainer, engine, mask, s)
    torch.testing.assert_close(w, _reference(trainer, engine, mask, s), rtol=1e-5, atol=1e-6)
    if option is not None:  # the thresholds above reject some tokens and keep others
        kept = (w > 0)[mask]
        assert kept.any() and not kept.all(), (option, threshold)


def _trl(trainer, engine, mask, mode: str, clip_max: float, clip_min=None) -> torch.Tensor:
    """TRL's GRPOTrainer ratio (``vllm_importance_sampling_mode``), as its docs define it, on the mask."""
    diff = (trainer - engine) * mask
    ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
    if mode.endswith("truncate"):
        ratio = ratio.clamp(min=clip_min, max=clip_max)
    else:
        low = clip_min if clip_min is not None else -math.inf
        ratio = ratio.masked_fill((ratio < low) | (ratio > clip_max), 0.0)
    return ratio.expand_as(diff) * mask


@pytest.mark.parametrize("mode, ours", [
    ("token_truncate", dict(rollout_is="token")),
    ("sequence_truncate", dict(rollout_is="sequence")),
    ("token_mask", dict(rollout_is="token", rs="token_k1", rs_threshold=f"{1 / 3}_inf")),
    ("sequence_mask", dict(rollout_is="sequence", rs="seq_sum_k1", rs_threshold=f"{1 / 3}_inf")),  # TRL's default
    ("token_mask+min", dict(rollout_is="token", rs="token_k1", rs_threshold=f"{1 / 3}_{1 / 0.8}")),
])
def test_trls_modes_map_onto_these_settings(mode, ours):
    """docs/rollouts.md's table: TRL's four modes (cap C = 3, its default clip_max) as these settings.
    A mask mode's band [c, C] on r is the k1 band [1/C, 1/c] on 1/r (no clip_min: 1/c = inf)."""
    g = torch.Generator().manual_seed(4)
    trainer = -2 * torch.rand(6, 5, generator=g)
    engine = trainer + torch.tensor([0.1, 0.3, 0.5, 0.8, 1.0, 1.5])[:, None] * torch.randn(6, 5, generator=g)
    mask = torch.rand(6, 5, generator=g) > 0.2
    trl_mode, _, with_min = mode.partition("+")
    expected = _trl(trainer, engine, mask, trl_mode, 3.0, 0.8 if with_min else None)
    w, _ = rollout_correction(trainer, engine, mask, settings(cap=3.0, **ours))
    torch.testing.assert_close(w, expected, rtol=1e-5, atol=1e-6)
    assert ((w > 0) & (w < 3.0)).any() and ((w == 0) | (w == 3.0))[mask].any()  # both sides of the bounds


def test_micro_batches_add_up_to_the_batch():
    g = torch.Generator().manual_seed(3)
    trainer = -2 * torch.rand(6, 5, generator=g)
    engine = trainer + 0.5 * torch.randn(6, 5, generator=g)
    mask = torch.rand(6, 5, generator=g) > 0.2
    s = settings("token", 1.5, "seq_mean_k1", "0.8_1.25")
    w, whole = rollout_correction(trainer, engine, mask, s)
    total = CorrectionStats()
    parts = []
    for rows in (torch.tensor([0, 4]), torch.tensor([1, 2, 3]), torch.tensor([5])):
        part, stats = rollout_correction(trainer[rows], engine[rows], mask[rows], s)
        total.add(stats)
        parts.append((rows, part))
    for rows, part in parts:  # a row's weights do not depend on the other rows
        assert torch.equal(part, w[rows])
    for key, value in whole.metrics().items():
        assert total.metrics()[key] == pytest.approx(value), key
    assert all(math.isnan(v) for v in CorrectionStats().metrics().values())  # nothing seen: NaN, not 0


# ---------------------------------------------------------------------------- settings
def test_verls_option_names():
    assert REJECTION_OPTIONS.names() == sorted(
        ["token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
         "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(rollout_is="tok"), "model.rollout_correction.rollout_is must be token, sequence or null"),
    (dict(rollout_is_threshold=0.0), "rollout_is_threshold must be a number > 0"),
    (dict(rollout_rs="token_k4", rollout_rs_threshold=2.0), "unknown option 'token_k4'; valid: seq_max_k2"),
    (dict(rollout_rs="token_k1"), "needs rollout_rs_threshold"),
    (dict(rollout_rs_threshold=2.0), "rollout_rs_threshold=2.0 is set but rollout_rs is not"),
    (dict(rollout_rs="token_k1", rollout_rs_threshold="2_0.5"), "0 < lower <= upper"),
    (dict(rollout_rs="token_k1", rollout_rs_threshold=0.5), "one number u >= 1"),
    (dict(rollout_rs="seq_max_k3", rollout_rs_threshold="0.1_2"), "only k1 options take a 'lower_upper' band"),
    (dict(rollout_rs="token_k1,token_k2", rollout_rs_threshold="2,1,3"), "one threshold for every option"),
    (dict(rollout_rs="token_k2", rollout_rs_threshold="abc"), "'abc' is not a number"),
    (dict(enabled=True, rollout_is=None), "nothing would change"),
])
def test_bad_settings_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        RolloutCorrectionConfig(**kwargs)


def test_auto_is_on_with_an_engine_of_its_own_and_explicit_settings_win():
    auto = RolloutCorrectionConfig()
    assert auto.resolve(RolloutConfig(backend="vllm")) == RolloutCorrectionSettings("token", 2.0, ())
    assert auto.resolve(RolloutConfig(backend="hf")) is None
    assert auto.resolve(RolloutConfig(backend="vllm", old_logp="rollout")) is None  # the ratio is the engine's already
    assert RolloutCorrectionConfig(enabled=False).resolve(RolloutConfig(backend="vllm")) is None
    on = RolloutCorrectionConfig(enabled=True, rollout_is="sequence", rollout_is_threshold=3.0)
    assert on.resolve(RolloutConfig(backend="hf")) == RolloutCorrectionSettings("sequence", 3.0, ())
    # rejection only (rollout_is: null) is a correction too
    rs = RolloutCorrectionConfig(rollout_is=None, rollout_rs="seq_mean_k1", rollout_rs_threshold=1.1)
    assert rs.resolve(RolloutConfig(backend="vllm")).rejection[0].lower == pytest.approx(1 / 1.1)


def test_on_with_the_engines_own_pi_old_is_refused():
    with pytest.raises(ValueError, match="enabled: true contradicts model.rollout.old_logp: rollout"):
        RolloutCorrectionConfig(enabled=True).resolve(RolloutConfig(backend="vllm", old_logp="rollout"))
