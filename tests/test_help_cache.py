"""A plain help request (issue 30, item 5): rendered once with Lightning, then printed from the
cache without importing torch or Lightning; anything that changes the text changes the key."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ibpo_lit import help_cache
from ibpo_lit.help_cache import help_path, is_plain_help

REPO = Path(__file__).resolve().parent.parent
# Prints the help, then (on stderr) whether torch and Lightning were imported to print it.
PROBE = ("import sys; from ibpo_lit.__main__ import entry_point; code = entry_point(sys.argv[1:]); "
         "print('torch' in sys.modules, 'lightning' in sys.modules, code, file=sys.stderr)")


def _help(cache: Path, *argv: str) -> tuple[str, str]:
    env = {**os.environ, "IBPO_LIT_CACHE": str(cache), "COLUMNS": "100",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """``rendered(*argv) -> (cache, text, imported)``: the help as the parser renders it into an
    empty cache, once per request for the module (each render imports Lightning: seconds)."""
    done = {}

    def render(*argv: str):
        if argv not in done:
            cache = tmp_path_factory.mktemp("help_cache")
            done[argv] = (cache, *_help(cache, *argv))
        return done[argv]

    return render


@pytest.mark.parametrize("argv", [["--help"], ["fit", "--help"]])
def test_help_is_rendered_once_then_printed_without_torch(rendered, argv):
    cache, first, imported = rendered(*argv)
    assert imported == "True True 0" and "usage:" in first
    if argv[0] == "fit":
        assert "--model.algorithm.ibpo.variant" in first and "--trainer.precision" in first
    again, imported = _help(cache, *argv)
    assert imported == "False False 0" and again == first


def test_a_run_keeps_the_help_it_would_print(tmp_path, rendered):
    # The quick start's `fit` builds the same parser: after it, `--help` needs no Lightning.
    _help(tmp_path, "fit", "--config", str(REPO / "configs" / "tiny.yaml"), "--trainer.max_steps", "1",
          "--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.enable_progress_bar", "false")
    for argv in (["--help"], ["fit", "--help"], ["validate", "--help"]):
        kept, imported = _help(tmp_path, *argv)
        assert imported == "False False 0", argv
        assert kept == rendered(*argv)[1], argv  # as the parser renders it into an empty cache


def test_only_plain_help_requests_are_kept():
    assert is_plain_help(["--help"]) and is_plain_help(["-h"]) and is_plain_help(["fit", "--help"])
    assert is_plain_help(["validate", "-h"])
    assert not is_plain_help(["fit", "--config", "c.yaml", "--help"])  # shows c.yaml's values as defaults
    assert not is_plain_help(["evaluate", "--help"]) and not is_plain_help([])


def test_the_key_follows_the_sources_the_width_and_the_arguments(tmp_path, monkeypatch):
    source = tmp_path / "src" / "a.py"
    source.parent.mkdir()
    source.write_text("x = 1\n")
    monkeypatch.setattr(help_cache, "SOURCES", (source.parent,))
    monkeypatch.setenv("IBPO_LIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "100")
    key = help_path(["fit", "--help"])
    assert key.parent == tmp_path / "cache" / "help" and key == help_path(["fit", "--help"])
    assert help_path(["--help"]) != key
    os.utime(source, ns=(0, source.stat().st_mtime_ns + 1))  # an edited checkout
    edited = help_path(["fit", "--help"])
    assert edited != key
    monkeypatch.setenv("COLUMNS", "80")
    assert help_path(["fit", "--help"]) != edited


def test_one_text_is_kept_per_request(tmp_path, monkeypatch):
    monkeypatch.setenv("IBPO_LIT_CACHE", str(tmp_path))
    for width in ("80", "100", "120"):
        monkeypatch.setenv("COLUMNS", width)
        help_cache.keep_help(["fit", "--help"], f"at {width}")
        help_cache.keep_help(["--help"], f"top at {width}")
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "help").iterdir()) == ["fit", "help"]
    assert help_cache.kept_help(["fit", "--help"]) == "at 120"


def test_an_unwritable_cache_costs_only_the_speed(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("IBPO_LIT_CACHE", str(blocker))  # a file where the folder would be
    help_cache.keep_help(["--help"], "text")
    assert help_cache.kept_help(["--help"]) is None
