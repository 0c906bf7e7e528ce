"""Typed, documented configuration of the module. jsonargparse turns each ``Args:`` line
into ``--help`` text; ``__post_init__`` rejects bad values before any model loads."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from ibpo_lit.algorithms.ciw import CIWConfig
from ibpo_lit.algorithms.registry import ADVANTAGE_SCALES, AGGREGATIONS, POLICY_LOSSES, SHAPING_VARIANTS
from ibpo_lit.algorithms.shaping import validate_shaping
from ibpo_lit.rollout.engine import SamplingConfig
from ibpo_lit.rollout.vllm_engine import VLLMConfig


@dataclass
class AlgorithmConfig:
    """Loss, advantages and IBPO shaping.

    Args:
        loss: Policy loss by name: ``gspo`` (sequence-level ratio; GSPO-token when token
            weights are present, as with ``ibpo: mask``) or ``grpo`` (token-level ratio).
        eps_low: Lower clip range: the ratio is clipped at ``1 - eps_low``. GSPO's paper uses
            3e-4; GRPO/DAPO use 0.2.
        eps_high: Upper clip range (``1 + eps_high``). GSPO 4e-4; DAPO's clip-higher 0.28.
        agg_mode: How ``grpo`` averages token losses: ``seq-mean-token-mean`` (GRPO),
            ``token-mean`` (DAPO) or ``seq-mean-token-sum``. Leave unset for ``gspo``,
            which always averages each sequence's tokens, then sequences.
        beta_kl: Weight of the KL penalty to the initial policy (``grpo`` only; 0 = off, as
            in the IBPO experiments).
        advantage_scale: ``group`` (divide by the group's std), ``batch`` (by the batch's
            std) or ``none`` (Dr.GRPO: no division).
        ibpo: IBPO shaping variant: ``none``, ``plain`` (+lambda*beta), ``ratio``
            (+lambda * share of kept tokens) or ``mask`` (+lambda*beta, and only the tokens
            the correction changed get gradient). Needs the ``CorrectionRollouts`` callback.
        ibpo_lambda: Shaping weight lambda (paper's best about 0.6). ``lambda * Delta`` must
            stay below 1 so a shaped wrong rollout never outranks a correct one.
        ibpo_beta: Shaping bonus beta (paper: 0.5).
        ciw: Counterfactual importance weighting (METHOD section 8): token weights from how
            much masking each reasoning span lowers the answer's log-prob. Unset = off.
            ``ciw.mode`` picks the method (``ciw``) or an ablation (``uniform``, ``random``,
            ``inverted``). Works with both losses (with ``gspo`` it makes GSPO-token); with
            ``ibpo: mask`` the two token weights multiply.
    """

    loss: str = "gspo"
    eps_low: float = 3e-4
    eps_high: float = 4e-4
    agg_mode: Optional[str] = None
    beta_kl: float = 0.0
    advantage_scale: str = "group"
    ibpo: str = "plain"
    ibpo_lambda: float = 0.6
    ibpo_beta: float = 0.5
    ciw: Optional[CIWConfig] = None

    def __post_init__(self) -> None:
        POLICY_LOSSES.get(self.loss)  # raises, listing the valid names
        ADVANTAGE_SCALES.get(self.advantage_scale)
        SHAPING_VARIANTS.get(self.ibpo)
        if self.agg_mode is not None:
            AGGREGATIONS.get(self.agg_mode)
            if self.loss == "gspo":
                raise ValueError(
                    f"algorithm.agg_mode={self.agg_mode!r} contradicts algorithm.loss='gspo': GSPO's "
                    "ratio is per sequence, so its loss is always a mean over each sequence's tokens "
                    "then over sequences. Remove agg_mode or use loss: grpo."
                )
        if self.beta_kl < 0:
            raise ValueError(f"algorithm.beta_kl must be >= 0, got {self.beta_kl}")
        if self.beta_kl > 0 and self.loss != "grpo":
            raise ValueError("algorithm.beta_kl > 0 is supported with loss: grpo only")
        if not (0 <= self.eps_low < 1 and self.eps_high >= 0):
            raise ValueError(
                f"algorithm.eps_low must be in [0, 1) and eps_high >= 0, got {self.eps_low}, {self.eps_high}"
            )
        validate_shaping(self.ibpo, self.ibpo_lambda, self.ibpo_beta)


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
        old_logp: Where ``pi_old`` comes from: ``trainer`` (the trained model's own forward,
            so rollout/trainer numerics cannot bias the ratio) or ``rollout`` (the engine's
            log-probs).
        seed: Base of every per-rollout sampling seed.
    """

    group_size: int = 8
    backend: Literal["hf", "vllm"] = "hf"
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    num_mini_batches: int = 1
    micro_batch_size: int = 8
    old_logp: Literal["trainer", "rollout"] = "trainer"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(
                f"rollout.group_size must be >= 2 (got {self.group_size}): group advantages "
                "need at least two responses per prompt, and IBPO needs a partner rollout."
            )
        if self.num_mini_batches < 1:
            raise ValueError(f"rollout.num_mini_batches must be >= 1, got {self.num_mini_batches}")
        if self.micro_batch_size < 1:
            raise ValueError(f"rollout.micro_batch_size must be >= 1, got {self.micro_batch_size}")


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
            loop of per-tensor ops: 0.59 -> 0.09 s per SmolLM2 step on 2 CPU cores). Unset =
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
