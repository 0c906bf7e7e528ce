"""Token-budget micro-batches on 2 FSDP2 processes (tests/scale/micro_batch_ranks.py): rank 0
runs more micro-batches than rank 1, which pads with passes of one token in lockstep; the
update's gradient equals the plain model's over both ranks' rows, budget on and off, and the
no-grad log-probs equal the plain model's; packed (``rollout.packing: on``) too, each pass one
packed row of at most the budget's real tokens; with ``rollout.balance_ranks`` the rows are
dealt 4 and 4, fewer lockstep passes, the gradient unchanged (packed or not), and over two
mini-batches the weights those of the undealt run."""
import pytest

from fit_runs import HERE, two_process_results


@pytest.mark.slow
def test_token_budget_on_two_ranks(tmp_path):
    ranks = two_process_results(HERE / "micro_batch_ranks.py", tmp_path)
    for label in ("on", "off", "packed", "balanced", "balanced_packed"):
        for rank in ranks:
            assert rank[f"{label}_grad_max"] > 0
            assert rank[f"{label}_grad_max_diff"] <= 1e-4 * rank[f"{label}_grad_max"], label
        # each rank's loss is its share of the global loss
        assert sum(r[f"{label}_loss"] for r in ranks) == pytest.approx(ranks[0]["expected_loss"], rel=1e-4)
    on0, on1 = ranks[0]["on_forwards"], ranks[1]["on_forwards"]
    assert len(on0) == len(on1) > len(ranks[0]["off_forwards"])  # lockstep, and the budget cut more passes
    # rank 0's passes fit the budget (rows x longest prompt + response); rank 1 ran its one
    # micro-batch, then padding passes of one prompt and one response token
    assert all(rows * width <= 30 for rows, width in on0 if rows > 1)
    padding = on1[1:]
    assert padding and all(shape == [1, 2] for shape in padding)
    logp0, logp1 = ranks[0]["logp_forwards"], ranks[1]["logp_forwards"]
    assert len(logp0) == len(logp1) and all(shape == [1, 2] for shape in logp1[1:])
    assert all(r["logp_max_diff"] < 1e-5 for r in ranks)
    packed0, packed1 = ranks[0]["packed_forwards"], ranks[1]["packed_forwards"]
    assert len(packed0) == len(packed1) > 1 and all(rows == 1 for rows, _ in packed0 + packed1)
    assert all(width <= 30 for _, width in packed0) and any(width > 19 for _, width in packed0)  # several rows a pass
    assert packed1[1:] and all(shape == [1, 1] for shape in packed1[1:])  # padding: the prompt token alone
    # dealt by length: rank 0's 6 rows and rank 1's 2 become 4 and 4, fewer passes in lockstep;
    # a prompt's rows together when not packed (units of rank 0's rows 0-3, 4-5 and rank 1's 6-7)
    for label in ("balanced", "balanced_packed"):
        dealt0, dealt1 = ranks[0][f"{label}_forwards"], ranks[1][f"{label}_forwards"]
        assert len(dealt0) == len(dealt1), label
    assert len(ranks[0]["balanced_forwards"]) < len(on0)
    assert len(ranks[0]["balanced_packed_forwards"]) < len(packed0)
    assert sum(rows for rows, _ in ranks[1]["balanced_forwards"]) == 4  # rank 1 forwards 4 rows, no padding pass
    # pi_old's no-grad passes run on the dealt rows too: 6 lockstep passes of the policy, not 9
    assert len(ranks[0]["minis_balanced_forwards"]) == len(ranks[1]["minis_balanced_forwards"])
    assert len(ranks[0]["minis_balanced_forwards"]) < len(ranks[0]["minis_forwards"])
    for rank in ranks:
        assert rank["minis_weight_moved"] > 0
        assert rank["minis_weight_diff"] <= 1e-4 * rank["minis_weight_moved"]
