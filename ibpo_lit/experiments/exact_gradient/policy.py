"""The testbed's policy: ``pi_theta(y_t | x, y_<t)``, a one-hidden-layer MLP, float64.

Input of a decision: one-hot prompt [P], one-hot position [T], and the prefix, one-hot per
position over ``V + 1`` channels (channel ``V`` = a masked token, CIW's pad; positions not yet
drawn are all zero): ``P + T + T (V + 1)`` features, ``hidden`` tanh units, ``V`` logits.
P = 8, T = 8, V = 2, hidden = 64: 2,754 parameters.

``marker=True`` adds one input feature, the *correction marker*: 1 in a correction's input, 0 in
every rollout's (the correction prompt carries something the policy's own rollouts never see).
Its first-layer column is drawn after the other weights from the same seed, so a marked policy
has the unmarked one's weights bit for bit and acts as it does on rollouts (to rounding); what a step learns
through the marker column reaches rollouts only through the weights they share.

Two ways to the same log-probs (a test checks they agree): ``log_table`` evaluates every state
of the prefix tree at once (``[P, S, V]``: sampling walks it, the exact objective sums over it),
and ``token_logp`` teacher-forces a batch of sequences (what a training step differentiates:
its cost grows with the batch, not with ``V^T``).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ibpo_lit.experiments.exact_gradient.problem import Problem

MASKED = -2  # a prefix entry that is a masked token (CIW); -1 = not drawn yet


class TinyPolicy(nn.Module):
    """``pi_theta`` of a ``Problem``; ``seed`` draws the initial weights."""

    def __init__(self, problem: Problem, hidden: int = 64, seed: int = 0, marker: bool = False) -> None:
        super().__init__()
        self.problem = problem
        self.marker = marker
        p, t, v = problem.num_prompts, problem.length, problem.vocab
        base = p + t + t * (v + 1)
        self.num_features = base + int(marker)
        generator = torch.Generator().manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(self.num_features, hidden), nn.Tanh(), nn.Linear(hidden, v)).double()
        with torch.no_grad():  # nn.Linear's own init, from this seed (the unmarked policy's fan-in)
            for layer, fan_in in ((self.net[0], base), (self.net[2], hidden)):
                bound = fan_in ** -0.5
                weight = torch.empty(layer.out_features, fan_in, dtype=torch.float64)
                layer.weight[:, :fan_in] = weight.uniform_(-bound, bound, generator=generator)
                layer.bias.uniform_(-bound, bound, generator=generator)
            if marker:  # drawn last: the other weights stay the unmarked policy's
                self.net[0].weight[:, base].uniform_(-base ** -0.5, base ** -0.5, generator=generator)
        self._table_features = {}

    def features(self, prompts: Tensor, positions: Tensor, prefixes: Tensor, marked: bool = False) -> Tensor:
        """[N, F] float64 inputs of N decisions: prompts [N], positions [N], prefixes [N, T]
        (token ids, -1 = not drawn, ``MASKED`` = masked); ``marked``: a correction's input (the
        marker feature on; only with ``marker=True``)."""
        if marked and not self.marker:
            raise ValueError("marked inputs need a policy built with marker=True")
        pr = self.problem
        n = prompts.shape[0]
        x = torch.zeros(n, self.num_features, dtype=torch.float64)
        x[torch.arange(n), prompts] = 1.0
        x[torch.arange(n), pr.num_prompts + positions] = 1.0
        channel = torch.where(prefixes == MASKED, pr.vocab, prefixes)  # [N, T]
        column = pr.num_prompts + pr.length + torch.arange(pr.length) * (pr.vocab + 1) + channel
        drawn = prefixes != -1
        rows = torch.arange(n)[:, None].expand_as(prefixes)
        x[rows[drawn], column[drawn]] = 1.0
        if marked:
            x[:, -1] = 1.0
        return x

    def logits(self, features: Tensor) -> Tensor:
        return self.net(features)

    def log_table(self, marked: bool = False) -> Tensor:
        """[P, S, V] log pi of every token at every state of every prompt (``marked``: under
        the correction marker)."""
        pr = self.problem
        if marked not in self._table_features:
            s = pr.num_states
            prompts = torch.arange(pr.num_prompts).repeat_interleave(s)
            positions = pr.state_positions.repeat(pr.num_prompts)
            prefixes = pr.state_prefixes.repeat(pr.num_prompts, 1)
            self._table_features[marked] = self.features(prompts, positions, prefixes, marked)
        out = torch.log_softmax(self.logits(self._table_features[marked]), -1)
        return out.view(pr.num_prompts, pr.num_states, pr.vocab)

    def token_logp(self, prompts: Tensor, seqs: Tensor, masked: Tensor | None = None, marked: bool = False) -> Tensor:
        """[N, T] log pi(y_t | x, y_<t) of ``seqs`` [N, T] by teacher forcing; ``masked`` [N, T]
        bool marks prefix tokens replaced by the masked channel (CIW's counterfactual);
        ``marked``: every row is a correction's input (the marker on)."""
        n, t = seqs.shape
        tokens = seqs if masked is None else torch.where(masked, MASKED, seqs)
        before = torch.arange(t)[None, :] < torch.arange(t)[:, None]  # [t, u]: u drawn before t
        prefixes = torch.where(before[None], tokens[:, None, :], -1)  # [N, T, T]
        feats = self.features(prompts.repeat_interleave(t), torch.arange(t).repeat(n), prefixes.reshape(n * t, t), marked)
        logp = torch.log_softmax(self.logits(feats), -1).view(n, t, self.problem.vocab)
        return logp.gather(-1, seqs[..., None]).squeeze(-1)

    def flat_params(self) -> list[Tensor]:
        return list(self.parameters())

    @property
    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def table_logp(problem: Problem, table: Tensor, prompts: Tensor, seqs: Tensor) -> Tensor:
    """[N, T] log pi of ``seqs`` [N, T] read from a ``log_table`` [P, S, V]."""
    return table[prompts[:, None], problem.states(seqs), seqs]


@torch.no_grad()
def sample(problem: Problem, table: Tensor, prompts: Tensor, generator: torch.Generator) -> Tensor:
    """[N, T] responses to ``prompts`` [N], drawn from the table's policy."""
    n = prompts.shape[0]
    seqs = torch.empty(n, problem.length, dtype=torch.long)
    code = torch.zeros(n, dtype=torch.long)
    for t in range(problem.length):
        probs = table[prompts, problem.offsets[t] + code].exp()
        seqs[:, t] = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        code = code * problem.vocab + seqs[:, t]
    return seqs


def sequence_logp(problem: Problem, table: Tensor) -> Tensor:
    """[P, V^T] log pi(y | x) of every response to every prompt."""
    seqs = problem.all_sequences
    states = problem.states(seqs)  # [V^T, T]
    return table[:, states, seqs].sum(-1)


def exact_objective(problem: Problem, table: Tensor) -> tuple[Tensor, Tensor]:
    """``(J, p)``: ``J = (1/P) sum_x sum_y pi(y|x) r(x, y)`` and [P] each prompt's accuracy."""
    accuracy = (sequence_logp(problem, table).exp() * problem.all_rewards).sum(-1)
    return accuracy.mean(), accuracy


def flat_grad(value: Tensor, policy: TinyPolicy, retain_graph: bool = False) -> Tensor:
    """[D] the gradient of a scalar with respect to every parameter, flattened."""
    grads = torch.autograd.grad(value, policy.flat_params(), retain_graph=retain_graph, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                      for g, p in zip(grads, policy.flat_params())])


def exact_gradient(policy: TinyPolicy) -> Tensor:
    """[D] the true gradient of J at the policy's weights, every sequence enumerated."""
    objective, _ = exact_objective(policy.problem, policy.log_table())
    return flat_grad(objective, policy)
