"""Data room: task formats and the DataModule. Records in, prompts + gold out."""
from ibpo_lit.data.arithmetic import ArithmeticConfig, arithmetic_problem
from ibpo_lit.data.datamodule import DEFAULT_INSTRUCTION, PromptDataModule
from ibpo_lit.data.prompt import Prompt, collate_prompts
from ibpo_lit.data.prompt_builder import PromptBuilder, PromptTooLongError
from ibpo_lit.data.records import BadRecordError, Record, RecordFormat, read_records
from ibpo_lit.data.stream import PromptStream, StreamPosition

__all__ = [
    "DEFAULT_INSTRUCTION",
    "ArithmeticConfig",
    "BadRecordError",
    "Prompt",
    "PromptBuilder",
    "PromptDataModule",
    "PromptStream",
    "PromptTooLongError",
    "Record",
    "RecordFormat",
    "StreamPosition",
    "arithmetic_problem",
    "collate_prompts",
    "read_records",
]
