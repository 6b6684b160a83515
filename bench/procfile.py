"""The control plane's processes as the Procfile declares them, for a bench to start.

A bench's figures are for the server as deployed: started from the Procfile's own line, the web
process has the pool size and niceness a deployment gives it, with no copy of them here to drift.
"""

from __future__ import annotations

from pathlib import Path

from honcho.environ import parse_procfile

ROOT = Path(__file__).resolve().parent.parent


def procfile_command(name: str) -> list[str]:
    """Process `name` of the Procfile, run through the shell as honcho runs it (which expands its
    `${VAR:-default}`s from the environment: PORT, HOST, GUEST_PORT …)."""
    return ["sh", "-c", parse_procfile((ROOT / "Procfile").read_text()).processes[name]]
