import pytest
import torch

from ibpo_lit.algorithms.ciw import (
    CIW_MODES,
    CIWConfig,
    ResponseLayout,
    Span,
    ciw_metrics,
    ciw_token_weights,
    conserve_mean,
    detect_spans,
    find_answer_start,
    importance_from_drops,
    layout_masks,
    layout_response,
    layout_weights,
)

# ---------------------------------------------------------------- the hand example
# 8 content tokens (0..7), then the closing EOS (8) and one pad (9): width 10.
# Reasoning 0..5, answer from the marker at 6. Spans [0, 2) drop +2.0, [3, 5) drop -1.0
# (a distractor). Token 5 is a formatting token ("=").
HAND = ResponseLayout(
    length=8,
    answer_start=6,
    spans=(Span(0, 2, "sentence"), Span(3, 5, "arithmetic")),
    formatting=(False, False, False, False, False, True, False, False),
)
HAND_DROPS = [2.0, -1.0]
WIDTH = 10


def _weights(cfg, layouts=(HAND,), drops=(HAND_DROPS,), generator=None):
    return layout_weights(list(layouts), list(drops), WIDTH, cfg, generator)


def test_hand_importance():
    # raw = 0.2 + drops: [2.2, 2.2, 0.2, -0.8, -0.8, 0.2]; min -0.8, max 2.2, range 3.0
    # rescaled = 0.5 + 0.5 * (raw + 0.8) / 3 = [1, 1, 2/3, 0.5, 0.5, 2/3]
    imp = importance_from_drops(6, HAND.spans, HAND_DROPS, CIWConfig())
    torch.testing.assert_close(imp, torch.tensor([1.0, 1.0, 2 / 3, 0.5, 0.5, 2 / 3]))


def test_hand_weights():
    w = _weights(CIWConfig())
    # reasoning: w = 0.5 + 1.5 * importance -> [2.0, 2.0, 1.5, 1.25, 1.25, .]
    # token 5 is formatting: importance 2/3 * 0.1 = 1/15 -> w = 0.5 + 1.5/15 = 0.6
    # answer (6, 7): 1.5; EOS (8) and pad (9): 1
    expected = torch.tensor([[2.0, 2.0, 1.5, 1.25, 1.25, 0.6, 1.5, 1.5, 1.0, 1.0]])
    torch.testing.assert_close(w, expected)
    assert w.dtype == torch.float32 and w.shape == (1, WIDTH)


def test_hand_weights_with_conservation():
    w = _weights(CIWConfig(conservation=True))
    # content sum = 2+2+1.5+1.25+1.25+0.6+1.5+1.5 = 11.6 over 8 tokens: mean 1.45
    content = torch.tensor([2.0, 2.0, 1.5, 1.25, 1.25, 0.6, 1.5, 1.5]) / 1.45
    torch.testing.assert_close(w[0, :8], content)
    torch.testing.assert_close(w[0, 8:], torch.ones(2))
    # mean over the response tokens (content + EOS) is 1 as well: (8 * 1 + 1) / 9
    assert w[0, :9].mean().item() == pytest.approx(1.0, abs=1e-6)


def test_inverted_ablation_hand():
    w = _weights(CIWConfig(mode="inverted"))
    # importance 1.5 - i: [0.5, 0.5, 5/6, 1, 1, 5/6]; token 5 damped: 5/6 * 0.1 = 1/12
    # w = 0.5 + 1.5 * i: [1.25, 1.25, 1.75, 2.0, 2.0, 0.625]; answer 1.5; rest 1
    expected = torch.tensor([[1.25, 1.25, 1.75, 2.0, 2.0, 0.625, 1.5, 1.5, 1.0, 1.0]])
    torch.testing.assert_close(w, expected)


def test_uniform_ablation_is_all_ones():
    w = _weights(CIWConfig(mode="uniform", conservation=True))
    torch.testing.assert_close(w, torch.ones(1, WIDTH))


def test_random_ablation():
    cfg = CIWConfig(mode="random")
    w1 = _weights(cfg, generator=torch.Generator().manual_seed(1))
    w1_again = _weights(cfg, generator=torch.Generator().manual_seed(1))
    w2 = _weights(cfg, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(w1, w1_again)  # seeded: reproducible
    assert not torch.equal(w1, w2)
    assert not torch.equal(w1, _weights(CIWConfig()))  # the drops no longer matter
    # reasoning importance in [0.5, 1] -> w in [1.25, 2.0]; formatting token 5 damped to
    # importance in [0.05, 0.1] -> w in [0.575, 0.65]; answer, EOS, pad unchanged
    plain = w1[0, [0, 1, 2, 3, 4]]
    assert ((plain >= 1.25) & (plain <= 2.0)).all()
    assert 0.575 <= w1[0, 5].item() <= 0.65
    torch.testing.assert_close(w1[0, 6:], torch.tensor([1.5, 1.5, 1.0, 1.0]))
    # no generator: one seeded with cfg.seed
    torch.testing.assert_close(_weights(cfg), _weights(cfg, generator=torch.Generator().manual_seed(0)))


def test_modes_registry():
    assert CIW_MODES.names() == ["ciw", "inverted", "random", "uniform"]
    with pytest.raises(ValueError, match="valid: ciw, inverted, random, uniform"):
        CIW_MODES.get("shuffle")


def test_no_marker_row_and_empty_reasoning_row():
    no_marker = ResponseLayout(length=5, answer_start=None, spans=(), formatting=(False,) * 5)
    all_answer = ResponseLayout(length=3, answer_start=0, spans=(), formatting=(False,) * 3)
    for conservation in (False, True):
        w = _weights(CIWConfig(conservation=conservation), [no_marker, all_answer, HAND], [[], [], HAND_DROPS])
        torch.testing.assert_close(w[0], torch.ones(WIDTH))
        # answer only: 1.5 on the answer, or 1 after conservation
        answer_w = 1.0 if conservation else 1.5
        torch.testing.assert_close(w[1], torch.tensor([answer_w] * 3 + [1.0] * 7))


def test_degenerate_rescale_gives_low_importance():
    cfg = CIWConfig()
    torch.testing.assert_close(importance_from_drops(4, [], [], cfg), torch.full((4,), 0.5))
    torch.testing.assert_close(importance_from_drops(2, [(0, 2)], [3.0], cfg), torch.full((2,), 0.5))
    assert importance_from_drops(0, [], [], cfg).shape == (0,)
    with pytest.raises(ValueError, match="2 spans but 1 drops"):
        importance_from_drops(4, [(0, 1), (1, 2)], [1.0], cfg)


def test_overlapping_spans_add_their_drops():
    # raw = [0.2+1, 0.2+1+2, 0.2+2, 0.2] = [1.2, 3.2, 2.2, 0.2]; range 3 ->
    # 0.5 + 0.5 * [1/3, 1, 2/3, 0]
    imp = importance_from_drops(4, [(0, 2), (1, 3)], [1.0, 2.0], CIWConfig())
    torch.testing.assert_close(imp, torch.tensor([0.5 + 1 / 6, 1.0, 0.5 + 1 / 3, 0.5]))


def test_conserve_mean():
    w = torch.tensor([[2.0, 1.0, 3.0, 7.0], [5.0, 5.0, 5.0, 5.0]])
    content = torch.tensor([[True, True, True, False], [False, False, False, False]])
    out = conserve_mean(w, content)
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.5, 1.5, 7.0], [5.0, 5.0, 5.0, 5.0]]))


def test_ciw_token_weights_direct():
    # one row, 4 tokens: reasoning 0-1 (token 1 formatting), answer 2, pad 3
    importance = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    reasoning = torch.tensor([[True, True, False, False]])
    answer = torch.tensor([[False, False, True, False]])
    formatting = torch.tensor([[False, True, False, True]])  # pad's flag is ignored
    w = ciw_token_weights(importance, reasoning, answer, formatting, CIWConfig(w_min=0.0, boost=1.0, answer_weight=3.0))
    # w = 0 + 1 * i: token 0 -> 1.0, token 1 -> 0.1; answer 3.0; pad 1
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.1, 3.0, 1.0]]))


def test_metrics_hand():
    w = _weights(CIWConfig())
    m = ciw_metrics([HAND], [HAND_DROPS], w)
    assert m["ciw/spans_per_rollout"] == 2.0
    assert m["ciw/marker_frac"] == 1.0
    assert m["ciw/distractor_frac"] == 0.5  # drop -1.0 raises the answer's probability
    assert m["ciw/drop_mean"] == pytest.approx(0.5)
    assert m["ciw/weight_reasoning"] == pytest.approx((2 + 2 + 1.5 + 1.25 + 1.25 + 0.6) / 6)
    assert m["ciw/weight_answer"] == pytest.approx(1.5)
    empty = ciw_metrics([ResponseLayout(2, None, (), (False, False))], [[]], torch.ones(1, 2))
    assert empty["ciw/spans_per_rollout"] == 0.0 and empty["ciw/marker_frac"] == 0.0
    for key in ("ciw/weight_reasoning", "ciw/weight_answer", "ciw/distractor_frac"):
        assert empty[key] != empty[key]  # NaN: nothing to measure


def test_layout_masks():
    reasoning, answer, formatting = layout_masks([HAND], WIDTH)
    assert reasoning[0].tolist() == [True] * 6 + [False] * 4
    assert answer[0].tolist() == [False] * 6 + [True, True, False, False]
    assert formatting[0].nonzero().flatten().tolist() == [5]
    with pytest.raises(ValueError, match="width is 4"):
        layout_masks([HAND], 4)


# ---------------------------------------------------------------- regions
def _span_text(text, span):
    return text[span.start : span.end]  # char-level pieces: token index = char index


def test_answer_marker_detection_char_level():
    cfg = CIWConfig()
    text = "So x is 4.\nThe Final Answer: 4"
    assert find_answer_start(list(text), cfg) == text.index("Final")  # case-insensitive
    assert find_answer_start(list("so 4\n#### 4"), cfg) == len("so 4\n")
    assert find_answer_start(list("so \\boxed{4}"), cfg) == 3
    assert find_answer_start(list("no answer here"), cfg) is None
    # priority order: "final answer" wins over an earlier \boxed{
    text = "maybe \\boxed{3}? no. final answer: \\boxed{4}"
    assert find_answer_start(list(text), cfg) == text.index("final")
    # first or last occurrence
    text = "the final answer needs care. final answer 4"
    assert find_answer_start(list(text), cfg) == 4
    assert find_answer_start(list(text), CIWConfig(marker_occurrence="last")) == text.rindex("final")


def test_answer_marker_detection_bpe_pieces():
    pieces = ["So", " the", " final", " answer", " is", " 4"]
    assert find_answer_start(pieces, CIWConfig()) == 2  # the token holding the marker's "f"
    # a character split over byte tokens: zero-length pieces belong to the completing token
    pieces = ["x", "", "", "#", "###", " 4"]  # the first "#" completed by token 3
    assert find_answer_start(pieces, CIWConfig()) == 1


# ---------------------------------------------------------------- spans
def test_arithmetic_priority_then_sentences():
    text = (
        "First 2 + 3 = 5 and 4 * 5 = 20 and 6 - 1 = 5 here. "
        "Another sentence long enough. Ok. Last of the spans here. Dropped by the cap."
    )
    spans = detect_spans(list(text), CIWConfig(max_spans=4))
    assert [s.kind for s in spans] == ["arithmetic", "arithmetic", "sentence", "sentence"]
    # at most max_spans // 2 = 2 arithmetic spans: the third ("6 - 1 = 5") is not taken
    assert _span_text(text, spans[0]) == "2 + 3 = 5"
    assert _span_text(text, spans[1]) == "4 * 5 = 20"
    # the first sentence overlaps them and is skipped; " Ok." has 4 tokens (< 5): skipped
    assert _span_text(text, spans[2]) == " Another sentence long enough."
    assert _span_text(text, spans[3]) == " Last of the spans here."  # then the cap (4) bites


def test_sentence_boundaries():
    text = "Half is 3.5 apples\n\nthen more words! And why? yes it is"
    spans = detect_spans(list(text), CIWConfig(min_sentence_tokens=1))
    # "3.5" is no boundary; a blank line is; text after the last boundary is a sentence
    assert [_span_text(text, s) for s in spans] == [
        "Half is 3.5 apples\n\n",
        "then more words!",
        " And why?",
        " yes it is",
    ]


def test_long_and_latex_heavy_spans_are_skipped():
    long = " " + "word " * 12 + "end."  # 65 tokens > max_span_tokens = 50
    latex = " \\a\\b\\c\\d."  # 10 characters, 4 backslashes: 40% > 30%
    fine = " This one is kept."
    text = long + latex + fine + " Then 3 \\times 4 = 12."
    spans = detect_spans(list(text), CIWConfig())
    assert [_span_text(text, s) for s in spans] == [fine, "3 \\times 4 = 12"]  # sorted by start
    assert [s.kind for s in spans] == ["sentence", "arithmetic"]
    # with a higher cap the long sentence is kept
    spans = detect_spans(list(text), CIWConfig(max_span_tokens=100))
    assert _span_text(text, spans[0]) == long


def test_max_spans():
    text = "".join(f"Sentence number {i} here. " for i in range(12))
    spans = detect_spans(list(text), CIWConfig())
    assert len(spans) == 10
    assert _span_text(text, spans[0]) == "Sentence number 0 here."
    assert _span_text(text, spans[-1]) == " Sentence number 9 here."
    assert len(detect_spans(list(text), CIWConfig(max_spans=3))) == 3


def test_arithmetic_span_on_bpe_pieces():
    pieces = ["We", " get", " 1", "2", " ×", " 3", " =", " 3", "6", ".", " Done", " here", " now", "."]
    spans = detect_spans(pieces, CIWConfig(min_sentence_tokens=3))
    # "12 × 3 = 36" starts inside " 1" (token 2) and ends with "6" (token 8)
    assert spans == [Span(2, 9, "arithmetic"), Span(10, 14, "sentence")]
    # the first sentence (tokens 0..9, through ".") holds the arithmetic span and is
    # skipped; the second is " Done here now."


def test_layout_response():
    text = "We add 2 + 3 = 5 today. Then we say it.\n#### 5"
    layout = layout_response(list(text), CIWConfig())
    assert layout.length == len(text)
    assert layout.answer_start == text.index("####")
    assert [_span_text(text, s) for s in layout.spans] == ["2 + 3 = 5", " Then we say it."]
    # formatting flags: "=" and the four "#"
    flagged = [text[i] for i, f in enumerate(layout.formatting) if f]
    assert flagged == ["=", "#", "#", "#", "#"]
    # no marker: no spans
    assert layout_response(list("We add 2 + 3 = 5."), CIWConfig()).spans == ()


# ---------------------------------------------------------------- config
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mode": "shuffle"}, "unknown CIW mode 'shuffle'"),
        ({"answer_markers": ()}, "ciw.answer_markers"),
        ({"answer_markers": ("####", "")}, "ciw.answer_markers"),
        ({"marker_occurrence": "middle"}, "ciw.marker_occurrence"),
        ({"mask_token": "unk"}, "ciw.mask_token"),
        ({"max_spans": 0}, "ciw.max_spans"),
        ({"min_sentence_tokens": 0}, "ciw.min_sentence_tokens"),
        ({"max_span_tokens": 0}, "ciw.max_span_tokens"),
        ({"tokens_per_pass": 0}, "ciw.tokens_per_pass"),
        ({"cache_size": -1}, "ciw.cache_size"),
        ({"max_backslash_frac": 1.5}, "ciw.max_backslash_frac"),
        ({"arithmetic_pattern": "(unclosed"}, "ciw.arithmetic_pattern is not a valid regex"),
        ({"sentence_end_pattern": "[a-"}, "ciw.sentence_end_pattern is not a valid regex"),
        ({"base_importance": float("nan")}, "ciw.base_importance"),
        ({"importance_low": 1.0, "importance_high": 0.5}, "ciw.importance_low"),
        ({"importance_low": -0.1}, "ciw.importance_low"),
        ({"formatting_factor": 2.0}, "ciw.formatting_factor"),
        ({"w_min": 3.0}, "ciw.w_min"),
        ({"w_min": -1.0}, "ciw.w_min"),
        ({"answer_weight": -1.0}, "ciw.answer_weight"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CIWConfig(**kwargs)


def test_config_defaults_match_method_section_8():
    cfg = CIWConfig()
    assert (cfg.mode, cfg.max_spans, cfg.min_sentence_tokens, cfg.max_span_tokens) == ("ciw", 10, 5, 50)
    assert (cfg.max_backslash_frac, cfg.base_importance) == (0.3, 0.2)
    assert (cfg.importance_low, cfg.importance_high, cfg.formatting_factor) == (0.5, 1.0, 0.1)
    assert (cfg.w_min, cfg.boost, cfg.answer_weight, cfg.conservation) == (0.5, 2.0, 1.5, False)
    assert cfg.answer_markers == ("final answer", "####", "\\boxed{")
    assert CIWConfig(answer_markers=["####"]).answer_markers == ("####",)  # lists from YAML
