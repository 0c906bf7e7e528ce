"""Tool-integrated rollouts, assembled: an engine (``rollout``) and the sandboxed interpreter
(``rewards.python_tool``) joined by ``ToolRollouts``. Its own module because neither room may
import the other (docs/architecture.md); training and evaluation both build tool rollouts here."""
from __future__ import annotations

from typing import Callable, Optional

from ibpo_lit.rewards.python_tool import PythonTool
from ibpo_lit.rollout.engine import RolloutEngine
from ibpo_lit.rollout.tools import ToolConfig, ToolRollouts


def with_tools(engine: RolloutEngine, tokenizer, tools: Optional[ToolConfig],
               any_rank: Callable[[bool], bool] = bool) -> RolloutEngine:
    """``engine`` whose rollouts may run Python cells (``tools`` set), else ``engine`` itself.

    The engine must have been built with ``stop_strings=True``. Raises ``SandboxUnavailable``
    where the sandbox cannot run, before any rollout."""
    if tools is None:
        return engine
    tool = PythonTool(timeout_s=tools.timeout_s, memory_mb=tools.memory_mb, workers=tools.workers,
                      max_output_chars=tools.max_output_chars)
    return ToolRollouts(engine, tokenizer, tool, tools, any_rank)
