"""The control plane's processes as the Procfile declares them, for a bench to start.

A bench's figures are for the server as deployed: started from the Procfile's own line, the web
process has the pool size and niceness a deployment gives it, with no copy of them here to drift.
"""

from __future__ import annotations

from pathlib import Path

from honcho.environ import parse_procfile

ROOT = Path(__file__).resolve().parent.parent


def procfile_command(name: str) -> list[str]:
    """Process `name` of the Procfile, its `${VAR:-default}`s expanded by the shell from the environment
    (PORT, HOST, GUEST_PORT …) as honcho does."""
    # The shell replaces itself (exec), and env sets the line's leading assignments: the process a bench
    # stops is the server itself, not a shell that would leave it running.
    return ["sh", "-c", "exec env " + parse_procfile((ROOT / "Procfile").read_text()).processes[name]]
