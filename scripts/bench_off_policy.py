"""Step time, synchronous against one step off-policy, with the engine in its own process
(issue 44 item 5, the CPU part): the quick-start task on SmolLM2-135M with its real rewards.

    python scripts/bench_off_policy.py --max-steps 2 --out results/bench_off_policy/steps2
    python scripts/bench_off_policy.py --max-steps 16 --out results/bench_off_policy/steps16

One invocation: a vLLM server on the model's files (``python -m vllm.entrypoints.openai.api_server``
as `ibpo_lit.rollout.vllm_server.serve_command` starts it, fp32, a process group of its own),
then two fits of ``configs/smollm2_135m_cpu.yaml`` (``python -m ibpo_lit fit``), one after the
other, never at once (their times would mix), both ``model.rollout.backend: vllm_server`` on that
server, the same steps and seed: ``max_staleness: 0`` (synchronous: generate, score, correct,
update, sync) and ``max_staleness: 1`` (the next step's rollouts generated, scored and corrected
in a thread during the update). Both arms add ``callbacks.VLLMWeightSync`` (the server needs a
sync after every update) and `StepWallClock`, which writes every step's wall time (from the end
of the step before, or the step's start for the first: the weight sync after the update and the
checkpoint included) and the metrics the step logged.

Writes under ``--out``: ``<arm>/steps.jsonl`` (per step: ``wall_s``, ``generate_s``,
``update_s``, the overlap's timestamps ``time/*`` for the off-policy arm, ``reward``,
``response_len``, ``sync_s``), ``<arm>/fit.log``, ``server.log``, ``summary.json`` /
``summary.md`` and ``curves.png`` (both arms' reward, response length and step time per step, on
one step axis): each arm's medians (over every step, and over the steps after the first, which
in the off-policy arm samples its own batch before it can overlap anything), the ratio of the
medians, the device (CPU model, cores, the load average before and after: other people's work
shares the machine), the date, the commit.

``--replot DIR`` draws ``summary.md`` and ``curves.png`` again from ``DIR/summary.json``, running
nothing. ``--omp-wait-policy PASSIVE`` sets ``OMP_WAIT_POLICY`` for the server and both fits
(OpenMP threads then sleep when idle instead of spinning, which matters where the engine and the
trainer share the cores); the OpenMP settings each run had are kept in ``summary.json``.

On a 2-core CPU the engine, the reward workers and the trainer share the same 2 cores: the
overlap can only hide what one side leaves idle. What the numbers show is that, not a GPU's gain.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "smollm2_135m_cpu.yaml"
MODEL = "smollm2-135m-instruct"
ARMS = (("sync", 0), ("off_policy", 1))
START_S = 900  # the server's start on two busy cores


class StepWallClock(L.Callback):
    """Each step's wall time and logged metrics, one JSON line a step (rank 0). Last in the
    callback list, so its ``on_train_batch_end`` comes after the weight sync's."""

    def __init__(self, path: str):
        self.path = path
        self.last_end: float | None = None
        self.step_start = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.step_start = time.time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        now = time.time()
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        # the weight sync logs straight to the loggers, not to callback_metrics: read the callback's
        sync = next((cb for cb in trainer.callbacks if callable(getattr(cb, "sync_engine", None))), None)
        record = {"step": trainer.global_step - 1, "start": self.step_start, "end": now,
                  "wall_s": now - (self.last_end if self.last_end is not None else self.step_start),
                  "sync_s": sync.last_seconds if sync is not None else None, "metrics": metrics}
        self.last_end = now
        if trainer.global_rank == 0:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(out: Path) -> tuple[subprocess.Popen, str]:
    import requests

    from ibpo_lit.models.loading import model_files
    from ibpo_lit.rollout.vllm_server import launch, serve_command

    port = _free_port()
    argv, env = serve_command(model_files(MODEL), port, dtype="float32", max_model_len=2048, on_gpu=False)
    process = launch(argv, env, str(out / "server.log"))
    url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    while True:
        if process.poll() is not None:
            raise SystemExit(f"the vLLM server exited ({process.returncode}): see {out / 'server.log'}")
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return process, url
        except requests.RequestException:
            pass
        if time.monotonic() - start > START_S:
            _stop(process)
            raise SystemExit(f"the vLLM server did not start in {START_S} s")
        time.sleep(2)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _callbacks(steps_file: Path) -> str:
    """The quick-start config's callbacks, then the weight sync and the clock."""
    import yaml

    config = yaml.safe_load(CONFIG.read_text())
    return json.dumps([*config["trainer"]["callbacks"], {"class_path": "callbacks.VLLMWeightSync"},
                       {"class_path": "bench_off_policy.StepWallClock", "init_args": {"path": str(steps_file)}}])


def _fit(arm: str, max_staleness: int, url: str, steps: int, seed: int, out: Path, work: Path) -> None:
    root = out / arm
    root.mkdir(parents=True, exist_ok=True)
    steps_file = root / "steps.jsonl"
    steps_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "ibpo_lit", "fit", "--config", str(CONFIG), "--seed_everything", str(seed),
           "--trainer.max_steps", str(steps), "--trainer.default_root_dir", str(work / arm),
           "--trainer.enable_progress_bar", "false", "--trainer.callbacks", _callbacks(steps_file),
           "--model.rollout.backend", "vllm_server", "--model.rollout.vllm.server.url", url,
           "--model.rollout.max_staleness", str(max_staleness)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "scripts"),
                                                         os.environ.get("PYTHONPATH", "")])}
    with open(root / "fit.log", "w") as log:
        subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)


def _step_rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        m = record["metrics"]
        off = "timing/ahead_generate_s" in m
        rows.append({
            "step": record["step"], "wall_s": record["wall_s"], "start": record["start"], "end": record["end"],
            # generation: this step's own (on-policy) or the producer's, of the next step (off-policy)
            "generate_s": m.get("timing/ahead_generate_s" if off else "timing/generate_s"),
            "correct_s": m.get("timing/ahead_correct_s" if off else "timing/correct_s"),
            "update_s": m.get("timing/update_s"), "step_s": m.get("timing/step_s"),
            "ahead_wait_s": m.get("timing/ahead_wait_s"), "rollouts_s": m.get("timing/rollouts_s"),
            "sync_s": record.get("sync_s"), "staleness": m.get("rollout/staleness"),
            # outside training_step: the weight sync, its probe, a checkpoint, Lightning's loop
            "outside_step_s": record["wall_s"] - m["timing/step_s"] if "timing/step_s" in m else None,
            **{k: v for k, v in m.items() if k.startswith("time/")},
            "reward": m.get("train/reward"), "response_len": m.get("train/response_len"),
        })
    return rows


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def _summary_of(rows: list[dict]) -> dict:
    keys = ("wall_s", "step_s", "generate_s", "correct_s", "update_s", "ahead_wait_s", "sync_s", "outside_step_s",
            "time/overlap_s")
    return {"steps": len(rows), "median": {k: _median(rows, k) for k in keys},
            "median_after_first": {k: _median(rows[1:], k) for k in keys},
            "total_wall_s": sum(r["wall_s"] for r in rows),
            "reward": [r["reward"] for r in rows], "response_len": [r["response_len"] for r in rows],
            "wall_s": [r["wall_s"] for r in rows]}


def _device() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "platform": platform.platform()}


def openmp_settings(environ) -> dict:
    """The OpenMP variables the server and the fits inherited (None: unset, the runtime's default)."""
    return {key: environ.get(key) for key in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")}


def _commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "ibpo_lit", "callbacks", "scripts/bench_off_policy.py"],
                           cwd=REPO, capture_output=True, text=True).stdout
    return head.strip() + (" (+ uncommitted changes)" if dirty.strip() else "")


def _openmp_line(summary: dict) -> str:
    """The run's OpenMP settings, where it kept them (runs before the flag did not)."""
    settings = {k: v for k, v in summary.get("openmp", {}).items() if v is not None}
    return f" OpenMP: {', '.join(f'{k}={v}' for k, v in settings.items())}." if settings else ""


def _markdown(summary: dict) -> str:
    lines = [f"# One step off-policy vs synchronous, {summary['steps']} steps (scripts/bench_off_policy.py)", "",
             f"{summary['date']}, commit {summary['commit']}, {summary['device']['cpu']} ({summary['device']['cores']} "
             f"cores, shared: load average {summary['load_before']} before, {summary['load_after']} after).",
             f"configs/smollm2_135m_cpu.yaml, seed {summary['seed']}, backend vllm_server (fp32 server in its own "
             "process), both arms one after the other on one server." + _openmp_line(summary), "",
             "| arm | steps | median step (s) | median after step 0 (s) | generate (s) | update (s) | waited for "
             "the thread (s) | overlap (s) | total (s) |", "|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    for arm, s in summary["arms"].items():
        m, a = s["median"], s["median_after_first"]
        lines.append(f"| {arm} | {s['steps']} | {fmt(m['wall_s'])} | {fmt(a['wall_s'])} | {fmt(m['generate_s'])} | "
                     f"{fmt(m['update_s'])} | {fmt(m['ahead_wait_s'])} | {fmt(m['time/overlap_s'])} | "
                     f"{fmt(s['total_wall_s'])} |")
    lines += ["", f"Ratio of the median step times, synchronous / off-policy: {summary['ratio_median']:.3f} "
              f"(steps after the first: {summary['ratio_median_after_first']:.3f})."
              if summary["ratio_median_after_first"] is not None else
              f"Ratio of the median step times, synchronous / off-policy: {summary['ratio_median']:.3f}.", "",
              "| step | sync reward | off-policy reward | sync length | off-policy length |", "|---|---|---|---|---|"]
    sync, off = summary["arms"]["sync"], summary["arms"]["off_policy"]
    def at(values: list, i: int, digits: int) -> str:
        return "-" if i >= len(values) or values[i] is None else f"{values[i]:.{digits}f}"

    for i in range(max(sync["steps"], off["steps"])):
        lines.append(f"| {i} | {at(sync['reward'], i, 3)} | {at(off['reward'], i, 3)} | "
                     f"{at(sync['response_len'], i, 1)} | {at(off['response_len'], i, 1)} |")
    return "\n".join(lines) + "\n"


def _plot(summary: dict, path: Path) -> None:
    """Both arms on one step axis: training reward, mean response length, and step wall time.
    One seed each, so the reward panel shows what happened, not which mode learns faster."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = (("reward", "training reward (train/reward)"), ("response_len", "mean response length (tokens)"),
              ("wall_s", "step wall time (s)"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (key, title) in zip(axes, panels):
        for n, (arm, s) in enumerate(summary["arms"].items()):
            points = [(i, v) for i, v in enumerate(s[key]) if v is not None]
            if points:
                ax.plot([i for i, _ in points], [v for _, v in points], marker="o", ms=3, color=f"C{n}", label=arm)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"scripts/bench_off_policy.py, {summary['steps']} steps, {summary['date']}, commit {summary['commit']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write_reports(summary: dict, out: Path) -> None:
    (out / "summary.md").write_text(_markdown(summary))
    _plot(summary, out / "curves.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=16, help="steps of each arm (the quick start's: 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed_everything of both arms")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bench_off_policy" / "latest")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench_off_policy_runs",
                        help="the fits' default_root_dir (checkpoints, TensorBoard): GBs, kept out of --out")
    parser.add_argument("--omp-wait-policy", choices=("PASSIVE", "ACTIVE"),
                        help="OMP_WAIT_POLICY of the server and both fits (default: the environment's)")
    parser.add_argument("--replot", type=Path, metavar="DIR",
                        help="run nothing: draw DIR/summary.md and DIR/curves.png again from DIR/summary.json")
    args = parser.parse_args(argv)
    if args.replot is not None:
        summary = json.loads((args.replot / "summary.json").read_text())
        for arm, s in summary["arms"].items():  # a summary written before it kept each step's wall time
            if "wall_s" not in s:
                rows = (args.replot / arm / "steps.jsonl").read_text().splitlines()
                s["wall_s"] = [json.loads(line)["wall_s"] for line in rows]
        _write_reports(summary, args.replot)
        return
    if args.omp_wait_policy:  # before the server starts: it and both fits inherit this environment
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)
    commit = _commit()  # at the start: others may commit while the arms run
    process, url = _start_server(out)
    arms = {}
    try:
        for arm, max_staleness in ARMS:  # one after the other: never two fits at once
            print(f"{arm}: max_staleness {max_staleness}, {args.max_steps} steps", flush=True)
            _fit(arm, max_staleness, url, args.max_steps, args.seed, out, args.work.resolve())
            rows = _step_rows(out / arm / "steps.jsonl")
            (out / arm / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            arms[arm] = _summary_of(rows)
    finally:
        _stop(process)
    sync, off = arms["sync"], arms["off_policy"]
    after = (sync["median_after_first"]["wall_s"], off["median_after_first"]["wall_s"])
    summary = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"), "commit": commit, "device": _device(),
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
        "config": str(CONFIG.relative_to(REPO)), "model": MODEL, "steps": args.max_steps, "seed": args.seed,
        "command": " ".join([sys.executable, *sys.argv]), "openmp": openmp_settings(os.environ), "arms": arms,
        "ratio_median": sync["median"]["wall_s"] / off["median"]["wall_s"],
        "ratio_median_after_first": after[0] / after[1] if None not in after else None,
        "note": "2 CPU cores shared by the server, the reward workers and the trainer (and other people's tests): "
                "little overlap is possible; this is what it is.",
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    _write_reports(summary, out)
    print(_markdown(summary))


if __name__ == "__main__":
    main()
