"""The training step's parts, which ``IBPOModule.training_step`` calls in order.

- ``step_types.py``: what a step knows (``ScoredRollouts``, ``Corrections``, ``UpdateBatch``).
- ``assemble.py``: shaped rewards -> advantages -> the batch the update trains on.
- ``update.py``: ``PolicyUpdate``, the update loop (mini-batches, micro-batches, global
  denominators, clipping, skipped non-finite steps), the policy loss's forward, per-group
  gradients for diagnostics (``group_gradients``) and its counters' ``state_dict``.
- ``optimizer.py``: AdamW with warm-up and cosine decay.
- ``step_metrics.py``: a step's clock and its throughput and timing metrics.
- ``logprobs.py``: the trainer's response log-probs (one pass under FSDP2, a chunked LM head).
- ``ciw_scorer.py``: CIW's counterfactual forward passes (token weights).
- ``seeding.py``, ``rng_state.py``, ``checkpoint_io.py``: seeds per purpose, generator states
  for resume, checkpoint writing.

The formulas are not here: each lives in ``ibpo_lit.algorithms``.
"""
