"""Tasks: what kind of problem a prompt is, and everything that follows from it.

A `Task` owns, in one place, what data, training, validation and evaluation each used to decide
by comparing a task's name: the instruction appended to a problem, whether a record needs a gold
answer, how a correction prompt (METHOD section 5) shows the candidates and what it asks for,
the final answer a sample votes with (maj@k), the verifier that scores it and the pool that runs
that verifier with its limits. Everything else looks a task up by name (``get_task``) and asks it;
nothing outside this module branches on a task's name.

Built in (``TASKS``):
- ``math``: answer-style problems; the gold is the final answer; math-verify scores in worker
  processes killed past the reward timeout (`RewardPool`).
- ``code``: programming problems; the gold is a test spec (`CodeTests.to_gold()`); the program
  (the response's last python block) runs in the sandbox, bounded by each test's own limits
  (`SandboxPool`), and a correction prompt shows the candidates' programs as code blocks.
- ``custom``: answer-style problems scored only by reward functions of your own (import paths):
  records need no gold, and the task has no verifier of its own.

A task of your own: subclass `AnswerTask` or `ProgramTask` (or `Task`) and register an instance,
``TASKS.register("name")(MyTask(...))``, in a module your config imports.

Which task a run's data is follows from its rewards (`task_for_rewards`, linked by the command
line from ``model.reward(s)`` to ``data.task``), so the rewards are the one setting.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

from ibpo_lit.registry import Registry
from ibpo_lit.rewards.code import CodeResult, extract_code
from ibpo_lit.rewards.functions import is_import_path, model_scored_kind
from ibpo_lit.rewards.pool import RewardPool
from ibpo_lit.rewards.sandbox.pool import UNSCORABLE, SandboxPool

ANSWER_INSTRUCTION = "Think step by step, then give the final answer after ####."
CODE_INSTRUCTION = "Write your solution in Python, in a single ```python code block."

# Correction prompts: the compare-and-correct wording (k = 2) and the self-revision one
# (``reference: none``, k = 1), for answers and for programs. Configurable per run
# (``algorithm.ibpo.template`` and the rest); these are the defaults.
COMPARE_TEMPLATE = (
    "You are given two candidate solutions to the same problem. Compare them step by step, "
    "identify any inconsistencies or errors, and then produce a corrected solution and final answer."
)
REVISE_TEMPLATE = (
    "You are given a candidate solution to a problem. Check it step by step, identify any errors, "
    "and then produce a corrected solution and final answer."
)
CORRECTION_ANSWER_INSTRUCTION = "End with the final answer in the format the problem asks for."
CODE_COMPARE_TEMPLATE = (
    "You are given two candidate Python solutions to the same programming problem. Compare them step "
    "by step, identify any bugs or inconsistencies, and then write a corrected solution in a single "
    "```python code block."
)
CODE_REVISE_TEMPLATE = (
    "You are given a candidate Python solution to a programming problem. Check it step by step, "
    "identify any bugs, and then write a corrected solution in a single ```python code block."
)

Pool = Union[RewardPool, SandboxPool]


@dataclass(frozen=True)
class CorrectionWording:
    """The correction prompts' configurable wording (``algorithm.ibpo``), for both kinds of task:
    a task takes the fields of its own kind."""

    template: str = COMPARE_TEMPLATE
    code_template: str = CODE_COMPARE_TEMPLATE
    answer_instruction: Optional[str] = None  # unset: the prompt's own instruction, else a generic one
    self_revision_template: str = REVISE_TEMPLATE
    self_revision_code_template: str = CODE_REVISE_TEMPLATE


@dataclass(frozen=True)
class Judged:
    """Verdicts on a batch of samples: ``scores`` 1.0 / 0.0 / None (unscorable); for programs
    also the share of tests passed and the sandbox's status of each run (else None)."""

    scores: list[Optional[float]]
    test_fracs: Optional[list[Optional[float]]] = None
    statuses: Optional[list[str]] = None


class Task:
    """One kind of problem. Subclasses say how a correction prompt reads and how samples are judged.

    Attributes:
        name: Its name in ``TASKS`` (``Prompt.task``, ``data.task``).
        reward: The built-in verifier (a name in ``ibpo_lit.rewards.REWARDS``) that scores it;
            None when only reward functions of your own do.
        instruction: Appended to every problem when the data sets none.
        needs_gold: Whether every record must carry a gold answer.
        runs_programs: Whether its gold is a test spec the sandbox runs (code benchmarks'
            records, ``data.code_format``).
    """

    name: str = ""
    reward: Optional[str] = None
    instruction: str = ANSWER_INSTRUCTION
    needs_gold: bool = True
    runs_programs: bool = False

    def correction_text(self, wording: CorrectionWording, problem: str, attempt: str,
                        reference: Optional[str], instruction: Optional[str]) -> str:
        """The user message of ``x~ = (x; y_i, y_ref)``, or of ``(x; y_i)`` when ``reference``
        is None (the self-revision prompt of ``reference: none``)."""
        raise NotImplementedError

    def final_answer(self, completion: str) -> Optional[str]:
        """The answer a sample votes with (maj@k); None: it has none to vote with."""
        return None

    def scoring_pool(self, workers: int, timeout_s: float, batch_size: Optional[int] = None) -> Pool:
        """The pool that runs this task's verifier, the same in training and in evaluation."""
        if self.reward is None:
            raise ValueError(f"task {self.name!r} has no verifier of its own: it is scored by model.reward(s)")
        return RewardPool(self.reward, num_workers=workers, timeout_s=timeout_s, batch_size=batch_size)

    def judge(self, pool: Pool, pairs: Sequence[tuple[str, str]]) -> Judged:
        """Verdicts on ``(completion, gold)`` pairs through ``pool`` (from `scoring_pool`)."""
        return Judged(scores=list(pool.score(pairs)))


class AnswerTask(Task):
    """A problem with a final answer: candidates are quoted whole, and the correction is asked
    to state its answer in the problem's format."""

    def __init__(self, name: str, reward: Optional[str], needs_gold: bool = True,
                 instruction: str = ANSWER_INSTRUCTION) -> None:
        self.name, self.reward, self.needs_gold, self.instruction = name, reward, needs_gold, instruction

    def correction_text(self, wording, problem, attempt, reference, instruction):
        answer = wording.answer_instruction or instruction or CORRECTION_ANSWER_INSTRUCTION
        if reference is None:
            return f"{wording.self_revision_template}\n\nProblem:\n{problem}\n\nCandidate solution:\n{attempt}\n\n{answer}"
        return (
            f"{wording.template}\n\nProblem:\n{problem}\n\n"
            f"Candidate solution 1:\n{attempt}\n\nCandidate solution 2:\n{reference}\n\n{answer}"
        )

    def final_answer(self, completion: str) -> Optional[str]:
        from ibpo_lit.rewards.answers import extract_answer  # sympy's printing: loaded when voting

        return extract_answer(completion)


class ProgramTask(Task):
    """A programming problem: the gold is a test spec; a candidate is shown as its program (the
    response's last python block), and a sample is correct when every test passes."""

    runs_programs = True

    def __init__(self, name: str, reward: str, instruction: str = CODE_INSTRUCTION) -> None:
        self.name, self.reward, self.instruction = name, reward, instruction

    def correction_text(self, wording, problem, attempt, reference, instruction):
        def block(text: str) -> str:
            return f"```python\n{extract_code(text).rstrip()}\n```"

        if reference is None:
            return f"{wording.self_revision_code_template}\n\nProblem:\n{problem}\n\nCandidate solution:\n{block(attempt)}"
        return (
            f"{wording.code_template}\n\nProblem:\n{problem}\n\n"
            f"Candidate solution 1:\n{block(attempt)}\n\n"
            f"Candidate solution 2:\n{block(reference)}"
        )

    def scoring_pool(self, workers: int, timeout_s: float, batch_size: Optional[int] = None) -> Pool:
        # Each program is bounded by its own tests' limits and the judge's watchdog: a worker
        # process around it would add a second, competing clock (and `RewardPool` refuses it).
        return CodeSandboxPool(num_workers=workers)

    def judge(self, pool: Pool, pairs: Sequence[tuple[str, str]]) -> Judged:
        verdicts = [code_verdict(result) for result in pool.run(list(pairs))]
        scores, fracs, statuses = (list(column) for column in zip(*verdicts)) if verdicts else ([], [], [])
        return Judged(scores, fracs, statuses)


class CodeSandboxPool(SandboxPool):
    """The sandbox pool with the scoring pools' signature (the code reward reads only the gold)."""

    def score(self, pairs, prompts=None, columns=None) -> list[Optional[float]]:
        return super().score(pairs)


def code_verdict(result: Optional[CodeResult]) -> tuple[Optional[float], Optional[float], str]:
    """``(score, fraction of tests passed, status)`` of one sandbox run; None: unscorable.

    The score is 1.0 only when every test passed, the binary reward of METHOD section 1.
    """
    if result is None:
        return None, None, UNSCORABLE
    return (1.0 if result.passed == result.total else 0.0), result.fraction, result.status


TASKS = Registry("task")
TASKS.register("math")(AnswerTask("math", reward="math"))
TASKS.register("code")(ProgramTask("code", reward="code"))
TASKS.register("custom")(AnswerTask("custom", reward=None, needs_gold=False))
CUSTOM_TASK = "custom"  # the task of data scored only by reward functions of your own
DEFAULT_TASK = "math"  # your own data without a task: answer-style, scored by math-verify


def get_task(name: str) -> Task:
    """The task registered as ``name``; a ValueError listing the valid names otherwise."""
    return TASKS.get(name)


def task_of_reward(reward: str) -> Optional[Task]:
    """The task whose verifier ``reward`` is (None: an import path, or a reward no task owns)."""
    return next((task for task in (TASKS[n] for n in TASKS.names()) if task.reward == reward), None)


def scoring_pool(reward: str, num_workers: int = 1, timeout_s: float = 5.0, batch_size: Optional[int] = None,
                 import_modules: Optional[list[str]] = None) -> Pool:
    """The pool training and evaluation score ``reward`` with: its task's (the sandbox for
    code), else worker processes that call it (`RewardPool`, killed past ``timeout_s``; their
    workers import ``import_modules`` first, for rewards registered outside ``ibpo_lit``)."""
    task = task_of_reward(reward)
    if task is not None:
        return task.scoring_pool(num_workers, timeout_s, batch_size)
    return RewardPool(reward, num_workers=num_workers, timeout_s=timeout_s, import_modules=import_modules,
                      batch_size=batch_size)


def task_for_rewards(reward: Optional[str], rewards: Optional[Sequence] = None) -> str:
    """``data.task`` from the rewards (linked by the command line): a task whose records are run
    as programs wins when its verifier is among the rewards (the prompts and corrections are
    then code prompts); ``custom`` when every reward is your own, an import path or a model
    (``reward_model:``, ``judge:``; records may lack an answer); otherwise the task of the single
    built-in reward, or ``math``."""
    names = [reward] if rewards is None else [_name_of(r) for r in rewards]
    names = [n if n is not None else DEFAULT_TASK for n in names] or [DEFAULT_TASK]
    owners = [task_of_reward(n) if isinstance(n, str) else None for n in names]
    program = next((t for t in owners if t is not None and t.runs_programs), None)
    if program is not None:
        return program.name
    if all(isinstance(n, str) and (is_import_path(n) or model_scored_kind(n) is not None) for n in names):
        return CUSTOM_TASK
    if len(owners) == 1 and owners[0] is not None:
        return owners[0].name
    return DEFAULT_TASK


def _name_of(reward) -> Optional[str]:
    """A reward's name as the parser holds it: a `RewardSpec`, a dict, or a jsonargparse
    Namespace (``init_args.name`` while parsing)."""
    reward = getattr(reward, "init_args", reward)
    return reward.get("name") if isinstance(reward, dict) else getattr(reward, "name", None)
