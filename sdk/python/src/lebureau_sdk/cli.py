"""`lebureau`: Le Bureau from a terminal or a pipeline. Words for people by default, `--json` for programs.

A DESKTOP is a desktop's id (dsk_…) or its name.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, is_dataclass
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from lebureau_sdk import Client, LeBureauError, NotConfigured, models
from lebureau_sdk._core import camel
from lebureau_sdk.config import DEFAULT_URL, in_clear, resolve, save, saved

app = typer.Typer(no_args_is_help=True, help=__doc__, pretty_exceptions_enable=False)
desktops_app = typer.Typer(no_args_is_help=True, help="Create, list, start, stop and destroy desktops.")
schedules_app = typer.Typer(no_args_is_help=True, help="Messages sent to a desktop's agent on a schedule.")
app.add_typer(desktops_app, name="desktops")
app.add_typer(schedules_app, name="schedules")
out, err = Console(), Console(stderr=True)

Json = Annotated[bool, typer.Option("--json", help="Print JSON for programs.")]
Labels = Annotated[list[str] | None, typer.Option("--label", "-l", help="A label (repeat for several).")]
Wait = Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until it has happened.")]


def client() -> Client:
    return Client()


def emit(value: Any) -> None:
    """An answer (models, lists of them) on stdout as the API's JSON, camelCase."""
    out.print_json(json.dumps(_api_json(value), default=str))


def _api_json(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    if isinstance(value, dict):
        return {camel(k): _api_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_api_json(v) for v in value]
    return value


def desktop_id(api: Client, ref: str) -> str:
    """The id of the desktop named by an id or a name."""
    if ref.startswith("dsk_"):
        return ref
    found = next(iter(api.desktops.list(name=ref)), None)
    if found is None:
        raise typer.BadParameter(f"no desktop named {ref!r}")
    return found.id


def desktops_table(desktops: list[models.Desktop]) -> Table:
    table = Table("ID", "NAME", "STATE", "PLAN", "IP", "LABELS", box=None)
    for d in desktops:
        state = f"{d.state} ({d.progress})" if d.progress else d.state
        table.add_row(d.id, d.name, state, d.plan.name, d.private_ip or "-", ",".join(d.labels))
    return table


class Waiting:
    """A spinner per desktop while the CLI waits for them, showing each step as it comes."""

    def __init__(self, quiet: bool):
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=err, disable=quiet
        )
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> Waiting:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def __call__(self, desktop: models.Desktop) -> None:
        step = f" — {desktop.progress}" if desktop.progress else ""
        words = f"{desktop.name}: {desktop.state}{step}"
        if desktop.id not in self.tasks:
            self.tasks[desktop.id] = self.progress.add_task(words, total=None)
        self.progress.update(self.tasks[desktop.id], description=words)


def show_desktops(desktops: list[models.Desktop], as_json: bool) -> None:
    if as_json:
        emit(desktops)
    else:
        out.print(desktops_table(desktops))
    if any(d.state == "error" for d in desktops):
        raise typer.Exit(1)


@app.command()
def login(
    url: Annotated[str, typer.Option(help="Mission Control's address.")] = "",
    key: Annotated[str, typer.Option(help="An API key (lb_…); asked for when not given.")] = "",
    allow_http: Annotated[
        bool, typer.Option(help="Send the key over plain http to a host other than this machine.")
    ] = False,
) -> None:
    """Save the address and an API key (Settings → API keys in Mission Control) for later commands."""
    url = url or saved().get("url") or DEFAULT_URL
    if in_clear(url) and not allow_http:
        err.print(
            f"[bold yellow]{url} is plain http to another machine:[/] the key would cross the network "
            "unencrypted, for anyone on the way to read. Use https, or pass --allow-http."
        )
        if not typer.confirm("Send it anyway?", default=False, err=True):
            raise typer.Exit(1)
    key = key or typer.prompt("API key", hide_input=True)
    with Client(url, key) as api:
        workspace = next(iter(api.workspaces.list()))
    path = save(url, key)
    out.print(f"Signed in to [bold]{workspace.name}[/] ({workspace.id}) at {url}; saved in {path}.")


@desktops_app.command("ls")
def desktops_ls(
    state: Annotated[str | None, typer.Option(help="Only desktops in this state.")] = None,
    label: Labels = None,
    workspace: Annotated[str | None, typer.Option(help="Workspace id.")] = None,
    as_json: Json = False,
) -> None:
    """List desktops."""
    with client() as api:
        desktops = list(api.desktops.list(workspace_id=workspace, state=state, labels=label))
    if as_json:
        emit(desktops)
    else:
        out.print(desktops_table(desktops))


@desktops_app.command("create")
def desktops_create(
    name: Annotated[str, typer.Argument(help="Its name, or with --count the prefix of their names.")],
    count: Annotated[int, typer.Option(help="Make this many, named NAME-1, NAME-2…, all or none.")] = 0,
    plan: Annotated[str | None, typer.Option(help="Plan name or id.")] = None,
    image: Annotated[str | None, typer.Option(help="Image profile: full or minimal.")] = None,
    label: Labels = None,
    wait: Wait = True,
    as_json: Json = False,
) -> None:
    """Create a desktop (or --count of them) and wait until it runs."""
    with client() as api, Waiting(quiet=as_json or not wait) as waiting:
        if count:
            desktops = api.desktops.bulk_create(
                name_prefix=name,
                count=count,
                plan=plan,
                image_profile=image,
                labels=label,
                wait=wait,
                on_progress=waiting,
            )
        else:
            made = api.desktops.create(
                name, plan=plan, image_profile=image, labels=label, wait=wait, on_progress=waiting
            )
            desktops = [made]
    show_desktops(desktops, as_json)


def _act(step: str, refs: list[str], label: list[str] | None, wait: bool, as_json: bool) -> None:
    with client() as api:
        if label:
            result = api.desktops.bulk(step, labels=label, ids=[desktop_id(api, r) for r in refs] or None)
            refused = [o for o in result.results if not o.ok]
            ids = [o.desktop_id for o in result.results if o.ok]
        else:
            refused, ids = [], []
            for ref in refs:
                try:
                    ids.append(getattr(api.desktops, step)(desktop_id(api, ref)).id)
                except LeBureauError as exc:
                    refused.append(models.BulkOutcome(ref, False, ref, "", exc.code, exc.message))
        with Waiting(quiet=as_json or not wait) as waiting:
            desktops = [
                api.desktops.wait(i, on_progress=waiting) if wait else api.desktops.get(i) for i in ids
            ]
    for outcome in refused:
        err.print(f"[red]{outcome.name or outcome.desktop_id}[/]: {outcome.message}")
    if as_json:
        emit({"desktops": desktops, "refused": refused})
    elif desktops:
        out.print(desktops_table(desktops))
    if refused:
        raise typer.Exit(1)


Refs = Annotated[list[str] | None, typer.Argument(help="Desktops (ids or names).")]
ByLabel = Annotated[list[str] | None, typer.Option("--label", "-l", help="Every desktop with this label.")]


@desktops_app.command("start")
def desktops_start(
    desktops: Refs = None, label: ByLabel = None, wait: Wait = True, as_json: Json = False
) -> None:
    """Start stopped desktops."""
    _act("start", desktops or [], label, wait, as_json)


@desktops_app.command("stop")
def desktops_stop(
    desktops: Refs = None, label: ByLabel = None, wait: Wait = True, as_json: Json = False
) -> None:
    """Stop running desktops (their disks stay)."""
    _act("stop", desktops or [], label, wait, as_json)


@desktops_app.command("suspend")
def desktops_suspend(
    desktops: Refs = None, label: ByLabel = None, wait: Wait = True, as_json: Json = False
) -> None:
    """Suspend running desktops (their memory is kept)."""
    _act("suspend", desktops or [], label, wait, as_json)


@desktops_app.command("resume")
def desktops_resume(
    desktops: Refs = None, label: ByLabel = None, wait: Wait = True, as_json: Json = False
) -> None:
    """Resume suspended desktops."""
    _act("resume", desktops or [], label, wait, as_json)


@desktops_app.command("rm")
def desktops_rm(
    desktops: Refs = None,
    label: ByLabel = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    wait: Wait = True,
    as_json: Json = False,
) -> None:
    """Destroy desktops and their disks."""
    what = ", ".join(desktops or []) or f"every desktop labelled {','.join(label or [])}"
    if not (desktops or label):
        raise typer.BadParameter("name desktops, or --label")
    if not yes and not typer.confirm(f"Destroy {what} and wipe their disks?"):
        raise typer.Exit(1)
    _act("destroy", desktops or [], label, wait, as_json)


@desktops_app.command("label")
def desktops_label(
    desktop: Annotated[str, typer.Argument(help="A desktop (id or name).")],
    add: Annotated[list[str] | None, typer.Option("--add", help="A label to add.")] = None,
    remove: Annotated[list[str] | None, typer.Option("--remove", help="A label to remove.")] = None,
    as_json: Json = False,
) -> None:
    """Add or remove a desktop's labels."""
    with client() as api:
        changed = api.desktops.label(desktop_id(api, desktop), add=add, remove=remove)
    show_desktops([changed], as_json)


@app.command()
def chat(
    desktop: Annotated[str, typer.Argument(help="A desktop (id or name).")],
    message: Annotated[str, typer.Argument(help="For the desktop's agent.")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Print the answer as it comes.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answer.")] = 3600,
    as_json: Json = False,
) -> None:
    """Send a message to a desktop's agent; with --follow, print its answer as it grows."""
    with client() as api:
        target = desktop_id(api, desktop)
        if not follow:
            queued = api.chat.send(target, message)
            emit(queued) if as_json else out.print(f"Sent; the answer will be {queued.id} ({queued.status}).")
            return
        reply: models.ChatMessage | None = None
        for piece in api.chat.stream(target, message, timeout=timeout):
            reply = piece.message
            if not as_json:
                sys.stdout.write(piece.text)
                sys.stdout.flush()
    if as_json:
        emit(reply)
    else:
        sys.stdout.write("\n")
    if reply is None or reply.status == "error":
        raise typer.Exit(1)


@app.command(name="exec", context_settings={"ignore_unknown_options": True})
def exec_(
    desktop: Annotated[str, typer.Argument(help="A desktop (id or name).")],
    command: Annotated[list[str], typer.Argument(help="After --: the command and its arguments.")],
    timeout: Annotated[int, typer.Option(help="Seconds the command may run.")] = 60,
    stdin: Annotated[bool, typer.Option("--stdin", help="Send this terminal's standard input.")] = False,
    as_json: Json = False,
) -> None:
    """Run a command in a desktop as its agent user, like ssh: its output, and its exit code as ours.

    One argument is a command line for the desktop's shell (`"ls | wc -l"`); several are a program and
    its arguments, passed as they are.
    """
    text = sys.stdin.read() if stdin else None
    line, argv = (command[0], None) if len(command) == 1 else (None, command)
    with client() as api:
        result = api.desktops.exec(desktop_id(api, desktop), line, argv=argv, timeout=timeout, stdin=text)
    if as_json:
        emit(result)
    else:
        sys.stdout.write(result.stdout)
        sys.stderr.write(result.stderr)
        for stream in ("stdout", "stderr"):
            if getattr(result, f"{stream}_truncated"):
                err.print(f"[yellow]{stream} was cut at 1 MiB[/]")
        if result.timed_out:
            err.print(f"[yellow]stopped after {timeout} s[/]")
    raise typer.Exit(255 if result.exit_code is None else result.exit_code)


@schedules_app.command("ls")
def schedules_ls(
    desktop: Annotated[str, typer.Argument(help="A desktop (id or name).")], as_json: Json = False
) -> None:
    """List a desktop's schedules."""
    with client() as api:
        schedules = list(api.schedules.list(desktop_id(api, desktop)))
    if as_json:
        return emit(schedules)
    table = Table("ID", "CRON", "TZ", "NEXT RUN", "LAST RUN", "STOP AFTER", "MESSAGE", box=None)
    for s in schedules:
        last = f"{s.last_run.status} {s.last_run.due_at:%Y-%m-%d %H:%M}" if s.last_run else "-"
        upcoming = f"{s.next_run_at:%Y-%m-%d %H:%M}" if s.next_run_at else "disabled"
        table.add_row(
            s.id, s.cron, s.timezone, upcoming, last, "yes" if s.stop_after else "no", s.message[:50]
        )
    out.print(table)


@schedules_app.command("add")
def schedules_add(
    desktop: Annotated[str, typer.Argument(help="A desktop (id or name).")],
    cron: Annotated[str, typer.Argument(help='minute hour day month weekday, e.g. "0 9 * * 1-5".')],
    message: Annotated[str, typer.Argument(help="Sent to the agent at each run.")],
    timezone: Annotated[str | None, typer.Option(help="The cron's time zone, e.g. Europe/Paris.")] = None,
    stop_after: Annotated[
        bool, typer.Option("--stop-after", help="Stop the desktop after the answer.")
    ] = False,
    as_json: Json = False,
) -> None:
    """Send a message to a desktop's agent on a schedule (the desktop is started first if need be)."""
    with client() as api:
        schedule = api.schedules.create(
            desktop_id(api, desktop), cron, message, timezone=timezone, stop_after=stop_after
        )
    emit(schedule) if as_json else out.print(
        f"{schedule.id}: next run {schedule.next_run_at:%Y-%m-%d %H:%M %Z}."
    )


@schedules_app.command("rm")
def schedules_rm(schedule: Annotated[str, typer.Argument(help="The schedule's id (sch_…).")]) -> None:
    """Delete a schedule."""
    with client() as api:
        api.schedules.delete(schedule)


@app.command()
def mcp(
    desktop: Annotated[str | None, typer.Option(help="The desktop tools act on when they name none.")] = None,
) -> None:
    """Serve an MCP server on stdio: any MCP client drives desktops through it (chat, commands, lifecycle)."""
    try:
        from lebureau_sdk.mcp_server import serve
    except ImportError as exc:
        raise typer.BadParameter("the MCP server needs: pip install 'lebureau-sdk[mcp]'") from exc
    serve(*resolve(None, None), default_desktop=desktop)


def main() -> None:
    try:
        app()
    except NotConfigured as exc:
        err.print(f"[red]{exc}[/]")
        sys.exit(2)
    except LeBureauError as exc:
        err.print(f"[red]{exc.message}[/] [dim]({exc.status} {exc.code})[/]")
        sys.exit(1)
