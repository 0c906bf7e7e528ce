"""Our code calls no deprecated API: a tiny fit in which any deprecation whose call site is ours
fails the test, with the helper that decides "ours" tested on its own.

A deprecation is a ``DeprecationWarning``, ``PendingDeprecationWarning`` or ``FutureWarning``
(their subclasses included: Lightning's and jsonargparse's), or a log record at WARNING or above
that says "deprecat" (transformers announces the old KV-cache names through
``logger.warning_once``, not ``warnings``). Its call site is decided from the stack at the moment
it is raised: walk outward from the frame that raised it, past the frames of the library that
raised it and of call machinery that only passes a call through (torch's ``nn.Module.__call__``,
functools, contextlib, PEFT's wrappers, which forward attributes and calls to the base model);
the first frame left is the caller. It is ours when that frame is under ``ibpo_lit/`` or
``callbacks/`` of this checkout (or when the warning was raised from C code called directly by
ours). So transformers warning about ``past_key_values`` that ``ibpo_lit/rollout/hf.py`` passed is
ours; Lightning's own ``LeafSpec`` FutureWarning from torch is not, even when our module called
into Lightning.

Not covered: deprecations raised while importing (before the test starts), and code paths the
fits below do not take (vLLM, FSDP2, evaluation's baselines: their own tests run those paths).
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings
from contextlib import contextmanager
from typing import Iterator, Optional

import pytest
import torch

import ibpo_lit
from ibpo_lit.__main__ import main
from ibpo_lit.models import build_tiny_model
from ibpo_lit.models import hf_compat

REPO = os.path.dirname(os.path.dirname(os.path.abspath(ibpo_lit.__file__)))
OURS = tuple(os.path.join(REPO, d) + os.sep for d in ("ibpo_lit", "callbacks"))
TINY = os.path.join(REPO, "configs", "tiny.yaml")
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)

# Call machinery a call passes through on its way from the caller to the library.
PASS_THROUGH = (
    os.path.join("torch", "nn", "modules", "module.py"),  # Module.__call__ -> _call_impl -> forward
    os.sep + "functools.py",
    os.sep + "contextlib.py",
)
# PEFT's wrappers hand attributes and forward calls to the base model: only those frames pass a
# call through (PEFT's own code, e.g. `get_peft_model` reading a deprecated property, is PEFT's call).
PEFT, PEFT_FORWARDING = os.sep + "peft" + os.sep, ("__getattr__", "forward")
# The frames of the warning and logging machinery themselves, dropped from the inner end.
MACHINERY = tuple(f for f in (warnings.__file__, logging.__file__,
                              getattr(sys.modules.get("_py_warnings"), "__file__", None)) if f)


def library_of(filename: str) -> str:
    """Which library a frame's file belongs to: ``ours`` for this checkout's ``ibpo_lit/`` and
    ``callbacks/``, the top-level package for an installed one (``transformers``), else the
    file itself (a stdlib module, a test file)."""
    if filename.startswith(OURS):
        return "ours"
    parts = filename.split(os.sep)
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            index = len(parts) - 1 - parts[::-1].index(marker)
            return parts[index + 1] if index + 1 < len(parts) else filename
    return filename


def passes_through(frame: traceback.FrameSummary) -> bool:
    """Whether a frame only hands a call on (module call machinery, a PEFT forwarder)."""
    if any(p in frame.filename for p in PASS_THROUGH):
        return True
    return PEFT in frame.filename and frame.name in PEFT_FORWARDING


def call_site(stack: list[traceback.FrameSummary]) -> Optional[traceback.FrameSummary]:
    """The frame that called the library which raised a warning. ``stack`` is outermost first
    and ends with the frame that raised it (the warning machinery already removed)."""
    if not stack:
        return None
    if library_of(stack[-1].filename) == "ours":  # raised by ours, or by C code ours called directly
        return stack[-1]
    raiser = library_of(stack[-1].filename)
    for frame in reversed(stack):
        if library_of(frame.filename) == raiser or passes_through(frame):
            continue
        return frame
    return None


def is_ours(stack: list[traceback.FrameSummary]) -> bool:
    site = call_site(stack)
    return site is not None and library_of(site.filename) == "ours"


def _stack_outside_machinery() -> list[traceback.FrameSummary]:
    """The current stack, outermost first, without this module's hooks and the warning/logging
    machinery at its inner end."""
    stack = traceback.extract_stack()
    while stack and (stack[-1].filename == __file__ or stack[-1].filename in MACHINERY):
        stack.pop()
    return stack


def _where(stack: list[traceback.FrameSummary]) -> str:
    site = call_site(stack)
    return f"{os.path.relpath(site.filename, REPO)}:{site.lineno}" if site else "?"


@contextmanager
def our_deprecations() -> Iterator[list[str]]:
    """Collects, as ``"<category>: <message> (from <file>:<line>)"``, every deprecation raised
    inside the block whose call site is ours. Other warnings are shown as usual.

    Every deprecation is let through while the block runs (``always``, whatever filters the
    process has set and whichever were already raised once), and transformers' once-only log
    cache is emptied first, so a warning another test raised earlier is raised again here."""
    found: list[str] = []
    original_showwarning = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, DEPRECATIONS):
            stack = _stack_outside_machinery()
            if is_ours(stack):
                found.append(f"{category.__name__}: {message} (from {_where(stack)})")
            return
        original_showwarning(message, category, filename, lineno, file, line)

    class Deprecations(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            # A record that reaches both loggers (propagation on) counts once; it reaches them
            # one right after the other, so the last record is enough (and, held, is not reused).
            self.last: Optional[logging.LogRecord] = None

        def emit(self, record: logging.LogRecord) -> None:
            if record is self.last:
                return
            self.last = record
            if record.levelno >= logging.WARNING and "deprecat" in record.getMessage().lower():
                stack = _stack_outside_machinery()
                if is_ours(stack):
                    found.append(f"log {record.name}: {record.getMessage()} (from {_where(stack)})")

    from transformers.utils import logging as hf_logging

    for once in (getattr(hf_logging, "warning_once", None), getattr(hf_logging, "info_once", None)):
        if hasattr(once, "cache_clear"):
            once.cache_clear()
    handler = Deprecations()
    # transformers' library logger does not propagate to the root logger: it needs its own handler.
    loggers = [logging.getLogger(), logging.getLogger("transformers")]
    with warnings.catch_warnings():
        for category in DEPRECATIONS:
            warnings.simplefilter("always", category)
        warnings.showwarning = showwarning  # catch_warnings restores it
        for logger in loggers:
            logger.addHandler(handler)
        try:
            yield found
        finally:
            for logger in loggers:
                logger.removeHandler(handler)


# ------------------------------------------------------------------ deciding the call site
def frames(*entries) -> list[traceback.FrameSummary]:
    """Frames, outermost first: each a file name, or a ``(file name, function name)`` pair."""
    pairs = [(e, "f") if isinstance(e, str) else e for e in entries]
    return [traceback.FrameSummary(file, 1, name) for file, name in pairs]


SITE = os.path.join(os.sep, "env", "lib", "python3.11", "site-packages")
OUR_HF = os.path.join(REPO, "ibpo_lit", "rollout", "hf.py")
OUR_MAIN = os.path.join(REPO, "ibpo_lit", "__main__.py")
TEST = os.path.join(REPO, "tests", "test_x.py")


def test_call_site_is_the_first_frame_outside_the_warning_library_and_call_machinery():
    # hf.py calls model(...): torch's Module.__call__, then transformers' forward wrapper warns.
    passed_kwarg = frames(TEST, OUR_HF, f"{SITE}/torch/nn/modules/module.py", f"{SITE}/torch/nn/modules/module.py",
                          f"{SITE}/transformers/utils/generic.py", f"{SITE}/transformers/utils/deprecation.py")
    assert call_site(passed_kwarg).filename == OUR_HF and is_ours(passed_kwarg)
    # Through a PEFT wrapper's attribute forwarding to transformers' deprecated property.
    via_peft = frames(OUR_HF, (f"{SITE}/peft/peft_model.py", "__getattr__"),
                      (f"{SITE}/peft/tuners/tuners_utils.py", "__getattr__"), f"{SITE}/transformers/modeling_utils.py")
    assert is_ours(via_peft)
    # PEFT's own code reading it while our lora.py wraps a model: PEFT's call, not ours.
    peft_reads = frames(os.path.join(REPO, "ibpo_lit", "models", "lora.py"),
                        (f"{SITE}/peft/mapping_func.py", "get_peft_model"), (f"{SITE}/peft/peft_model.py", "__init__"),
                        f"{SITE}/transformers/modeling_utils.py")
    assert call_site(peft_reads).name == "__init__" and not is_ours(peft_reads)
    # Our module called Lightning, Lightning called torch's deprecated LeafSpec: Lightning's call.
    lightning_calls_torch = frames(OUR_MAIN, f"{SITE}/lightning/pytorch/trainer/trainer.py",
                                   f"{SITE}/lightning/pytorch/utilities/_pytree.py", f"{SITE}/torch/utils/_pytree.py")
    assert call_site(lightning_calls_torch).filename.endswith("lightning/pytorch/utilities/_pytree.py")
    assert not is_ours(lightning_calls_torch)
    # LightningCLI (subclassed in our __main__) calling jsonargparse's deprecated API.
    cli = frames(OUR_MAIN, f"{SITE}/lightning/pytorch/cli.py", f"{SITE}/jsonargparse/_deprecated.py")
    assert not is_ours(cli)
    # A warning raised by C code our frame called directly (no Python frame of the library).
    assert is_ours(frames(TEST, OUR_HF))
    # A test calling transformers itself is not ours.
    assert not is_ours(frames(TEST, f"{SITE}/transformers/modeling_utils.py"))


def _fake_module(path: str, source: str) -> dict:
    """Run ``source`` as if it were the file ``path`` (its frames carry that file name)."""
    namespace: dict = {"__name__": "fake"}
    exec(compile(source, path, "exec"), namespace)  # noqa: S102 - test code we write here
    return namespace


def test_capture_sees_warnings_and_logs_from_our_call_sites_only():
    """The hooks in action: a "library" deprecates a function by warning and by logging; the
    same call made from a file under ibpo_lit/ is caught (both ways), made from here it is not."""
    library = _fake_module(f"{SITE}/fakelib/api.py", (
        "import logging, warnings\n"
        "def old():\n"
        "    warnings.warn('`old` is deprecated', FutureWarning, stacklevel=2)\n"
        "def old_logged():\n"
        "    logging.getLogger('transformers.fake').warning('`old_logged` is deprecated')\n"
    ))
    ours = _fake_module(os.path.join(REPO, "ibpo_lit", "fake_caller.py"), (
        "def call(f):\n"
        "    return f()\n"
    ))
    with our_deprecations() as found:
        library["old"]()
        library["old_logged"]()
        ours["call"](library["old"])
        ours["call"](library["old"])  # raised at the same place again: still seen
        ours["call"](library["old_logged"])
    assert found == [
        "FutureWarning: `old` is deprecated (from ibpo_lit/fake_caller.py:2)",
        "FutureWarning: `old` is deprecated (from ibpo_lit/fake_caller.py:2)",
        "log transformers.fake: `old_logged` is deprecated (from ibpo_lit/fake_caller.py:2)",
    ]


# ------------------------------------------------------------------ the compatibility module
def test_compat_cache_and_checkpointing_names_work_without_deprecations():
    """``hf_compat`` passes a KV cache and reads it back, and switches activation checkpointing
    on, by the installed transformers' current names (no deprecation from our call sites)."""
    from transformers import DynamicCache

    model = build_tiny_model(seed=0)
    ids = torch.tensor([[5, 6, 7]])
    with our_deprecations() as found, torch.no_grad():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, use_cache=True, **hf_compat.cache_kwargs(cache))
        returned = hf_compat.output_cache(out)
        step = model(input_ids=ids[:, :1], position_ids=torch.tensor([[3]]), use_cache=True,
                     **hf_compat.cache_kwargs(returned))
        assert not hf_compat.is_activation_checkpointing(model)
        hf_compat.enable_activation_checkpointing(model)
        assert hf_compat.is_activation_checkpointing(model)
        assert not hf_compat.is_activation_checkpointing(torch.nn.Linear(2, 2))  # no such switch: off
    assert found == []
    assert returned is cache and returned.get_seq_length() == 4  # the decode step extended the same cache
    assert step.logits.shape == (1, 1, model.config.vocab_size)


def test_compat_checkpointing_through_a_peft_wrapper():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(build_tiny_model(seed=0), peft.LoraConfig(r=2, target_modules=["q_proj"]))
    with our_deprecations() as found:
        assert not hf_compat.is_activation_checkpointing(model)
        hf_compat.enable_activation_checkpointing(model)
        assert hf_compat.is_activation_checkpointing(model)
    assert found == []


# ------------------------------------------------------------------ a tiny fit
def fit(root, *overrides: str):
    sys.argv = sys.argv[:1]  # LightningCLI warns when it sees pytest's own arguments
    return main(["fit", "--config", TINY, "--trainer.max_steps", "2", "--trainer.default_root_dir", str(root),
                 "--trainer.enable_progress_bar", "false", *overrides])


@pytest.mark.usefixtures("one_intra_op_thread")
@pytest.mark.parametrize("overrides", [
    pytest.param((), id="tiny"),
    # PEFT's forward hands our `cache` keyword on to the base model; the KL reference is the base.
    pytest.param(("--model.lora.r", "4", "--model.algorithm.beta_kl", "0.1"), id="lora-kl"),
    pytest.param(("--model.gradient_checkpointing", "true", "--model.algorithm.beta_kl", "0.1",
                  "--model.rollout.sampling.repetition_penalty", "1.2"), id="checkpointing-kl-penalty"),
])
def test_a_tiny_fit_calls_no_deprecated_api(tmp_path, overrides):
    with our_deprecations() as found:
        cli = fit(tmp_path, *overrides)
    assert cli.trainer.global_step == 2
    assert not found, "deprecated APIs called from our code:\n" + "\n".join(sorted(set(found)))
