"""Every bench in one run: `make bench` (as root, after `make setup`).

    .venv/bin/python bench/run.py [--only provision relay ...] [--no-write]

Runs each bench below one after the other (they would skew each other's figures side by side),
collects the figures they record (`bench/report.py`), and prints one table: each figure, its value,
the target it is held to, pass or fail, its value in the last run that measured it, and the command
that produced it. The run is written to `docs/benchmarks/<date>-<time>.md` (and `.json`, which later
runs read), with the machine it ran on. Exits non-zero when a bench failed or a figure
missed its target.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "benchmarks"

# name -> arguments of `python`; the order puts the quick ones first.
BENCHES: dict[str, list[str]] = {
    "missioncontrol": ["bench/missioncontrol.py"],
    "approvals": ["bench/approvals.py"],
    "audit": ["bench/audit.py"],
    "proxmox": ["bench/proxmox.py"],
    "provision_driver": ["bench/provision_driver.py"],
    "provision": ["bench/provision.py"],
    "fleet": ["bench/fleet.py"],
    "density": ["bench/density.py"],
    "egress": ["bench/egress.py"],
    "relay": ["bench/relay.py"],
    "screen": ["bench/screen.py"],
    "viewers": ["bench/viewers.py"],
    "chat": ["bench/chat.py"],
}


@dataclass
class Outcome:
    name: str
    command: str
    returncode: int
    seconds: float
    figures: list[dict]
    log: Path


def machine() -> dict[str, str]:
    memory = next(
        line.split()[1]
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    return {
        "cores": str(os.cpu_count()),
        "memory": f"{int(memory) / 1024 / 1024:.1f} GiB",
        "kernel": platform.release(),
        "cpu": next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.machine(),
        ),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
    }


def run_bench(name: str, arguments: list[str], logs: Path) -> Outcome:
    command = shlex.join([".venv/bin/python", *arguments])
    results = logs / f"{name}.jsonl"
    log = logs / f"{name}.log"
    env = {**os.environ, "BENCH_RESULTS": str(results), "BENCH_COMMAND": command}
    print(f"== {name}: {command}  (log: {log})", flush=True)
    start = time.monotonic()
    with log.open("w") as out:
        # The bench's own lines go to the terminal as well: a long bench shows its progress.
        process = subprocess.Popen(
            [sys.executable, *arguments],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for line in process.stdout:
            out.write(line)
            print(f"   {line}", end="", flush=True)
        returncode = process.wait()
    figures = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    return Outcome(name, command, returncode, time.monotonic() - start, figures, log)


def previous_figures(before: str) -> dict[str, dict]:
    """Each figure as the last earlier run that measured it had it: a run of `--only` some benches
    leaves the others' last values where they were."""
    last = {}
    for run in sorted(p for p in RESULTS.glob("*.json") if p.stem < before):
        last.update({figure["name"]: figure for figure in json.loads(run.read_text())["figures"]})
    return last


def number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    text = f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return f"{text} {unit}".strip()


def verdict(figure: dict) -> str:
    if figure["target"] is None:
        return "reference"
    higher = figure["higher_is_better"]
    ok = figure["value"] >= figure["target"] if higher else figure["value"] <= figure["target"]
    return "pass" if ok else "FAIL"


def table(outcomes: list[Outcome], previous: dict[str, dict]) -> list[str]:
    rows = ["| Figure | Value | Target | Result | Last run | Command |", "|---|---|---|---|---|---|"]
    for outcome in outcomes:
        if outcome.returncode:
            rows.append(
                f"| {outcome.name}: the bench failed (exit {outcome.returncode}) | — | — | FAIL | — | "
                f"`{outcome.command}` |"
            )
        for f in outcome.figures:
            bound = ("≥ " if f["higher_is_better"] else "≤ ") + number(f["target"], f["unit"])
            last = previous.get(f["name"])
            rows.append(
                f"| {f['name']} | {number(f['value'], f['unit'])} | "
                f"{bound if f['target'] is not None else '—'} | {verdict(f)} | "
                f"{number(last['value'], last['unit']) if last else '—'} | `{f['command']}` |"
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=BENCHES, help="run only these benches")
    parser.add_argument("--no-write", action="store_true", help="print the table, write no file")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benches start containers and mount disks")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d-%H%M")
    logs = Path(tempfile.mkdtemp(prefix="bench-run-"))
    host = machine()
    outcomes = [run_bench(name, BENCHES[name], logs) for name in (args.only or BENCHES)]
    previous = previous_figures(stamp)
    lines = [
        f"# Benchmarks, {stamp}",
        "",
        f"Machine: {host['cores']} cores ({host['cpu']}), {host['memory']}, Linux {host['kernel']}; "
        f"commit {host['commit']}. Produced by `make bench`; each bench ran alone, in this order, "
        f"taking {', '.join(f'{o.name} {o.seconds:.0f} s' for o in outcomes)}.",
        "",
        *table(outcomes, previous),
    ]
    print("\n" + "\n".join(lines[4:]))
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{stamp}.md").write_text("\n".join(lines) + "\n")
        figures = [f for o in outcomes for f in o.figures]
        run = {"machine": host, "benches": {o.name: o.returncode for o in outcomes}, "figures": figures}
        (RESULTS / f"{stamp}.json").write_text(json.dumps(run, indent=1) + "\n")
        print(f"\nwritten: docs/benchmarks/{stamp}.md")
    failed = any(o.returncode for o in outcomes) or any(
        verdict(f) == "FAIL" for o in outcomes for f in o.figures
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
