"""Typed, documented configuration of the module. jsonargparse turns each ``Args:`` line
into ``--help`` text; ``__post_init__`` rejects bad values before any model loads."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union, get_args

from ibpo_lit.algorithms.advantages import is_token_level
from ibpo_lit.algorithms.ciw import CIWConfig
from ibpo_lit.algorithms.registry import (
    AGGREGATIONS,
    POLICY_LOSSES,
    LossSettings,
    TokenAdvantageSettings,
)
from ibpo_lit.algorithms.regularizers import KL_ESTIMATORS, RegularizerSettings
from ibpo_lit.algorithms.rollout_correction import RolloutCorrectionSettings
from ibpo_lit.algorithms.shaping import validate_shaping
from ibpo_lit.rollout.engine import HFDecode, SamplingConfig
from ibpo_lit.rollout.factory import ENGINES, Backend
from ibpo_lit.rollout.vllm_engine import VLLMConfig
from ibpo_lit.rollout.tools import ToolConfig
from ibpo_lit.tasks import CODE_COMPARE_TEMPLATE, CODE_REVISE_TEMPLATE, COMPARE_TEMPLATE, REVISE_TEMPLATE


@dataclass
class OverlongConfig:
    """What to do with responses cut at ``rollout.sampling.max_new_tokens`` (DAPO, TRL, verl).

    Args:
        mask_truncated: Leave truncated responses (no EOS) out of the loss: advantage 0 and no
            tokens in the loss's token counts (TRL's ``mask_truncated_completions``). Their
            rewards still count in their group's mean and std, as in TRL.
        soft_buffer: DAPO's soft overlong punishment (verl's ``overlong_buffer.len``): responses
            longer than ``max_new_tokens - soft_buffer`` tokens lose up to ``soft_factor`` of
            reward, linearly (``ibpo_lit/algorithms/overlong.py``). Unset = off.
        soft_factor: The largest penalty (verl's ``overlong_buffer.penalty_factor``).
    """

    mask_truncated: bool = False
    soft_buffer: Optional[int] = None
    soft_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.soft_buffer is not None and self.soft_buffer < 1:
            raise ValueError(f"algorithm.overlong.soft_buffer must be >= 1 or unset, got {self.soft_buffer}")
        if self.soft_factor < 0:
            raise ValueError(f"algorithm.overlong.soft_factor must be >= 0, got {self.soft_factor}")


@dataclass
class IBPOConfig:
    """IBPO (METHOD section 5), all of it: compare-and-correct rollouts, the full-rewrite
    filter, the shaping they earn and joint training. The rollouts are made by the
    ``callbacks.CorrectionRollouts`` callback, which must be in ``trainer.callbacks`` unless
    ``variant`` is ``none``.

    Args:
        variant: Shaping: ``none`` (plain GSPO), ``plain`` (+lambda*beta), ``ratio``
            (+lambda * share of kept tokens) or ``mask`` (+lambda*beta, and only the tokens
            the correction changed get gradient).
        lam: Shaping weight lambda (paper's best about 0.6). ``lambda * Delta`` must stay
            below 1 so a shaped wrong rollout never outranks a correct one.
        beta: Shaping bonus beta (paper: 0.5).
        alpha: Full-rewrite threshold on the normalised token edit distance ``d(y_i, y^)``,
            a number in [0, 1] (paper: 0.6, stable from 0.55 to 0.70), or ``adaptive``
            (mean + 2 std of ``d`` over the step's successful corrections).
        corrections_per_input: Corrections sampled per correction prompt (k).
        train_on_corrections: Train the correction samples jointly with the same loss (the
            paper's default; off = its "shaping only" ablation).
        grouping: How correction samples are grouped for their advantages: ``prompt`` (all
            corrections of one original prompt) or ``input`` (the k samples of one
            correction prompt; needs ``corrections_per_input >= 2``).
        reference: ``group`` (the paper's method: a partner drawn from the group) or ``none``
            (the k = 1 ablation: the policy revises its wrong answer alone; the rewrite filter
            keeps only ``d(y_i, y^) > alpha``).
        max_new_tokens: Longest correction; unset = the rollouts' ``max_new_tokens``.
        on_long_prompt: A correction prompt that leaves no room for ``max_new_tokens`` in the
            context: ``truncate`` the candidates in their middle, or ``skip`` the correction.
        template: Instruction that opens the correction prompt.
        code_template: The same for code tasks, whose candidates are shown as ```python blocks.
        answer_instruction: How the correction must state its answer; unset = the prompt's
            own instruction or a generic one.
        self_revision_template: Instruction of the prompt with ``reference: none``.
        self_revision_code_template: The same for code tasks.
    """

    variant: str = "plain"
    lam: float = 0.6
    beta: float = 0.5
    alpha: Union[float, Literal["adaptive"]] = 0.6
    corrections_per_input: int = 1
    train_on_corrections: bool = True
    grouping: Literal["prompt", "input"] = "prompt"
    reference: Literal["group", "none"] = "group"
    max_new_tokens: Optional[int] = None
    on_long_prompt: Literal["truncate", "skip"] = "truncate"
    template: str = COMPARE_TEMPLATE
    code_template: str = CODE_COMPARE_TEMPLATE
    answer_instruction: Optional[str] = None
    self_revision_template: str = REVISE_TEMPLATE
    self_revision_code_template: str = CODE_REVISE_TEMPLATE

    def __post_init__(self) -> None:
        validate_shaping(self.variant, self.lam, self.beta)  # also an unknown variant, listing the names
        if self.alpha != "adaptive" and not (isinstance(self.alpha, (int, float)) and 0 <= self.alpha <= 1):
            raise ValueError(f"algorithm.ibpo.alpha must be a number in [0, 1] or 'adaptive', got {self.alpha!r}")
        if self.corrections_per_input < 1:
            raise ValueError(f"algorithm.ibpo.corrections_per_input must be >= 1, got {self.corrections_per_input}")
        if self.grouping not in ("prompt", "input"):
            raise ValueError(f"algorithm.ibpo.grouping must be 'prompt' or 'input', got {self.grouping!r}")
        if self.grouping == "input" and self.corrections_per_input < 2:
            raise ValueError(
                "algorithm.ibpo.grouping='input' needs corrections_per_input >= 2: a group of one "
                "correction has no advantage signal."
            )
        if self.reference not in ("group", "none"):
            raise ValueError(f"algorithm.ibpo.reference must be one of group, none; got {self.reference!r}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"algorithm.ibpo.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.on_long_prompt not in ("truncate", "skip"):
            raise ValueError(f"algorithm.ibpo.on_long_prompt must be 'truncate' or 'skip', got {self.on_long_prompt!r}")

    @property
    def enabled(self) -> bool:
        return self.variant != "none"


@dataclass
class DynamicSamplingConfig:
    """DAPO's dynamic sampling (verl's ``algorithm.filter_groups``, OpenRLHF's
    ``--dynamic_filtering``): train only on informative groups, refilled from the stream.

    A group is informative when one of its rows trains: a non-zero advantage after IBPO's
    shaping and overlong handling (a group IBPO shaped counts; its correction samples count
    too). Uninformative groups are dropped and the next batch of prompts is generated, until
    the run holds ``data.prompts_per_step`` x processes informative groups; the surplus of the
    last round is dropped, as verl does. Each generation round is one Lightning batch, so
    ``trainer.max_steps`` counts updates while ``val_check_interval`` and the TensorBoard
    step count rounds (see docs/configuration.md).

    Args:
        enabled: Turn it on.
        max_rounds: Generation rounds per update at most (verl's ``max_num_gen_batches``).
            At the cap the update trains the informative groups collected so far (fewer than
            configured); with fewer of them than processes, the last round as it is.
    """

    enabled: bool = False
    max_rounds: int = 4

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError(f"algorithm.dynamic_sampling.max_rounds must be >= 1, got {self.max_rounds}")


@dataclass
class AlgorithmConfig:
    """Loss, advantages, IBPO and CIW.

    Args:
        loss: Policy loss by name: ``gspo`` (sequence-level ratio; GSPO-token when token
            weights are present, as with ``ibpo.variant: mask``) or ``grpo`` (token-level ratio).
        eps_low: Lower clip range: the ratio is clipped at ``1 - eps_low``. GSPO's paper uses
            3e-4; GRPO/DAPO use 0.2.
        eps_high: Upper clip range (``1 + eps_high``). GSPO 4e-4; DAPO's clip-higher 0.28.
        agg_mode: How ``grpo`` averages token losses: ``seq-mean-token-mean`` (GRPO),
            ``token-mean`` (DAPO) or ``seq-mean-token-sum``. Leave unset for ``gspo``,
            which always averages each sequence's tokens, then sequences.
        beta_kl: Weight of the KL to the initial policy (0 = off, as in the IBPO experiments;
            a frozen reference is kept when > 0). With any group-relative ``advantage_scale`` it
            is a loss term, with either loss (verl's ``kl_loss_coef``). With
            ``advantage_scale: reinforce_plus_plus`` it goes into the reward instead, and NOT
            also into the loss: ``-beta_kl * kl_t`` on every response token (verl's
            ``use_kl_in_reward`` with ``kl_ctrl.kl_coef``, OpenRLHF's ``init_kl_coef`` without
            ``use_kl_loss``).
        kl_estimator: ``k1``, ``k2`` or ``k3`` (verl's ``kl``, ``mse``, ``low_var_kl``). Their
            gradients differ: k1's is zero in expectation, k2's is that of KL(pi || ref), k3's
            that of KL(ref || pi); see ``ibpo_lit/algorithms/regularizers.py``. Unset = ``k3``
            for the loss term, ``k1`` for the KL in REINFORCE++'s reward (both peers' defaults).
        entropy_coef: Weight of an entropy bonus (verl's ``entropy_coeff``; 0 = off).
            ``train/entropy`` is logged either way.
        overlong: Truncated and overlong responses: masked out of the loss, and/or DAPO's soft
            length penalty (see ``OverlongConfig``). Both off by default.
        dynamic_sampling: DAPO's dynamic sampling: uninformative groups are dropped and
            the batch refilled (see ``DynamicSamplingConfig``). Off by default.
        advantage_scale: The advantage estimator: ``group`` (divide by the group's std),
            ``batch`` (by the batch's std), ``none`` (Dr.GRPO: no division), ``rloo`` (the
            leave-one-out baseline), ``reinforce_plus_plus_baseline`` (group-centred rewards
            over their batch std), or ``reinforce_plus_plus`` (REINFORCE++: ``beta_kl`` times the
            KL to the initial policy taken off every token's reward, the outcome reward on the
            last token, token returns (``gamma``), whitened over every response token of the
            batch, of all processes; no group baseline; token-level advantages with either loss);
            see ``ibpo_lit/algorithms/advantages.py`` and docs/configuration.md for the peers' names.
        gamma: Discount of REINFORCE++'s token returns (1 = none, the peers' default); only
            with ``advantage_scale: reinforce_plus_plus``.
        ibpo: IBPO's settings, all in one place (see ``IBPOConfig``): ``variant: none`` is
            plain GSPO.
        ciw: Counterfactual importance weighting (METHOD section 8): token weights from how
            much masking each reasoning span lowers the answer's log-prob. Unset = off.
            ``ciw.mode`` picks the method (``ciw``) or an ablation (``uniform``, ``random``,
            ``inverted``). Works with both losses (with ``gspo`` it makes GSPO-token); with
            ``ibpo.variant: mask`` the two token weights multiply.
    """

    loss: str = "gspo"
    eps_low: float = 3e-4
    eps_high: float = 4e-4
    agg_mode: Optional[str] = None
    beta_kl: float = 0.0
    kl_estimator: Optional[str] = None
    entropy_coef: float = 0.0
    advantage_scale: str = "group"
    gamma: float = 1.0
    ibpo: IBPOConfig = field(default_factory=IBPOConfig)
    ciw: Optional[CIWConfig] = None
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)

    def __post_init__(self) -> None:
        POLICY_LOSSES.get(self.loss)  # raises, listing the valid names
        token_level = is_token_level(self.advantage_scale)  # raises, listing every estimator
        if not 0 < self.gamma <= 1:
            raise ValueError(f"algorithm.gamma must be in (0, 1], got {self.gamma}")
        if self.gamma != 1 and not token_level:
            raise ValueError(
                f"algorithm.gamma={self.gamma} discounts token returns, which only "
                f"advantage_scale: reinforce_plus_plus has; {self.advantage_scale!r} gives one advantage "
                "per response. Remove gamma or use advantage_scale: reinforce_plus_plus."
            )
        if token_level and self.dynamic_sampling.enabled:
            raise ValueError(
                f"algorithm.dynamic_sampling keeps groups with a non-zero advantage, and advantage_scale: "
                f"{self.advantage_scale} (no group baseline: the mean over the batch's tokens) gives almost every "
                "response one. Turn dynamic_sampling off or use a group-relative advantage_scale."
            )
        if self.agg_mode is not None:
            AGGREGATIONS.get(self.agg_mode)
            if self.loss == "gspo":
                raise ValueError(
                    f"algorithm.agg_mode={self.agg_mode!r} contradicts algorithm.loss='gspo': GSPO's "
                    "ratio is per sequence, so its loss is always a mean over each sequence's tokens "
                    "then over sequences. Remove agg_mode or use loss: grpo."
                )
        if self.beta_kl < 0 or self.entropy_coef < 0:
            raise ValueError(f"algorithm.beta_kl and entropy_coef must be >= 0, got {self.beta_kl}, {self.entropy_coef}")
        if self.kl_estimator is not None:
            KL_ESTIMATORS.get(self.kl_estimator)
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
            raise ValueError(
                f"algorithm.eps_low must be in [0, 1) and eps_high >= 0, got {self.eps_low}, {self.eps_high}"
            )

    @property
    def loss_settings(self) -> LossSettings:
        """What the policy loss is given (every loss takes the same settings)."""
        return LossSettings(eps_low=self.eps_low, eps_high=self.eps_high, agg_mode=self.agg_mode)

    @property
    def token_level_advantages(self) -> bool:
        """``advantage_scale`` names a token-level estimator (REINFORCE++): [N, T] advantages of
        the whole update batch, with ``beta_kl``'s KL in the reward rather than in the loss."""
        return is_token_level(self.advantage_scale)

    @property
    def needs_reference(self) -> bool:
        """A frozen reference policy is needed (a KL term, in the loss or in the reward)."""
        return self.beta_kl > 0

    @property
    def kl_in_reward(self) -> bool:
        """The reference's log-probs are needed before the advantages (REINFORCE++ with a KL)."""
        return self.token_level_advantages and self.beta_kl > 0

    @property
    def reward_kl_estimator(self) -> str:
        """The KL estimator of the KL in the reward (k1 unless ``kl_estimator`` is set)."""
        return self.kl_estimator or "k1"

    @property
    def token_advantage_settings(self) -> TokenAdvantageSettings:
        """A token-level estimator's settings: ``beta_kl`` in the reward, ``gamma``."""
        return TokenAdvantageSettings(kl_coef=self.beta_kl, gamma=self.gamma)

    @property
    def regularizer_settings(self) -> RegularizerSettings:
        """The KL and entropy terms added to the loss, aggregated as the loss is. With a
        token-level estimator the KL is in the reward, so the loss has none (beta 0)."""
        beta = 0.0 if self.token_level_advantages else self.beta_kl
        return RegularizerSettings(beta, self.kl_estimator or "k3", self.entropy_coef,
                                   self.agg_mode or "seq-mean-token-mean")


@dataclass
class RolloutConfig:
    """How responses are sampled and split for the updates.

    Args:
        group_size: G, responses sampled per prompt.
        backend: Rollout engine: ``hf`` (transformers, samples from the trained model itself)
            or ``vllm`` (a colocated vLLM engine; add ``callbacks.VLLMWeightSync`` to
            ``trainer.callbacks`` so it gets the policy's weights).
        sampling: Decoding settings of the training rollouts.
        vllm: Settings of the vLLM engine (``backend: vllm`` only).
        num_mini_batches: Optimizer steps per rollout batch (PPO-style). 1 = on-policy.
        micro_batch_size: Responses per forward/backward pass (gradient accumulation inside a
            mini-batch; it does not change the loss).
        micro_batch_tokens: Token budget of a forward/backward pass, beside ``micro_batch_size``:
            a micro-batch holds at most ``micro_batch_size`` rows and at most this many tokens,
            counted padded (rows x (longest prompt + longest response) of the micro-batch); rows
            are taken shortest first, and a row longer than the budget runs alone. For every
            trainer forward (pi_old, the update, the reference, the mismatch probe); the loss
            is unchanged (its denominators are the mini-batch's). Unset = rows only.
        packing: How a micro-batch's rows go through the model: ``off`` (padded rows, a prompt
            shared by several rows forwarded once: ``training/logprobs.py``), ``on`` (the rows
            concatenated into one sequence with no padding, ``position_ids`` restarting per
            row, attention kept within each row: flash-attention's varlen kernels, flex
            attention's block mask, or under SDPA / eager a dense block-diagonal mask, where
            attention costs as for one long row) or ``auto`` (``on`` under flash-attention or flex attention, else ``off``).
            Packed, ``micro_batch_tokens``
            counts a micro-batch's real tokens (the packed sequence's length), not padded ones.
            The loss and gradient are the same either way (up to float rounding).
        balance_ranks: With several processes, gather each mini-batch's rows from every rank and
            deal them anew by length (longest first, snake order; a prompt's rows together
            unless packed: ``training/rank_balance.py``), so each micro-batch index costs about
            the same on every rank. The loss and gradient are the same up to float rounding;
            per-rank-mean metrics move. No effect in one process.
        train_zero_advantage_rows: Forward and backward the rows whose advantage is 0 as well.
            Their gradient is exactly 0 without a KL or entropy term, so by default they are
            skipped (and with those terms every row is trained anyway); true only costs time,
            for a like-for-like speed comparison with a trainer that trains every row (TRL).
        old_logp: Where ``pi_old`` comes from: ``trainer`` (the trained model's own forward,
            so rollout/trainer numerics cannot bias the ratio) or ``rollout`` (the engine's
            log-probs).
        mismatch_every_n_steps: Measure ``rollout/logprob_mismatch`` (the engine's against the
            trainer's log-probs of the sampled tokens, at the sampled weights) on every N-th
            step; 0 = never. The rows a step trains measure it for free; a process with no
            trainable row pays one extra no-grad forward of a micro-batch (under FSDP2, every
            process does when any does), seconds at 30k-token rows: the large configs measure
            every 10th step.
        seed: Base of every per-rollout sampling seed (training, validation, corrections, a
            judge's questions), the mini-batch order's, and the weights of a model built in code
            (``tiny-llama``). Unset: ``seed_everything``'s (0 without it); set, it pins these
            streams whatever ``seed_everything`` says (``ibpo_lit.seeds``).
        tools: Tool-integrated rollouts: the policy may write a Python cell mid-solution, which
            runs in the code sandbox, its output appended as a tool turn (out of the loss) before
            generation resumes (``ToolConfig``; docs/tools.md). Unset = off.
        max_staleness: Updates a rollout batch may lag the weights it trains: 0 = on-policy
            (generate, then update); 1 = one step off-policy: step t+1's rollouts (and their
            corrections) are generated with step t's weights while step t updates
            (``training.off_policy``; needs ``backend: vllm_server`` and rollout correction on;
            docs/rollouts.md). The data module then hands each step the next step's prompts too
            (``data.steps_ahead``, linked). On a CPU, start the trainer and the server with
            ``OMP_WAIT_POLICY=PASSIVE`` (else it warns: their spinning threads made each step 2-3x as long).
        hf_decode: The HF engine's decode (``backend: hf`` only): ``dynamic`` (a KV cache that grows
            each step, finished rows leave the batch) or ``static`` (a fixed-size cache, every row
            decoded to the batch's end, the step compiled into a CUDA graph on a GPU; other
            per-seed samples than ``dynamic``'s). ``ibpo_lit/rollout/hf.py``; docs/benchmarks.md.
    """

    group_size: int = 8
    backend: Backend = "hf"
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    num_mini_batches: int = 1
    micro_batch_size: int = 8
    micro_batch_tokens: Optional[int] = None
    packing: Literal["off", "on", "auto"] = "off"
    balance_ranks: bool = False
    train_zero_advantage_rows: bool = False
    old_logp: Literal["trainer", "rollout"] = "trainer"
    mismatch_every_n_steps: int = 1
    seed: Optional[int] = None
    tools: Optional[ToolConfig] = None
    max_staleness: int = 0
    hf_decode: HFDecode = "dynamic"

    def __post_init__(self) -> None:
        if self.hf_decode not in get_args(HFDecode):
            raise ValueError(f"rollout.hf_decode must be one of {', '.join(get_args(HFDecode))}, "
                             f"got {self.hf_decode!r}")
        if self.hf_decode != "dynamic" and self.backend != "hf":
            raise ValueError(f"rollout.hf_decode: {self.hf_decode} is the HF engine's decode, but rollout.backend is "
                             f"{self.backend}: set backend: hf, or leave hf_decode at dynamic")
        if self.max_staleness not in (0, 1):
            raise ValueError(f"rollout.max_staleness must be 0 (on-policy) or 1 (one step off-policy), got "
                             f"{self.max_staleness}: larger lags are not implemented")
        if self.group_size < 2:
            raise ValueError(
                f"rollout.group_size must be >= 2 (got {self.group_size}): group advantages "
                "need at least two responses per prompt, and IBPO needs a partner rollout."
            )
        if self.num_mini_batches < 1:
            raise ValueError(f"rollout.num_mini_batches must be >= 1, got {self.num_mini_batches}")
        if self.micro_batch_size < 1:
            raise ValueError(f"rollout.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.micro_batch_tokens is not None and self.micro_batch_tokens < 1:
            raise ValueError(f"rollout.micro_batch_tokens must be >= 1 or unset, got {self.micro_batch_tokens}")
        if self.packing not in ("off", "on", "auto"):
            raise ValueError(f"rollout.packing must be 'off', 'on' or 'auto', got {self.packing!r}")
        if self.mismatch_every_n_steps < 0:
            raise ValueError(f"rollout.mismatch_every_n_steps must be >= 0 (0 = never), got {self.mismatch_every_n_steps}")
        if self.backend not in ENGINES:
            raise ValueError(f"rollout.backend must be one of {', '.join(ENGINES.names())}, got {self.backend!r}")


@dataclass
class RolloutCorrectionConfig:
    """Rollout correction: importance weights between the trainer's log-probs of the sampled
    tokens (``pi_old``) and the engine's, at token or sequence level, capped (TIS) and/or with
    tokens or rows outside a band rejected (MIS / RS). verl's names
    (``algorithm.rollout_correction``); TRL's are mapped in docs/rollouts.md. The formula:
    ``ibpo_lit/algorithms/rollout_correction.py``; metrics ``rollout_corr/*``.

    Args:
        enabled: Apply it (TRL's ``vllm_importance_sampling_correction``). Unset = auto: on when
            the engine samples from a copy of the weights (``rollout.backend: vllm``: its own
            kernels and precision, and weights as fresh as the last sync), off with ``hf``
            (it samples from the trained model with the trainer's own log-prob function) and
            with ``rollout.old_logp: rollout`` (the ratio is already taken against the
            engine's log-probs: nothing is left to weight). An explicit value wins; ``true``
            with ``rollout.old_logp: rollout`` is refused.
        rollout_is: Importance weights ``pi_old / pi_engine``: ``token`` (each token its own
            ratio), ``sequence`` (the row's product of ratios, on all its tokens) or null (no
            weights: rejection only).
        rollout_is_threshold: The cap C: weights above it are truncated to it (TIS; TRL's
            ``vllm_importance_sampling_clip_max``, formerly ``_cap``). No lower truncation.
        rollout_rs: Rejection: verl's options, comma-separated, all must pass (``token_k1``,
            ``seq_sum_k1``, ``seq_mean_k1``, and the ``k2`` / ``k3`` ones, ``seq_max_k2``,
            ``seq_max_k3``); a rejected token or row keeps weight 0. Null = none.
        rollout_rs_threshold: One entry per ``rollout_rs`` option, or one for all: for a ``k1``
            option a band ``'lower_upper'`` on ``pi_engine / pi_trainer`` (quoted in YAML, which
            reads an unquoted 0.5_2 as the number 0.52) or a number u for ``[1/u, u]``; for ``k2``
            / ``k3`` an upper bound.
    """

    enabled: Optional[bool] = None
    rollout_is: Optional[Literal["token", "sequence"]] = "token"
    rollout_is_threshold: float = 2.0
    rollout_rs: Optional[str] = None
    rollout_rs_threshold: Optional[Union[float, str]] = None

    def __post_init__(self) -> None:
        settings = self.settings  # raises, naming verl's field
        if self.enabled and not settings.active:
            raise ValueError("model.rollout_correction.enabled is true but rollout_is and rollout_rs are both "
                             "null: nothing would change; set one of them, or enabled: false")

    @property
    def settings(self) -> RolloutCorrectionSettings:
        try:
            return RolloutCorrectionSettings.parse(self.rollout_is, self.rollout_is_threshold, self.rollout_rs,
                                                   self.rollout_rs_threshold)
        except ValueError as err:
            raise ValueError(f"model.rollout_correction.{err}") from None

    def resolve(self, rollout: "RolloutConfig") -> Optional[RolloutCorrectionSettings]:
        """The settings the update applies, or None (off): ``enabled`` as set, else auto (see the
        class docstring). Raises when it is set on with ``rollout.old_logp: rollout``."""
        if self.enabled is None:
            on = ENGINES.get(rollout.backend).separate_weights and rollout.old_logp == "trainer"
        else:
            on = self.enabled
        if on and rollout.old_logp == "rollout":
            raise ValueError(
                "model.rollout_correction.enabled: true contradicts model.rollout.old_logp: rollout: the ratio's "
                "pi_old is then the engine's own log-probs, so the correction's weights would all be 1. Use "
                "old_logp: trainer (the trainer's pi_old, reweighted by the correction), or enabled: false")
        settings = self.settings
        return settings if on and settings.active else None


@dataclass
class OptimConfig:
    """AdamW with linear warm-up and cosine decay (METHOD section 7).

    Args:
        lr: Peak learning rate (paper: 5e-7 for Qwen3-32B).
        weight_decay: AdamW decoupled weight decay.
        betas: AdamW betas.
        eps: AdamW epsilon.
        warmup_ratio: Share of the optimizer steps spent warming up linearly (paper: 0.03).
        min_lr_ratio: Floor of the cosine decay, as a fraction of ``lr`` (paper: 0.1).
        total_steps: Optimizer steps the schedule spans; unset = ``trainer.max_steps``.
        grad_clip: Clip the global gradient norm to this value (0 = no clipping).
        fused: Use torch's fused AdamW kernel (one kernel over all parameters instead of a
            loop of per-tensor ops; timings in docs/benchmarks.md). Unset =
            on wherever it is supported (every trainable parameter a plain floating tensor on
            CPU or CUDA; not DTensor shards), off elsewhere.
    """

    lr: float = 5e-7
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_ratio: float = 0.03
    min_lr_ratio: float = 0.1
    total_steps: Optional[int] = None
    grad_clip: float = 1.0
    fused: Optional[bool] = None

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"optim.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.grad_clip < 0:
            raise ValueError(f"optim.grad_clip must be >= 0, got {self.grad_clip}")
