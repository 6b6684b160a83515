"""The agent runtime's configuration inside each desktop, BYOK keys included (worker side).

The keys are kept encrypted; they are decrypted only here, in the worker's memory, and go
over SFTP straight into the file the runtime reads, which only the desktop's agent user may
read. Nothing here logs, returns or passes them on.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import uuid
from pathlib import Path

import paramiko
from django.db import transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac
from django.utils.translation import gettext as _

from desktops import crypto
from desktops.events import LLMKeyChecked, publish_llm_key_checked
from desktops.guest import desktop_ssh_connect
from desktops.models import Desktop, DesktopState, LLMKey, LLMProvider, Workspace

GATEWAY_PORT = 18789
# A model served inside the desktop on loopback by `bureau warmup` (image-build/guest/bureau), which
# answers one word: the desktop warms its agent up with it as it boots, spending no provider's tokens.
WARMUP_PROVIDER = {
    "bureau-warmup": {
        "baseUrl": "http://127.0.0.1:18790/v1",
        "apiKey": "none",
        "api": "openai-completions",
        "models": [{"id": "ready", "name": "ready"}],
    }
}
# Relative to the agent's home, where SFTP sessions start.
CONFIG_DIR = ".openclaw"
CONFIG_FILE = "openclaw.json"
# Our OpenClaw plugins: one holds the commands the workspace's policy names until an operator approves
# them (and reads that policy, beside it), the other gives the agent its screen as tools. Plugin
# directories with a manifest, not lone files: the gateway loads only those at its start (the
# manifest's `activation.onStartup`).
PLUGIN_DIR = posixpath.join(CONFIG_DIR, "bureau")
APPROVALS_PLUGIN_ID = "bureau-approvals"
SCREEN_PLUGIN_ID = "bureau-screen"
PLUGIN_IDS = (APPROVALS_PLUGIN_ID, SCREEN_PLUGIN_ID)
APPROVALS_POLICY = posixpath.join(PLUGIN_DIR, "approvals.json")
PLUGIN_FILES = {
    posixpath.join(PLUGIN_DIR, plugin, source.name): source.read_bytes()
    for plugin in PLUGIN_IDS
    for source in sorted((Path(__file__).parent / "agent_plugins" / plugin).iterdir())
}
# The desktop's own screen (Xvnc on :0, image-build/guest/vnc-session), the one the operator watches.
DISPLAY = ":0"
# The agent's browser: the image's Chromium, launched by OpenClaw on that screen rather than headless
# (OpenClaw's default when its process has no DISPLAY, as the gateway's service has not), maximised so
# that what it does fills the operator's view.
BROWSER = {
    "enabled": True,
    "headless": False,
    "executablePath": "/usr/bin/chromium",
    "extraArgs": ["--start-maximized"],
    # OpenClaw's guard keeps a browser on someone's own machine off their private network. Here the
    # desktop is the agent's machine and its firewall is the boundary: `exec` reaches what the
    # desktop's network lets through anyway, and the agent's own servers on loopback (a dev server it
    # started) are exactly what it must be able to open.
    "ssrfPolicy": {"dangerouslyAllowPrivateNetwork": True},
}
# OpenClaw waits at most 600 s for the plugin's verdict on a tool call (and refuses the call then): a
# request asked from there waits a little less, whatever the workspace's default.
APPROVAL_WAIT_MAX = 570

# Per provider: base URL, OpenClaw's API dialect, and the model used when the key names none.
PROVIDERS = {
    LLMProvider.ANTHROPIC: ("https://api.anthropic.com", "anthropic-messages", "claude-sonnet-4-5"),
    LLMProvider.OPENAI: ("https://api.openai.com/v1", "openai-completions", "gpt-5"),
    LLMProvider.OPENROUTER: ("https://openrouter.ai/api/v1", "openai-completions", "openrouter/auto"),
    LLMProvider.OPENAI_COMPATIBLE: ("", "openai-completions", ""),
}


# What the agent's models take in. OpenClaw takes a model it does not know for text-only, and then
# leaves out of its requests the images tools answer: the screen plugin's screenshots among them.
MODEL_INPUT = ["text", "image"]

# OpenClaw asks an OpenAI-style server it does not know for token counts only when told it can
# give them; without them a turn's usage would read zero.
COMPAT = {"openai-completions": {"compat": {"supportsUsageInStreaming": True}}}


def gateway_token(desktop_id: str) -> str:
    """The desktop's gateway password, stable so that rewriting the file never locks the bridge out."""
    return salted_hmac("lebureau.agent-gateway", desktop_id).hexdigest()


def provider_id(key: LLMKey) -> str:
    return key.id.replace("_", "-")


def approvals_policy(workspace: Workspace) -> dict:
    """What the approvals plugin in the desktop reads: the commands to hold, and how long to wait."""
    return {
        "commands": workspace.approval_commands,
        "timeout": min(workspace.approval_timeout, APPROVAL_WAIT_MAX),
    }


def openclaw_config(*, desktop_id: str, keys: list[LLMKey]) -> dict:
    """OpenClaw's `openclaw.json` for one desktop: the warm gateway, one provider per key (newest first),
    and our plugins."""
    providers, models = {}, []
    for key in keys:
        base_url, api, fallback_model = PROVIDERS[key.provider]
        model, provider = key.model or fallback_model, provider_id(key)
        providers[provider] = {
            "baseUrl": key.base_url or base_url,
            "apiKey": crypto.secret_decrypt(key.secret_encrypted),
            "api": api,
            "models": [{"id": model, "name": model, "input": MODEL_INPUT, **COMPAT.get(api, {})}],
        }
        models.append(f"{provider}/{model}")
    config = {
        "gateway": {
            "mode": "local",
            "port": GATEWAY_PORT,
            "bind": "loopback",
            "auth": {"mode": "token", "token": gateway_token(desktop_id)},
            "http": {"endpoints": {"chatCompletions": {"enabled": True}}},
        },
        # The desktop is the agent's own machine: its commands run there without OpenClaw's own exec
        # approvals (an allow-list of executables, which cannot say "git, but not git push"). Set
        # explicitly, so a default that changes cannot change it; the workspace's policy is held by the
        # approvals plugin instead.
        "tools": {"exec": {"host": "gateway", "security": "full", "ask": "off"}},
        "browser": BROWSER,
        # Into the gateway's environment, for the browser it launches (and the commands it runs) to
        # draw on the desktop's screen. OpenClaw restarts its gateway (in-process) to apply a change
        # here, so the image's boot configuration has the same (image-build/guest/agent-gateway).
        "env": {"vars": {"DISPLAY": DISPLAY}},
        "models": {"mode": "merge", "providers": {**WARMUP_PROVIDER, **providers}},
        "plugins": {
            "load": {"paths": [f"~/{posixpath.join(PLUGIN_DIR, plugin)}" for plugin in PLUGIN_IDS]},
            "entries": {
                APPROVALS_PLUGIN_ID: {
                    "enabled": True,
                    # The title of the terminal window where the plugin shows the agent's commands.
                    "config": {"screen": {"display": DISPLAY, "title": _("The agent's commands")}},
                },
                SCREEN_PLUGIN_ID: {"enabled": True},
            },
        },
    }
    if models:
        config["agents"] = {"defaults": {"model": {"primary": models[0], "fallbacks": models[1:]}}}
    return config


# The image profiles that ship the agent runtime (image-build/configure-guest.sh installs OpenClaw in
# the full profile only): the others have nothing to configure, and are spared an SSH session each.
AGENT_RUNTIME_PROFILES = {"full"}


def desktop_agent_configure(*, desktop_id: str) -> bool:
    """Write the agent runtime's configuration into a running desktop; False when it is not running or
    its image has no agent runtime."""
    # One writer per desktop at a time, reading the keys only once it holds the lock: a rewrite
    # that started before a key was removed can then never land after the one that removes it.
    with transaction.atomic():
        desktop = (
            Desktop.objects.select_for_update().filter(id=desktop_id, state=DesktopState.RUNNING).first()
        )
        if desktop is None or desktop.image_profile not in AGENT_RUNTIME_PROFILES:
            return False
        keys = list(LLMKey.objects.filter(workspace_id=desktop.workspace_id).order_by("-created_at"))
        workspace = Workspace.objects.get(id=desktop.workspace_id)
        # The configuration last: the gateway reloads when it changes, and finds the plugin in place.
        _write_files(
            desktop,
            {
                **PLUGIN_FILES,
                APPROVALS_POLICY: json.dumps(approvals_policy(workspace), indent=2).encode(),
                posixpath.join(CONFIG_DIR, CONFIG_FILE): json.dumps(
                    openclaw_config(desktop_id=desktop.id, keys=keys), indent=2
                ).encode(),
            },
        )
    return True


# Asked from inside a desktop, so that the answer is what its agent will get: through its network,
# its firewall and its egress policy (and never from the control plane's own network). The request
# comes on stdin, the secret with it, never on a command line.
CHECK_SCRIPT = """
import json, sys, urllib.error, urllib.request
asked = json.load(sys.stdin)
try:
    request = urllib.request.Request(asked["url"], headers=asked["headers"])
    with urllib.request.urlopen(request, timeout=8) as answer:
        print("status", answer.status)
except urllib.error.HTTPError as exc:
    print("status", exc.code)
except Exception as exc:
    print("error", type(exc).__name__, str(exc)[:200])
"""
CHECK_TIMEOUT = 15


def _check_request(key: LLMKey) -> tuple[str, dict]:
    """The cheapest authenticated request of each dialect: listing the models (or OpenRouter's key)."""
    base_url, api, _model = PROVIDERS[key.provider]
    base_url, secret = (key.base_url or base_url).rstrip("/"), crypto.secret_decrypt(key.secret_encrypted)
    if api == "anthropic-messages":
        return f"{base_url}/v1/models", {"x-api-key": secret, "anthropic-version": "2023-06-01"}
    path = "key" if key.provider == LLMProvider.OPENROUTER else "models"  # OpenRouter lists models to all
    return f"{base_url}/{path}", {"Authorization": f"Bearer {secret}"}


def llm_key_check(*, key_id: str) -> str | None:
    """Ask the key's provider, from one of its workspace's running desktops, whether it takes the key;
    the verdict is kept on the key. None when no desktop runs to ask from (it stays unchecked)."""
    key = LLMKey.objects.filter(id=key_id).first()
    desktop = (
        Desktop.objects.filter(workspace_id=key.workspace_id, state=DesktopState.RUNNING).first()
        if key
        else None
    )
    if desktop is None:
        return None
    url, headers = _check_request(key)
    try:
        with desktop_ssh_connect(desktop_id=desktop.id, host=desktop.private_ip) as ssh:
            stdin, out, _err = ssh.exec_command(
                f"python3 -c {shlex.quote(CHECK_SCRIPT)}", timeout=CHECK_TIMEOUT
            )
            stdin.write(json.dumps({"url": url, "headers": headers}))
            stdin.channel.shutdown_write()
            answer = out.read().decode(errors="replace").strip()
    except (paramiko.SSHException, OSError):
        return None  # the desktop is not answering: the key stays unchecked until its next save

    kind, _, detail = answer.partition(" ")
    Verdict = LLMKey.Verdict
    if kind == "status":
        verdict = {"200": Verdict.ACCEPTED, "401": Verdict.REFUSED, "403": Verdict.REFUSED}.get(
            detail, Verdict.ANSWERED
        )
    else:
        verdict = Verdict.UNREACHABLE
    # Only if the secret is still the one asked about: a rotation meanwhile gets its own check.
    checked = LLMKey.objects.filter(id=key.id, secret_encrypted=key.secret_encrypted).update(
        verdict=verdict, check_detail=(detail or answer)[:300], checked_at=timezone.now()
    )
    if checked:
        publish_llm_key_checked(LLMKeyChecked(key.id, key.workspace_id, key.name, verdict))
    return verdict


def _write_files(desktop: Desktop, files: dict[str, bytes]) -> None:
    """Write these files (paths relative to the agent's home), in order, each readable by the agent alone."""
    with desktop_ssh_connect(desktop_id=desktop.id, host=desktop.private_ip) as ssh, ssh.open_sftp() as sftp:
        for directory in (CONFIG_DIR, PLUGIN_DIR, *(posixpath.join(PLUGIN_DIR, p) for p in PLUGIN_IDS)):
            parent, name = posixpath.split(directory)
            if name not in sftp.listdir(parent or "."):
                sftp.mkdir(directory, mode=0o700)
            sftp.chmod(directory, 0o700)
        for path, content in files.items():
            partial = f"{path}.{uuid.uuid4().hex}.partial"
            with sftp.open(partial, "w") as f:
                f.chmod(0o600)  # before a byte of it is written
                f.write(content)
            # One rename, so the runtime (which watches its files) never reads half of one.
            sftp.posix_rename(partial, path)
