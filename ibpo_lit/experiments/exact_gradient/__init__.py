"""An exact-gradient testbed for the project's policy-gradient estimators (issue 34, item 2).

A small autoregressive softmax policy over sequences of ``T`` decisions from a vocabulary of
``V`` tokens, several prompts, and a terminal verifiable reward: every one of the ``V**T``
sequences of a prompt can be enumerated, so the true gradient of ``J = E_x E_{y~pi}[r]`` is
exact, and each estimator's bias, variance, mean squared error and cosine to it can be measured.
The estimators are the project's own code (``ibpo_lit.algorithms``): group advantages, IBPO's
shaping and rewrite filter, the GSPO / GRPO losses and CIW's weights, composed as
``ibpo_lit/training/assemble.py`` composes them; only the rollouts, the corrections and the
policy are the testbed's.

- ``problem``: prompts, hidden targets, the reward, the enumeration of sequences;
- ``policy``: the tiny policy (an MLP over prompt, position and prefix), sampling, log-probs,
  the exact objective and its gradient;
- ``corrector``: compare-and-correct modelled on the policy (informative or not, tunable skill
  and locality, optionally under a marker input the rollouts never see), reference choice, and
  the exact shaped objective;
- ``estimators``: the methods (GSPO, GRPO, IBPO plain / ratio / mask, shaping only, k = 1, CIW)
  and one draw of each's gradient;
- ``measure``: bias, variance, MSE and cosine at a fixed policy, and learning curves;
- ``report``: the markdown tables of ``scripts/exact_gradient.py``.
"""
