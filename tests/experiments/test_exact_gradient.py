"""The exact-gradient testbed (ibpo_lit/experiments/exact_gradient/): the true gradient is the true
gradient, each estimator is the project's, and the statistics measure what they claim."""
import math

import pytest
import torch

from ibpo_lit.algorithms.ciw import CIWConfig
from ibpo_lit.experiments.exact_gradient.corrector import (
    CorrectorSpec,
    anchors,
    correction_logp,
    draw_corrections,
)
from ibpo_lit.experiments.exact_gradient.estimators import Method, compose, draw_loss
from ibpo_lit.experiments.exact_gradient.measure import bootstrap, draw_generators, gradient_draws
from ibpo_lit.experiments.exact_gradient.policy import (
    TinyPolicy,
    exact_gradient,
    exact_objective,
    flat_grad,
    sample,
    sequence_logp,
    table_logp,
)
from ibpo_lit.experiments.exact_gradient.problem import Problem
from ibpo_lit.experiments.exact_gradient.shaped import expected_delta, shaped_gradient

SMALL = Problem(num_prompts=3, length=5, vocab=2, seed=1)


@pytest.fixture(autouse=True)
def _one_thread(one_intra_op_thread):
    yield


def _policy(problem=SMALL, seed=0):
    return TinyPolicy(problem, hidden=16, seed=seed)


def test_table_and_teacher_forcing_agree_and_normalise():
    policy = _policy(Problem(num_prompts=2, length=4, vocab=3))
    pr = policy.problem
    table = policy.log_table()
    assert torch.allclose(sequence_logp(pr, table).exp().sum(-1), torch.ones(2, dtype=torch.float64))
    prompts = torch.tensor([0, 1, 1, 0])
    seqs = sample(pr, table, prompts, torch.Generator().manual_seed(0))
    assert torch.allclose(table_logp(pr, table, prompts, seqs), policy.token_logp(prompts, seqs), atol=1e-12)


def test_rewards_and_difficulty_of_the_default_problem():
    pr = Problem()  # T = 8, V = 2: thresholds 5, 6, 7 cycle over the prompts
    assert pr.thresholds.tolist() == [5, 6, 7, 5, 6, 7, 5, 6]
    # share of right sequences at the uniform policy: P(Bin(8, 1/2) >= m)
    right = pr.all_rewards.mean(-1)
    assert right[:3].tolist() == pytest.approx([93 / 256, 37 / 256, 9 / 256])


def test_enumerated_gradient_is_the_score_function_sum_and_the_finite_difference():
    policy = _policy()
    pr = policy.problem
    g_star = exact_gradient(policy)
    # sum_x (1/P) sum_y pi(y|x) r(x,y) grad log pi(y|x), the weights held constant
    logp = sequence_logp(pr, policy.log_table())
    weights = (logp.exp() * pr.all_rewards).detach() / pr.num_prompts
    assert torch.allclose(flat_grad((weights * logp).sum(), policy), g_star, atol=1e-12)
    # central differences along random directions
    params = policy.flat_params()
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        direction = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]
        along = float(sum((d.reshape(-1) * part).sum() for d, part in
                          zip(direction, torch.split(g_star, [p.numel() for p in params]))))
        values = []
        for sign in (1, -1):
            with torch.no_grad():
                for p, d in zip(params, direction):
                    p.add_(sign * 1e-5 * d)
            values.append(float(exact_objective(pr, policy.log_table().detach())[0]))
            with torch.no_grad():
                for p, d in zip(params, direction):
                    p.sub_(sign * 1e-5 * d)
        assert (values[0] - values[1]) / 2e-5 == pytest.approx(along, rel=1e-6, abs=1e-9)


def _reinforce_batches(policy, batches, rows, seed=0):
    """[K, D] REINFORCE estimates (1/P) sum_x mean_i r_i grad log pi(y_i|x), K batches."""
    pr = policy.problem
    table = policy.log_table().detach()
    prompts = torch.arange(pr.num_prompts).repeat_interleave(rows)
    out = []
    for k in range(batches):
        seqs = sample(pr, table, prompts, torch.Generator().manual_seed(seed + k))
        r = pr.reward(prompts, seqs)
        loss = (r * policy.token_logp(prompts, seqs).sum(-1)).sum() / (rows * pr.num_prompts)
        out.append(flat_grad(loss, policy))
    return torch.stack(out)


def test_enumerated_gradient_is_the_mean_of_reinforce_with_many_samples():
    policy = _policy()
    g_star = exact_gradient(policy)
    grads = _reinforce_batches(policy, batches=20, rows=2000)
    mean = grads.mean(0)
    # E|mean - g*|^2 = tr Cov(batch) / K: allow 4x that (a chi-square over ~D dims sits near 1x)
    trace = float(((grads - mean) ** 2).sum() / (len(grads) - 1))
    assert float(((mean - g_star) ** 2).sum()) < 4 * trace / len(grads)
    assert torch.nn.functional.cosine_similarity(mean, g_star, dim=0) > 0.99
    # ... and the same check rejects a wrong answer: the gradient without prompt 0's share
    wrong = g_star - exact_gradient_of_prompt(policy, 0)
    assert float(((mean - wrong) ** 2).sum()) > 4 * trace / len(grads)


def exact_gradient_of_prompt(policy, x):
    pr = policy.problem
    acc = (sequence_logp(pr, policy.log_table()).exp() * pr.all_rewards).sum(-1)
    return flat_grad(acc[x] / pr.num_prompts, policy)


def _hand_advantages(rewards, groups, size):
    """A_i = (r_i - mean_g) / (population std_g + 1e-8), 0 in a group whose rewards are equal."""
    adv = torch.zeros_like(rewards)
    for g in range(groups):
        r = rewards[g * size:(g + 1) * size]
        if r.max() > r.min():
            adv[g * size:(g + 1) * size] = (r - r.mean()) / (r.std(unbiased=False) + 1e-8)
    return adv


@pytest.mark.parametrize("loss", ["gspo", "grpo"])
def test_gspo_and_grpo_estimators_are_the_group_normalised_score_formula_at_ratio_one(loss):
    policy = _policy()
    pr = policy.problem
    method = Method("m", loss=loss, group_size=6)
    table = policy.log_table().detach()
    rollout_gen, correction_gen = draw_generators(3, 0)
    estimate = -flat_grad(draw_loss(method, policy, table, rollout_gen, correction_gen)[0], policy)
    # the same rollouts by hand: g = (1 / (P G T)) sum_i A_i sum_t grad log pi(y_it)
    prompts = torch.arange(pr.num_prompts).repeat_interleave(6)
    seqs = sample(pr, table, prompts, draw_generators(3, 0)[0])
    adv = _hand_advantages(pr.reward(prompts, seqs), pr.num_prompts, 6)
    assert adv.abs().sum() > 0, "the draw must carry signal for the test to mean anything"
    by_hand = flat_grad((adv * policy.token_logp(prompts, seqs).sum(-1)).sum() / (len(prompts) * pr.length), policy)
    assert torch.allclose(estimate, by_hand, rtol=1e-5, atol=1e-9)
    # the formula is sharp enough to fail: the sample std instead of the population std
    sample_std = torch.zeros_like(adv)
    for g in range(pr.num_prompts):
        r = pr.reward(prompts, seqs)[g * 6:(g + 1) * 6]
        if r.max() > r.min():
            sample_std[g * 6:(g + 1) * 6] = (r - r.mean()) / r.std(unbiased=True)
    wrong = flat_grad((sample_std * policy.token_logp(prompts, seqs).sum(-1)).sum() / (len(prompts) * pr.length), policy)
    assert not torch.allclose(estimate, wrong, rtol=1e-3, atol=1e-9)


def test_shaping_with_lambda_zero_reproduces_gspo_exactly():
    policy = _policy()
    gspo = gradient_draws(Method("gspo"), policy, draws=6, seed=1)[0]
    lam0 = gradient_draws(Method("lam0", variant="plain", lam=0.0, train_on_corrections=False), policy, draws=6, seed=1)[0]
    assert gspo.abs().sum() > 0
    assert torch.equal(gspo, lam0)
    shaped = gradient_draws(Method("lam", variant="plain", lam=0.6, train_on_corrections=False), policy, draws=6, seed=1)[0]
    assert not torch.allclose(gspo, shaped), "lambda > 0 must change something here"


@pytest.mark.parametrize("variant", ["plain", "ratio", "mask"])
def test_composition_matches_assemble_update(variant):
    """The testbed's advantages and token weights are what the real step's assemble_update makes
    of the same rollouts and corrections."""
    from ibpo_lit.config import AlgorithmConfig, IBPOConfig
    from ibpo_lit.data.prompt import Prompt
    from ibpo_lit.rollout.batch import RolloutBatch
    from ibpo_lit.training.assemble import assemble_update
    from ibpo_lit.training.step_types import Corrections, ScoredRollouts

    policy = _policy(Problem(num_prompts=4, length=6, seed=2))
    pr = policy.problem
    method = Method("ibpo", variant=variant, group_size=6, corrector=CorrectorSpec(skill=0.7, locality=0.2))
    composed, _ = compose(method, pr, policy.log_table().detach(), *draw_generators(5, 0))
    c = composed.corrections
    b = composed.num_rollouts
    assert (composed.delta > 0).any(), "the draw must shape something"

    def batch(prompts, seqs):
        n = len(prompts)
        return RolloutBatch.from_lists([[int(x) + 1] for x in prompts], seqs.tolist(), [[0.0] * pr.length] * n,
                                       [True] * n, list(range(n)), prompts.tolist(), pad_token_id=0)

    rollouts = batch(composed.prompts[:b], composed.seqs[:b])
    corrections = Corrections(rewards=c["shaping_rewards"].float(), rewrite=c["rewrite"], kept_mask=c["kept"],
                              distance=torch.zeros(b), alpha=0.6, train_batch=batch(c["prompts"], c["seqs"]),
                              train_rewards=c["rewards"].float())
    step = ScoredRollouts(prompts=[Prompt([x + 1], f"p{x}", None) for x in range(pr.num_prompts)], rollouts=rollouts,
                          texts=[""] * b, rewards=pr.reward(composed.prompts[:b], composed.seqs[:b]).float(), step=0,
                          corrections=corrections)
    algo = AlgorithmConfig(loss="gspo", ibpo=IBPOConfig(variant=variant, lam=method.lam, beta=method.beta))
    assemble_update(step, algo, pad_token_id=0)
    assert torch.allclose(step.update.advantages.double(), composed.advantages, atol=1e-6)
    if variant == "mask":
        assert torch.allclose(step.update.token_weights.double(), composed.token_weights)
    else:
        assert step.update.token_weights is None and composed.token_weights is None


def test_correction_distribution_is_normalised_and_matches_its_draws():
    pr = Problem(num_prompts=1, length=4, vocab=2, threshold=4, seed=3)
    policy = TinyPolicy(pr, hidden=8, seed=1)
    table = policy.log_table().detach()
    target = pr.targets[0]
    y = (1 - target).clone()[None]  # all wrong
    partner = target.clone()[None]
    partner[0, 0] = 1 - partner[0, 0]  # right except position 0
    spec = CorrectorSpec("informative", skill=0.6, locality=0.3)
    anchor, rho = anchors(pr, spec, torch.zeros(1, dtype=torch.long), y, partner)
    everything = pr.all_sequences
    n = len(everything)
    logq = correction_logp(policy.token_logp(torch.zeros(n, dtype=torch.long), everything),
                           everything, anchor.expand(n, -1), rho.expand(n, -1)).sum(-1)
    logq = logq.detach()
    assert float(logq.exp().sum()) == pytest.approx(1.0, abs=1e-12)
    draws = draw_corrections(pr, table, torch.zeros(20000, dtype=torch.long), anchor.expand(20000, -1),
                             rho.expand(20000, -1), torch.Generator().manual_seed(0))
    codes = (draws * (2 ** torch.arange(3, -1, -1))).sum(-1)
    freq = torch.bincount(codes, minlength=n).double() / 20000
    assert torch.allclose(freq, logq.exp(), atol=0.015)


def test_perfect_informative_corrector_with_a_right_partner_always_succeeds():
    pr = Problem(seed=4)
    policy = TinyPolicy(pr, hidden=8)
    g = torch.Generator().manual_seed(0)
    prompts = torch.arange(pr.num_prompts).repeat_interleave(50)
    table = policy.log_table().detach()
    y = sample(pr, table, prompts, g)
    partner = pr.targets[prompts]
    anchor, rho = anchors(pr, CorrectorSpec("informative", 1.0, 0.0), prompts, y, partner)
    corrected = draw_corrections(pr, table, prompts, anchor, rho, g)
    assert bool((pr.reward(prompts, corrected) == 1).all())
    assert torch.equal(corrected, partner)  # the partner is the target: every error is fixable


def test_shaped_objective_with_lambda_zero_is_the_true_objective_and_shaping_tilts_it():
    policy = _policy()
    method = Method("ibpo", variant="plain", group_size=4)
    delta = expected_delta(method, policy, samples=8, generator=torch.Generator().manual_seed(0))
    assert bool((delta[policy.problem.all_rewards == 1] == 0).all())
    assert float(delta.max()) <= method.beta and float(delta.max()) > 0
    g_star = exact_gradient(policy)
    assert torch.allclose(shaped_gradient(policy, 0.0, delta), g_star, atol=1e-12)
    tilted = shaped_gradient(policy, 1.0, delta)
    assert not torch.allclose(tilted, g_star, rtol=1e-3)


def test_statistics_recover_a_known_bias_and_variance():
    g = torch.Generator().manual_seed(0)
    dims, m = 50, 4000
    true = torch.randn(dims, generator=g, dtype=torch.float64)
    orth = torch.randn(dims, generator=g, dtype=torch.float64)
    orth -= (orth @ true) / (true @ true) * true
    orth *= 0.5 * true.norm() / orth.norm()  # |bias|^2 = 0.25 |g*|^2, orthogonal to g*
    noise = 0.3 * torch.randn(m, dims, generator=g, dtype=torch.float64)  # tr Cov = 0.09 * dims
    grads = 2.0 * (true + orth + noise)  # a loss twice the scale: calibration removes it
    point, reps = bootstrap(grads, true, resamples=200)
    t2 = float(true @ true)
    assert point["rel_var"] == pytest.approx(0.09 * dims / t2, rel=0.1)
    assert point["rel_bias2"] == pytest.approx(0.25, rel=0.1)
    assert point["trace"] == pytest.approx(4 * 0.09 * dims, rel=0.1)
    assert point["cos_mean"] == pytest.approx(1 / math.sqrt(1.25), rel=0.01)
    unbiased, _ = bootstrap(true + noise, true, resamples=50)
    assert abs(unbiased["rel_bias2"]) < 0.01


def test_every_method_runs_and_ciw_weights_are_not_uniform():
    policy = _policy()
    table = policy.log_table().detach()
    for method in [Method("ibpo_k1", variant="plain", reference="none", corrector=CorrectorSpec("uninformative", 0.5)),
                   Method("ibpo_ratio", variant="ratio", alpha="adaptive"),
                   Method("ibpo_k2", variant="plain", corrections_per_input=2, grouping="input"),
                   Method("ciw", ciw=CIWConfig())]:
        loss, info, composed = draw_loss(method, policy, table, *draw_generators(0, 1))
        assert loss.requires_grad and math.isfinite(float(loss.detach()))
        if method.ciw is not None:
            assert composed.token_weights.std() > 0
        else:
            assert info.corrections > 0
