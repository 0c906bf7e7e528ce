"""``PolicyUpdate``: the update half of a step (step 5 of README's diagram).

``num_mini_batches`` optimizer steps over an ``UpdateBatch``, each accumulated over
micro-batches (at most ``rollout.micro_batch_size`` rows and, when set,
``rollout.micro_batch_tokens`` tokens: ``training/micro_batches.py``; packed into one sequence
each under ``rollout.packing``: ``training/packing.py``) whose losses sum exactly
to the mini-batch loss, with denominators counted over every rank; the policy loss's forward
(``policy_loss``: the configured loss plus the KL and entropy terms,
``algorithms/regularizers.py``; the reference's log-probs once per rollout batch; the rollout
correction's weights, ``algorithms/rollout_correction.py``, where its per-token weights are
assembled); global gradient-norm clipping; a step whose loss or gradient norm is not finite
is skipped (on every rank) and counted, and ``max_nonfinite_steps`` of them in a row stop the
run. Under FSDP2 every forward is a collective, so every rank runs as many passes as the
busiest one (the extra ones on one prompt token and one response token); with
``rollout.balance_ranks`` each mini-batch's rows are first dealt anew across ranks by length
(``training/rank_balance.py``), so the ranks' micro-batches cost about the same.

It is given what it works with: the configs when it is built, and once per fit (``bind``) the
policy, its reference and an `UpdateRuntime` (the collectives, the device, Lightning's
``manual_backward``, the step's token counters). It keeps the counters a checkpoint saves
(``weights_version``, the non-finite counts: ``state_dict`` / ``load_state_dict``), and gives
diagnostics per-group gradients by its own rules (``group_gradients``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

from ibpo_lit.algorithms.advantages import rows_with_advantage
from ibpo_lit.algorithms.registry import POLICY_LOSSES, LossInputs
from ibpo_lit.algorithms.regularizers import regularizers
from ibpo_lit.algorithms.rollout_correction import CorrectionStats, RolloutCorrectionSettings, rollout_correction
from ibpo_lit.config import AlgorithmConfig, OptimConfig, RolloutConfig
from ibpo_lit.models.lora import is_lora, reference_of
from ibpo_lit.rollout.batch import RolloutBatch
from ibpo_lit.scale.collectives import SINGLE_PROCESS, RankSync
from ibpo_lit.scale.fsdp2 import is_sharded
from ibpo_lit.seeds import stream_seed
from ibpo_lit.training.logprobs import response_logprobs, response_logprobs_and_entropy
from ibpo_lit.training.metric_reductions import MAX, MIN, reduction_of
from ibpo_lit.training.micro_batches import length_order, micro_batches, one_token_row, row_lengths
from ibpo_lit.training.packing import packs
from ibpo_lit.training.rank_balance import balanced_rows, units_of
from ibpo_lit.training.step_types import StepStats, UpdateBatch


# The loss's metrics that are extremes (``train/ratio_max``): combined over a mini-batch's
# micro-batches by their own max / min; a mean weighted by rows made them depend on the cut.
# (Over mini-batches every metric is averaged, as before.)
EXTREMES = {MAX: max, MIN: min}


class NonFiniteError(RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient norm."""


@dataclass
class UpdateRuntime:
    """What an update needs from the running trainer, handed over once per fit (`PolicyUpdate.bind`)."""

    sync: RankSync = SINGLE_PROCESS
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    backward: Callable[[Tensor], None] = Tensor.backward
    step_stats: Optional[StepStats] = None  # the step's token counters (compute accounting), reset each step


class PolicyUpdate:
    """The update loop and the policy loss of a GSPO(+IBPO) step.

    Args:
        algorithm, rollout, optim: The module's configs.
        max_nonfinite_steps: Consecutive skipped steps that stop the run.
        logprob_chunk_tokens: Positions the LM head sees at once (``training.logprobs``).
        correction: The rollout correction's settings, resolved
            (``RolloutCorrectionConfig.resolve``); None = off.
    """

    def __init__(self, algorithm: AlgorithmConfig, rollout: RolloutConfig, optim: OptimConfig,
                 max_nonfinite_steps: int, logprob_chunk_tokens: Optional[int],
                 correction: Optional[RolloutCorrectionSettings] = None) -> None:
        if correction is not None and rollout.old_logp == "rollout":
            raise ValueError("a rollout correction needs rollout.old_logp: trainer (with 'rollout' its weights are 1)")
        self.algorithm, self.rollout_cfg, self.optim_cfg = algorithm, rollout, optim
        self.correction = correction
        self._correction_stats = CorrectionStats()  # this step's, over the rows its forwards saw
        self.max_nonfinite_steps = max_nonfinite_steps
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.loss_fn = POLICY_LOSSES.get(algorithm.loss)
        self.policy: Optional[torch.nn.Module] = None
        self.ref_policy: Optional[torch.nn.Module] = None
        self.runtime = UpdateRuntime(step_stats=StepStats())
        self.step_index = 0  # the rollout step being updated (seeds the mini-batch order)
        # Optimizer steps taken (skipped non-finite ones excluded): the version of the policy's
        # weights. A weight-sync callback records which version the engine holds.
        self.weights_version = 0
        self.nonfinite_run = 0
        self.nonfinite_total = 0
        self._mismatch = [0.0, 0.0]  # (sum of |engine - trainer| log-prob, tokens) of this step
        self._measure_mismatch = False  # whether this step measures it (`run` decides)

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, int]:
        """The counters a checkpoint saves: the weights' version and the non-finite counts (a
        resumed run's engine sync and its stop rule go on from them)."""
        return {"weights_version": self.weights_version, "nonfinite_run": self.nonfinite_run,
                "nonfinite_total": self.nonfinite_total}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Counters as `state_dict` wrote them; a missing one starts at 0 (a checkpoint from before it)."""
        self.weights_version = int(state.get("weights_version", 0))
        self.nonfinite_run = int(state.get("nonfinite_run", 0))
        self.nonfinite_total = int(state.get("nonfinite_total", 0))

    def bind(self, policy: torch.nn.Module, ref_policy: Optional[torch.nn.Module], runtime: UpdateRuntime) -> None:
        """Hand over what a fit provides, once its strategy has placed the models: the policy,
        its frozen reference (None: no KL term, or a LoRA policy's base with the adapters off)
        and the trainer's `UpdateRuntime`. The counters are left alone: a checkpoint may be
        restored before this (one process) or after it (FSDP2)."""
        self.policy, self.ref_policy, self.runtime = policy, ref_policy, runtime

    @property
    def uniform_forwards(self) -> bool:
        """Whether every forward of the policy is a collective (FSDP2), so that each rank must
        run as many as the others: one pass per log-prob call, pass counts agreed on."""
        return is_sharded(self.policy)

    @property
    def packed(self) -> bool:
        """Whether the policy's forwards are packed (``rollout.packing``, resolved against its
        attention implementation: ``training/packing.py``)."""
        return packs(self.policy, self.rollout_cfg.packing)

    @property
    def balances(self) -> bool:
        """Whether each mini-batch's rows are dealt to ranks by length (``rollout.balance_ranks``
        with more than one process: ``training/rank_balance.py``)."""
        return self.rollout_cfg.balance_ranks and self.runtime.world_size > 1

    @property
    def regularizer(self):
        """The KL and entropy terms' settings (``algorithms/regularizers.py``)."""
        return self.algorithm.regularizer_settings

    @property
    def temperature(self) -> float:
        return self.rollout_cfg.sampling.temperature

    # ------------------------------------------------------------------ the loop
    def run(self, update: UpdateBatch, optimizer, scheduler, step_index: int) -> dict[str, float]:
        """``num_mini_batches`` optimizer steps over ``update``; returns averaged metrics,
        ``rollout/logprob_mismatch`` included, and ``rollout_corr/*`` with a rollout correction."""
        cfg, device = self.rollout_cfg, self.runtime.device
        self.step_index, self._mismatch = step_index, [0.0, 0.0]
        self._correction_stats = CorrectionStats()
        every = cfg.mismatch_every_n_steps
        self._measure_mismatch = cfg.old_logp == "trainer" and every > 0 and step_index % every == 0
        batch = update.batch.to(device)
        advantages = update.advantages.to(device)
        token_weights = update.token_weights.to(device) if update.token_weights is not None else None
        n = len(batch)
        generator = torch.Generator().manual_seed(stream_seed(cfg.seed) * 7919 + step_index)  # (the module's: resolved)
        order = torch.randperm(n, generator=generator) if cfg.num_mini_batches > 1 else torch.arange(n)
        # tensor_split: exactly num_mini_batches optimizer steps on every rank, whatever its rows
        # (torch.chunk may return fewer parts than asked for).
        minis = [mini.to(device) for mini in order.tensor_split(cfg.num_mini_batches)]
        if self.balances:  # each mini-batch's rows, over every rank, dealt anew by length
            batch, advantages, token_weights, minis = self._deal_to_ranks(batch, advantages, token_weights, minis)

        # rollout/logprob_mismatch compares the engine with the trainer at the weights the engine
        # sampled with, so it is measured before the first optimizer step of this batch (after
        # it, on a multi-process run another rank's gradient has already moved the weights).
        old_logp = None
        if cfg.old_logp == "rollout":
            old_logp = batch.rollout_logp
        elif cfg.num_mini_batches > 1:
            # pi_old must be the policy before the first update of this batch.
            old_logp = self.logprobs_no_grad(self.policy, batch)
            self._record_mismatch(old_logp, batch)  # every row, at the sampled weights
        else:
            self._mismatch_without_trained_rows(batch, advantages)
        # The reference never changes: its log-probs once per rollout batch, not per micro-batch.
        ref_logp = self.ref_logprobs(batch)

        totals: dict[str, float] = {}
        for mini in minis:
            for key, value in self._mini_batch(batch, advantages, token_weights, old_logp, ref_logp, mini,
                                               optimizer, scheduler).items():
                totals[key] = totals.get(key, 0.0) + value / cfg.num_mini_batches
        metrics = totals
        metrics["train/nonfinite_steps"] = float(self.nonfinite_total)  # a count, not a mean over mini-batches
        metrics["rollout/logprob_mismatch"] = self.mismatch_metric()
        if self.correction is not None:
            metrics.update(self._correction_stats.metrics())
        return metrics

    def _mini_batch(self, batch, advantages, token_weights, old_logp, ref_logp, rows, optimizer,
                    scheduler) -> dict[str, float]:
        sync = self.runtime.sync
        optimizer.zero_grad(set_to_none=True)

        # Global denominators: every micro-batch loss is a share of the mini-batch loss, over
        # the rows of every rank. DDP and FSDP average gradients over ranks, so each rank's
        # loss is scaled by the number of ranks to make the sum of shares the global mean.
        world = self.runtime.world_size
        num_seqs, num_tokens = sync.sum([float(len(rows)), float(batch.policy_mask[rows].sum())])
        active = self._trained_rows(rows, batch, advantages)  # the others stay in the denominators above

        loss_total, weighted, extremes = 0.0, {}, {}
        micros = self._micro_batches(active, batch)
        # Under DDP/FSDP every backward (and under FSDP every forward) is a collective: all
        # ranks run as many micro-batches as the busiest one, the others with passes of one
        # token whose loss is multiplied by 0 (the same collectives, nothing added to the gradient).
        for index in range(sync.max(len(micros))):
            padding = index >= len(micros)
            micro = torch.zeros(1, dtype=torch.long, device=rows.device) if padding else micros[index]
            loss, metrics = self.policy_loss(
                one_token_row(batch) if padding else batch.select(micro),
                advantages[micro],
                token_weights[micro] if token_weights is not None else None,
                old_logp[micro] if old_logp is not None else None,
                ref_logp=ref_logp[micro] if ref_logp is not None else None,
                num_seqs=num_seqs,
                num_tokens=num_tokens,
                bookkeeping=not padding,
            )
            if padding:
                self.runtime.backward(loss * 0.0)
                continue
            self.runtime.backward(loss * world)
            loss_total += float(loss.detach())
            for key, value in metrics.items():
                name = key if "/" in key else f"train/{key}"
                extreme = EXTREMES.get(reduction_of(name))  # train/ratio_max: the mini-batch's, whatever the cut
                if extreme is not None:
                    extremes[name] = extreme(extremes.get(name, float(value)), float(value))
                else:  # the rest: a mean of the micro-batches' values, weighted by their rows
                    weighted[name] = weighted.get(name, 0.0) + float(value) * len(micro)

        grad_norm = self.clip_and_check()
        finite = math.isfinite(loss_total) and math.isfinite(grad_norm)
        finite = not sync.any(not finite)  # every rank skips, or none: the replicas stay equal
        if not finite:
            # Skip the update but keep the step count: params with no grad are left as they are.
            optimizer.zero_grad(set_to_none=True)
            self.nonfinite_run += 1
            self.nonfinite_total += 1
            if self.nonfinite_run >= self.max_nonfinite_steps:
                raise NonFiniteError(
                    f"{self.nonfinite_run} consecutive optimizer steps had a non-finite loss ({loss_total}) "
                    f"or gradient norm ({grad_norm}); stopping. Lower optim.lr, check trainer.precision, "
                    "or raise max_nonfinite_steps."
                )
        else:
            self.nonfinite_run = 0
            self.weights_version += 1
        optimizer.step()
        scheduler.step()
        # Free the gradients now rather than at the next mini-batch: otherwise they are held
        # through the next rollouts, beside a woken engine (4 GB per rank at 32B, issue 31).
        optimizer.zero_grad(set_to_none=True)

        out = {k: v / max(len(active), 1) for k, v in weighted.items()}
        out.update(extremes)
        out.update({"train/loss": loss_total, "train/grad_norm": grad_norm, "train/lr": scheduler.get_last_lr()[0]})
        return out

    def _deal_to_ranks(self, batch: RolloutBatch, advantages: Tensor, token_weights: Optional[Tensor],
                       minis: list[Tensor]):
        """This rank's rows after the deal: every rank's rows and their per-row tensors gathered
        (one collective; every rank then briefly holds the whole batch, token ids and per-token
        floats), and this rank's share of each mini-batch, the union of the ranks' own
        mini-batches dealt by ``rank_balance.balanced_rows`` (rows of one prompt together unless
        packed). Every rank computes the same deal. Returns (this rank's rows as a batch, their
        advantages and token weights, its mini-batches as indices into them); the forwards
        after it (pi_old, the reference, the update) run on these rows, and the loss's
        denominators (summed over ranks) are unchanged."""
        sync, device, world = self.runtime.sync, self.runtime.device, self.runtime.world_size
        rank = torch.distributed.get_rank() if sync.active else 0
        everyone = sync.gather({"batch": batch.to("cpu"), "advantages": advantages.cpu(),
                                "token_weights": token_weights.cpu() if token_weights is not None else None,
                                "minis": [m.cpu() for m in minis]})
        sizes = [len(e["batch"]) for e in everyone]
        offsets = [sum(sizes[:r]) for r in range(len(sizes))]
        whole = RolloutBatch.concat([e["batch"] for e in everyone], pad_token_id=0)  # pads are masked

        def joined(name: str) -> Optional[Tensor]:
            parts = [e[name] for e in everyone]
            if all(p is None for p in parts):
                return None
            if parts[0].dim() == 1:
                return torch.cat(parts).to(device)
            width = max(p.shape[1] for p in parts)
            return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts]).to(device)

        source = torch.cat([torch.full((n,), r, dtype=torch.long) for r, n in enumerate(sizes)])
        lengths = whole.prompt_mask.sum(dim=1) + whole.response_mask.sum(dim=1)
        mine = []
        for index in range(len(minis)):
            rows = torch.cat([e["minis"][index] + offsets[r] for r, e in enumerate(everyone)])
            units = units_of(rows, source, whole.group_index, by_row=self.packed)
            mine.append(balanced_rows(rows, lengths, units, world)[rank])
        rows = torch.cat(mine)  # this rank's rows, mini-batch after mini-batch
        local = torch.arange(len(rows), device=device).split([len(m) for m in mine])
        weights = joined("token_weights")
        return (whole.select(rows).to(device), joined("advantages")[rows.to(device)],
                weights[rows.to(device)] if weights is not None else None, list(local))

    def _trained_rows(self, rows: Tensor, batch: RolloutBatch, advantages: Tensor) -> Tensor:
        """The rows of ``rows`` whose forward can change the loss, shortest first: the one rule
        for which rows an update (and `group_gradients`) forwards.

        A row with zero advantage contributes exactly zero loss and gradient (without a KL or
        entropy term), and a row with no response token in the loss (all masked out) nothing at
        all: their forwards are skipped, while the caller keeps them in its denominators. Sorted
        by prompt + response length (stable), so that a micro-batch's rows need less padding."""
        every = self.regularizer.needs_every_row or self.rollout_cfg.train_zero_advantage_rows
        active = rows if every else rows[rows_with_advantage(advantages[rows])]
        active = active[batch.policy_mask[active].any(dim=1)]  # (tool-output tokens are not trained)
        return length_order(batch, active)

    def _micro_batches(self, rows: Tensor, batch: RolloutBatch) -> list[Tensor]:
        """``rows`` of ``batch``, in their order, cut into micro-batches of at most
        ``rollout.micro_batch_size`` rows and ``rollout.micro_batch_tokens`` tokens
        (``training/micro_batches.py``); none when ``rows`` is empty."""
        cfg = self.rollout_cfg
        return micro_batches(rows, *row_lengths(batch), cfg.micro_batch_size, cfg.micro_batch_tokens,
                             packed=self.packed)

    # ------------------------------------------------------------------ diagnostics
    def group_gradients(self, update: UpdateBatch, groups: Sequence[Tensor], params: Sequence[Tensor],
                        denominators: str = "group") -> Tensor:
        """[K, D] float32: for each of the ``K`` groups of rows of ``update`` (index tensors), the
        gradient of the policy loss over that group alone with respect to ``params`` (flattened
        and concatenated: ``D`` is their total size), at the current weights and on-policy
        (``pi_old`` = these weights: the gradient of the step's first update).

        ``denominators``: ``"group"`` averages each group's loss over its own rows and tokens
        (each group's mean gradient; ``GradientVarianceLogger``'s splits); ``"batch"`` over the
        whole update's (each group's share of the batch's gradient: groups that partition the
        rows add up to it; ``scripts/variance_at_fixed_policy.py``'s prompts).

        The forwards are an update's: the same rows skipped (zero advantage without a KL or
        entropy term, no response token), the same micro-batches, the reference's log-probs when
        a KL term needs them. Taken with ``torch.autograd.grad``: the parameters' ``.grad`` stay
        as they are and nothing steps. Not counted in ``step_stats``: a diagnostic, not the
        training's compute. This process's rows only, with no collective: one process, or
        forwards that are not collectives."""
        if denominators not in ("group", "batch"):
            raise ValueError(f"group_gradients: denominators must be 'group' or 'batch', got {denominators!r}")
        device = self.runtime.device
        batch = update.batch.to(device)
        advantages = update.advantages.to(device)
        weights = update.token_weights.to(device) if update.token_weights is not None else None
        params = list(params)
        every = torch.arange(len(batch), device=device)
        out = []
        for rows in groups:
            rows = rows.to(device)
            counted = rows if denominators == "group" else every
            num_seqs, num_tokens = float(len(counted)), float(batch.policy_mask[counted].sum())
            total = [torch.zeros_like(p, dtype=torch.float32) for p in params]
            for micro in self._micro_batches(self._trained_rows(rows, batch, advantages), batch):
                part = batch.select(micro)
                with torch.enable_grad():
                    loss, _ = self.policy_loss(
                        part, advantages[micro], weights[micro] if weights is not None else None,
                        num_seqs=num_seqs, num_tokens=num_tokens, bookkeeping=False,
                        ref_logp=self.ref_logprobs(part, count=False),
                    )
                    grads = torch.autograd.grad(loss, params, allow_unused=True)
                for acc, grad in zip(total, grads):
                    if grad is not None:  # a parameter this loss does not reach: zero
                        acc.add_(grad.float())
            out.append(torch.cat([g.reshape(-1) for g in total]))
        return torch.stack(out)

    # ------------------------------------------------------------------ the loss
    def policy_loss(
        self,
        batch: RolloutBatch,
        advantages: Tensor,
        token_weights: Optional[Tensor] = None,
        old_logp: Optional[Tensor] = None,
        num_seqs: Optional[float] = None,
        num_tokens: Optional[float] = None,
        bookkeeping: bool = True,
        ref_logp: Optional[Tensor] = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Forward ``batch`` (trimmed to its own padding) and return the configured loss.

        ``advantages`` [n] or [n, >=Lr] (token-level estimators); ``token_weights`` and
        ``old_logp`` [n, >=Lr] (cut to the batch's response length); ``old_logp=None`` means
        on-policy (``pi_old`` = this forward, detached); ``ref_logp`` [n, >=Lr] the reference's (needed when ``beta_kl > 0``). The
        entropy comes from this forward's logits (``train/entropy``). ``num_seqs``/``num_tokens`` are the global denominators (default: this
        batch's own), so several calls' losses add up to one batch's loss. ``bookkeeping=False``
        (a padding pass) leaves the token counters and the mismatch and correction metrics alone.
        With a rollout correction its weights multiply ``token_weights`` (`correction_weights`).
        """
        batch = batch.trimmed()
        reg = self.regularizer
        logp, entropy = response_logprobs_and_entropy(
            self.policy, batch, self.temperature, entropy_grad=reg.entropy_coef > 0,
            single_pass=self.uniform_forwards, chunk_tokens=self.logprob_chunk_tokens,
            packing=self.rollout_cfg.packing)
        width = logp.shape[1]
        if bookkeeping:
            self._count(batch, trained=True)
        old = old_logp[:, :width] if old_logp is not None else logp.detach()
        if old_logp is None and self.rollout_cfg.old_logp == "trainer" and bookkeeping:
            # on-policy: this forward runs before the batch's only optimizer step
            self._record_mismatch(old, batch)
        num_seqs = num_seqs if num_seqs is not None else float(len(batch))
        num_tokens = num_tokens if num_tokens is not None else float(batch.policy_mask.sum())
        # The policy's own tokens: tool-output tokens (tool-integrated rollouts) are in the
        # forward, as context, but neither in the loss nor in the importance ratio.
        mask = batch.policy_mask
        weights = token_weights[:, :width] if token_weights is not None else None
        if self.correction is not None:
            # Multiplies each token's term: GRPO's clipped term, GSPO-token's term under GSPO's
            # sequence ratio (verl's and TRL's choice; docs/rollouts.md#rollout-correction).
            corrected = self.correction_weights(old, batch, bookkeeping)
            weights = corrected if weights is None else weights * corrected
        inputs = LossInputs(
            logp, old, advantages[:, :width] if advantages.dim() == 2 else advantages, mask,
            token_weights=weights, num_seqs=num_seqs, num_tokens=num_tokens,
        )
        loss, metrics = self.loss_fn(inputs, self.algorithm.loss_settings)
        extra, more = regularizers(logp, mask, reg,
                                   ref_logp=ref_logp[:, :width] if ref_logp is not None else None,
                                   entropy=entropy, num_seqs=num_seqs, num_tokens=num_tokens)
        return loss + extra, {**metrics, **more}

    def correction_weights(self, trainer_logp: Tensor, batch: RolloutBatch, bookkeeping: bool = True) -> Tensor:
        """[n, w] the rollout correction's weights of ``batch``'s sampled tokens: ``trainer_logp``
        [n, w] (``pi_old``: kept, or this forward's own before the batch's first optimizer step)
        against the engine's ``rollout_logp``, over the policy's tokens (tool output out).
        ``bookkeeping``: add them to this step's ``rollout_corr/*`` metrics."""
        width = trainer_logp.shape[1]
        weights, stats = rollout_correction(trainer_logp, batch.rollout_logp[:, :width],
                                            batch.policy_mask[:, :width], self.correction)
        if bookkeeping:
            self._correction_stats.add(stats)
        return weights

    def logprobs(self, model: torch.nn.Module, batch: RolloutBatch) -> Tensor:
        """The trainer's response log-probs [B, Lr] (gradient as the caller's mode allows)."""
        return response_logprobs(model, batch, self.temperature, single_pass=self.uniform_forwards,
                                 chunk_tokens=self.logprob_chunk_tokens, packing=self.rollout_cfg.packing)

    def ref_logprobs(self, batch: RolloutBatch, count: bool = True) -> Optional[Tensor]:
        """The reference's log-probs [B, Lr] of ``batch`` when a KL term needs them, else None.
        A LoRA policy's reference is its base, adapters off (no copy of the model). ``count``:
        add these forwards to ``step_stats``."""
        if not self.regularizer.needs_ref_logp:
            return None
        return self.reference_logprobs(batch, count)

    def reference_logprobs(self, batch: RolloutBatch, count: bool = True) -> Tensor:
        """The reference's log-probs [B, Lr] of ``batch``, whether or not the loss has a KL term
        (REINFORCE++ puts the KL into the reward, before the advantages: the module calls this
        on the step's batch). ``batch`` on the update's device; every rank must call it."""
        if self.ref_policy is None and is_lora(self.policy):
            with reference_of(self.policy) as base:
                return self.logprobs_no_grad(base, batch, count)
        return self.logprobs_no_grad(self.ref_policy, batch, count)

    @torch.no_grad()
    def logprobs_no_grad(self, model: torch.nn.Module, batch: RolloutBatch, count: bool = True) -> Tensor:
        """Log-probs [B, Lr] in micro-batches (rows in their order, or shortest first under a
        token budget); with collective forwards every rank runs as many passes as the busiest
        (the extra ones of one token, discarded). ``count``: add these forwards to
        ``step_stats`` (the step's compute)."""
        rows = torch.arange(len(batch), device=batch.response_ids.device)
        if self.rollout_cfg.micro_batch_tokens is not None:
            rows = length_order(batch, rows)
        chunks = self._micro_batches(rows, batch)
        passes = self.runtime.sync.max(len(chunks)) if self.uniform_forwards else len(chunks)
        out = torch.zeros(batch.response_ids.shape, dtype=torch.float32, device=batch.response_ids.device)
        for index in range(passes):
            if index >= len(chunks):
                self.logprobs(model, one_token_row(batch))
                continue
            logp = self.logprobs(model, batch.select(chunks[index]))
            out[chunks[index]] = torch.nn.functional.pad(logp, (0, batch.response_ids.shape[1] - logp.shape[1]))
            if count:
                self._count(batch.select(chunks[index]), trained=False)
        return out

    def clip_and_check(self) -> float:
        """Clip by the global gradient norm (over DTensor shards, the norm of the whole
        gradient, the same on every rank) and return it."""
        params = [p for p in self.policy.parameters() if p.grad is not None]
        if not params:
            return 0.0
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        full = getattr(norm, "full_tensor", None)
        return float(full() if callable(full) else norm)

    # ------------------------------------------------------------------ engine vs trainer
    def _record_mismatch(self, trainer_logp: Tensor, batch: RolloutBatch) -> None:
        """Accumulate |engine log-prob - trainer log-prob| over the sampled tokens of ``batch``
        (``rollout/logprob_mismatch``: how far the engine's numerics, or stale weights, are
        from the policy the ratio is computed against), on the steps that measure it."""
        if not self._measure_mismatch:
            return
        mask = batch.policy_mask
        diff = (trainer_logp.detach().float() - batch.rollout_logp[:, : trainer_logp.shape[1]]).abs()
        self._mismatch[0] += float((diff * mask).sum())
        self._mismatch[1] += float(mask.sum())

    def _mismatch_without_trained_rows(self, batch: RolloutBatch, advantages: Tensor) -> None:
        """On-policy, a rank whose rows all have zero advantage forwards none of them, so the
        mismatch has no tokens there: one no-grad forward of a micro-batch measures it, before
        the optimizer step (on every rank when forwards are collectives and any rank needs it).
        Not on the steps that do not measure it (``rollout.mismatch_every_n_steps``): the step
        index is every rank's, so every rank skips together."""
        if not self._measure_mismatch:
            return
        every = torch.arange(len(batch), device=batch.prompt_ids.device)
        needed = len(batch) > 0 and len(self._trained_rows(every, batch, advantages)) == 0
        probe = batch.select(self._probe_rows(batch))
        if self.uniform_forwards and self.runtime.sync.any(needed):
            with torch.no_grad():
                logp = self.logprobs(self.policy, probe)
            if needed:
                self._record_mismatch(logp, probe)
                self._count(probe, trained=False)
        elif needed:
            self._record_mismatch(self.logprobs_no_grad(self.policy, probe), probe)

    def _probe_rows(self, batch: RolloutBatch) -> Tensor:
        """The rows of the mismatch probe: the first micro-batch (under a token budget, of the
        rows shortest first); row 0 of an empty batch, as a padding pass would."""
        device = batch.prompt_ids.device
        if self.rollout_cfg.micro_batch_tokens is None or not len(batch):
            return torch.arange(max(min(len(batch), self.rollout_cfg.micro_batch_size), 1), device=device)
        return self._micro_batches(length_order(batch), batch)[0]

    def mismatch_metric(self) -> float:
        """The step's mean |engine - trainer| log-prob per sampled token, at the sampled weights
        (NaN with ``rollout.old_logp: rollout``, where the trainer's are not computed, and on
        the steps ``rollout.mismatch_every_n_steps`` skips)."""
        if not self._measure_mismatch:
            return math.nan
        return self._mismatch[0] / max(self._mismatch[1], 1.0)

    def _count(self, batch: RolloutBatch, trained: bool) -> None:
        stats = self.runtime.step_stats
        if stats is None:
            return
        if trained:
            stats.trained_tokens += sequence_tokens(batch)
        else:
            stats.no_grad_tokens += sequence_tokens(batch)


def sequence_tokens(batch: RolloutBatch) -> int:
    """Real (unpadded) prompt + response tokens of a batch: what a forward pass processes."""
    return int(batch.prompt_mask.sum()) + int(batch.response_mask.sum())
