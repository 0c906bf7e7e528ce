"""``python -m ibpo_lit export --ckpt_path CKPT --output_dir DIR [--push_to_hub REPO]``.

Writes a checkpoint's trained policy (a single file or a sharded checkpoint's folder; LoRA
adapters merged) as a Hugging Face model folder: safetensors, config, generation config,
tokenizer and chat template (`ibpo_lit.models.export`). With ``--push_to_hub`` the folder is
uploaded afterwards; a push that fails (offline, not logged in, no access) ends with one
``ibpo-lit: error:`` line saying the folder is written and how to push it later, exit status 2
(``IBPO_LIT_DEBUG=1``: the traceback).
"""
from __future__ import annotations

import argparse
import sys

from ibpo_lit.errors import HubPushError, debug_enabled, format_user_error
from ibpo_lit.models.export import check_repo_id, export, push_to_hub


def export_main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (the command line after ``export``), export, print the folder (and push it).
    Returns the exit status: 0, or 2 with one ``ibpo-lit: error: ...`` line for a bad checkpoint,
    folder or repository id, or a push that failed."""
    parser = argparse.ArgumentParser(
        prog="python -m ibpo_lit export",
        description="Write a checkpoint's trained policy as a Hugging Face model folder "
        "(safetensors, config, tokenizer, chat template) that transformers and vLLM load.",
    )
    parser.add_argument("--ckpt_path", required=True, help="a last.ckpt file, or a sharded checkpoint's folder")
    parser.add_argument("--output_dir", required=True, help="the folder to write (must be empty or new)")
    parser.add_argument("--model", default=None,
                        help="the model the run started from (default: the checkpoint's model.model)")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="weights' dtype (default: the run's model.dtype)")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty output_dir")
    parser.add_argument("--push_to_hub", default=None, metavar="REPO", help="also upload the folder as this hub model")
    parser.add_argument("--private", action="store_true", help="with --push_to_hub: a private repository")
    args = parser.parse_args(sys.argv[2:] if argv is None else argv)
    try:
        if args.push_to_hub:
            check_repo_id(args.push_to_hub)  # a bad name fails before the export's work
        folder = export(args.ckpt_path, args.output_dir, args.model, args.dtype, args.overwrite)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"ibpo-lit: error: {err}", file=sys.stderr)
        return 2
    print(folder)
    if args.push_to_hub:
        try:
            print(push_to_hub(folder, args.push_to_hub, args.private))
        except HubPushError as err:
            if debug_enabled():
                raise
            sys.stdout.flush()
            print(format_user_error(err), file=sys.stderr)
            return 2
    return 0
