"""The shared memory a SIGKILLed tensor-parallel vLLM run leaves in /dev/shm is removed before the
next engine starts, unless a live process maps it (issue 31: a killed FSDP2 + vLLM TP2 run could
not be resumed: `create shm in SHMManager failed. errno: 17`; tests/scale/test_sharded_resume.py
resumes one right after the kill)."""
from __future__ import annotations

import mmap

from ibpo_lit.rollout.vllm_cpu_shm import remove_stale_segments


def _segment(folder, name: str):
    path = folder / name
    path.write_bytes(b"\0" * 4096)
    return path


def test_only_unmapped_segments_of_vllm_are_removed(tmp_path):
    stale = [_segment(tmp_path, f"-tp:0-[0-1]-cpushm_{rank}") for rank in (0, 1)]
    mapped = _segment(tmp_path, "x-tp:0-[0-1]-cpushm_2")
    other = _segment(tmp_path, "psm_1234")  # not vLLM's
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096):  # a live engine holds it
        removed = remove_stale_segments(str(tmp_path))
    assert removed == sorted(str(p) for p in stale)
    assert not any(p.exists() for p in stale) and mapped.exists() and other.exists()
    assert remove_stale_segments(str(tmp_path)) == [str(mapped)]  # unmapped now
    assert remove_stale_segments(str(tmp_path)) == []
