"""Egress policies: where desktops may connect, set per workspace and overridable per desktop.

A policy is open, an allow-list (domains, ``*.`` wildcards, IPv4 networks, and the hosts of the
workspace's LLM keys), or deny-all. The domain stores and audits it; the desktop's engine enforces it
with packets (``NetworkPolicy``). A change is handed to the workers on commit, which apply it to each
desktop it covers, running or not, within seconds and without a restart.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from django.db import transaction
from django.utils.translation import gettext as _

from desktops.audit import Actor, audit_record
from desktops.engines import engine
from desktops.errors import Invalid
from desktops.models import (
    Desktop,
    DesktopState,
    EgressMode,
    EgressPolicy,
    LLMKey,
    LLMProvider,
    Role,
    Workspace,
)
from desktops.queue import DESKTOP_EGRESS_APPLY, enqueue
from desktops.selectors import desktop_get, workspace_get
from workers.drivers.base import ALLOWED_DOMAIN, DriverError, NetworkPolicy

logger = logging.getLogger(__name__)

# What a new workspace allows, so that an agent works out of the box: the package registries of the
# desktops' images and GitHub (the LLM providers come from the workspace's keys).
PRESET_ENTRIES = (
    "deb.debian.org",
    "security.debian.org",
    "archive.ubuntu.com",
    "security.ubuntu.com",
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "crates.io",
    "index.crates.io",
    "static.crates.io",
    # Named one by one rather than by wildcard: a Proxmox engine without its resolver allows names only
    # by their addresses resolved in advance.
    "github.com",
    "api.github.com",
    "codeload.github.com",
    "objects.githubusercontent.com",
    "raw.githubusercontent.com",
)
PROVIDER_HOSTS = {
    LLMProvider.ANTHROPIC: "api.anthropic.com",
    LLMProvider.OPENAI: "api.openai.com",
    LLMProvider.OPENROUTER: "openrouter.ai",
}
MAX_ENTRIES = 200


@dataclass(frozen=True)
class Egress:
    """The policy that holds for a workspace or a desktop, and where it comes from."""

    mode: str
    entries: tuple[str, ...]
    allow_llm_providers: bool
    # The hosts of the workspace's LLM keys, allowed in allow-list mode when allow_llm_providers.
    llm_hosts: tuple[str, ...]
    # For a desktop: True when it follows its workspace's policy.
    inherited: bool = False
    updated_at: datetime | None = None
    updated_by: str = ""

    @property
    def mode_label(self) -> str:
        return EgressMode(self.mode).label

    def network_policy(self) -> NetworkPolicy:
        """What the engine enforces."""
        if self.mode == EgressMode.OPEN:
            return NetworkPolicy()
        if self.mode == EgressMode.DENY:
            return NetworkPolicy(allow_internet=False)
        entries = list(self.entries)
        if self.allow_llm_providers:
            # A key's base URL may name its server by address: a network of one.
            entries += [f"{h}/32" if _is_address(h) else h for h in self.llm_hosts]
        cidrs = [e for e in entries if "/" in e]  # stored networks always carry their prefix length
        domains = [e for e in entries if "/" not in e]
        return NetworkPolicy(
            allow_internet=False,
            allowed_cidrs=tuple(dict.fromkeys(cidrs)),
            allowed_domains=tuple(dict.fromkeys(domains)),
        )


def _is_address(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def entries_checked(entries: list[str]) -> list[str]:
    """Normalised entries (lowercase names, networks in their canonical form, no repeats), or one clear
    400 naming every entry that is neither a domain nor an IPv4 network."""
    if len(entries) > MAX_ENTRIES:
        raise Invalid(
            _("An allow-list holds at most %(max)s entries.") % {"max": MAX_ENTRIES},
            fields={"entries": [_("Too many entries.")]},
        )
    kept, wrong = [], []
    for raw in entries:
        entry = raw.strip().rstrip(".").lower()
        if ALLOWED_DOMAIN.fullmatch(entry):
            normal = entry
        else:
            try:
                normal = str(ipaddress.IPv4Network(entry, strict=False))
            except ValueError:
                wrong.append(raw)
                continue
        if normal not in kept:
            kept.append(normal)
    if wrong:
        raise Invalid(
            _("Not a domain (example.com, *.example.com) nor an IPv4 network (203.0.113.0/24): %(entries)s.")
            % {"entries": ", ".join(repr(w) for w in wrong)},
            fields={
                "entries": [_("%(entry)r is not a domain nor an IPv4 network.") % {"entry": w} for w in wrong]
            },
        )
    return kept


def _mode_checked(mode: str) -> str:
    if mode not in EgressMode.values:
        raise Invalid(
            _("Unknown egress mode %(mode)r: choose open, allowlist or deny.") % {"mode": mode},
            fields={"mode": [_("Unknown.")]},
        )
    return mode


def llm_hosts_of(workspace_id: str) -> tuple[str, ...]:
    """The API hosts of the workspace's LLM keys: their provider's, or an OpenAI-compatible key's own."""
    hosts = []
    for provider, base_url in LLMKey.objects.filter(workspace_id=workspace_id).values_list(
        "provider", "base_url"
    ):
        host = urlsplit(base_url).hostname if base_url else PROVIDER_HOSTS.get(provider)
        # A name no policy can allow (`localhost`) stays out of reach.
        allowable = host and (_is_address(host) or ALLOWED_DOMAIN.fullmatch(host))
        if allowable and host not in hosts:
            hosts.append(host)
    return tuple(sorted(hosts))


def _egress(policy: EgressPolicy | None, workspace_id: str, *, inherited: bool = False) -> Egress:
    llm_hosts = llm_hosts_of(workspace_id)
    if policy is None:
        # Workspaces made before egress policies existed keep the open internet they had.
        return Egress(
            mode=EgressMode.OPEN,
            entries=(),
            allow_llm_providers=True,
            llm_hosts=llm_hosts,
            inherited=inherited,
        )
    return Egress(
        mode=policy.mode,
        entries=tuple(policy.entries),
        allow_llm_providers=policy.allow_llm_providers,
        llm_hosts=llm_hosts,
        inherited=inherited,
        updated_at=policy.updated_at,
        updated_by=policy.updated_by.email if policy.updated_by else "",
    )


# Reads


def egress_of_workspace(*, workspace: Workspace) -> Egress:
    return _egress(EgressPolicy.objects.filter(workspace=workspace, desktop=None).first(), workspace.id)


def egress_of_desktop(*, desktop: Desktop) -> Egress:
    own = EgressPolicy.objects.filter(desktop=desktop).first()
    if own is not None:
        return _egress(own, desktop.workspace_id)
    workspace = EgressPolicy.objects.filter(workspace_id=desktop.workspace_id, desktop=None).first()
    return _egress(workspace, desktop.workspace_id, inherited=True)


# Writes


def egress_preset_create(*, workspace: Workspace, user) -> EgressPolicy:
    """A new workspace's policy: the allow-list an agent needs to work (registries, GitHub, its LLMs)."""
    return EgressPolicy.objects.create(
        workspace=workspace, mode=EgressMode.ALLOWLIST, entries=list(PRESET_ENTRIES), updated_by=user
    )


def workspace_egress_set(
    *, actor: Actor, workspace_id: str, mode: str, entries: list[str], allow_llm_providers: bool
) -> Egress:
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    policy = {"mode": mode, "entries": entries, "allow_llm_providers": allow_llm_providers}
    with transaction.atomic():
        _policy_save(actor, "workspace.egress", workspace.id, workspace.id, {"desktop": None}, policy)
        workspace_egress_apply(workspace_id=workspace.id)
    return egress_of_workspace(workspace=workspace)


def desktop_egress_set(
    *, actor: Actor, desktop_id: str, mode: str, entries: list[str], allow_llm_providers: bool
) -> Egress:
    """The desktop's own policy, in place of its workspace's."""
    desktop = desktop_get(actor=actor, desktop_id=desktop_id, minimum=Role.ADMIN)
    policy = {"mode": mode, "entries": entries, "allow_llm_providers": allow_llm_providers}
    with transaction.atomic():
        _policy_save(actor, "desktop.egress", desktop.workspace_id, desktop.id, {"desktop": desktop}, policy)
        enqueue(DESKTOP_EGRESS_APPLY, desktop_id=desktop.id)
    return egress_of_desktop(desktop=desktop)


def _policy_save(
    actor: Actor, action: str, workspace_id: str, target: str, whose: dict, policy: dict
) -> None:
    """Store a workspace's (`whose` names no desktop) or a desktop's policy, checked, and audit it."""
    mode, entries = _mode_checked(policy["mode"]), entries_checked(policy["entries"])
    allow_llm_providers = policy["allow_llm_providers"]
    EgressPolicy.objects.update_or_create(
        workspace_id=workspace_id,
        **whose,
        defaults={
            "mode": mode,
            "entries": entries,
            "allow_llm_providers": allow_llm_providers,
            "updated_by": actor.user,
        },
    )
    audit_record(
        actor=actor,
        action=action,
        workspace_id=workspace_id,
        target=target,
        mode=mode,
        entries=entries,
        allowLlmProviders=allow_llm_providers,
    )


def desktop_egress_inherit(*, actor: Actor, desktop_id: str) -> Egress:
    """Drop the desktop's own policy: it follows its workspace's again."""
    desktop = desktop_get(actor=actor, desktop_id=desktop_id, minimum=Role.ADMIN)
    with transaction.atomic():
        if EgressPolicy.objects.filter(desktop=desktop).delete()[0]:
            audit_record(
                actor=actor,
                action="desktop.egress_inherit",
                workspace_id=desktop.workspace_id,
                target=desktop.id,
            )
            enqueue(DESKTOP_EGRESS_APPLY, desktop_id=desktop.id)
    return egress_of_desktop(desktop=desktop)


def workspace_egress_apply(*, workspace_id: str, all_desktops: bool = False) -> None:
    """Hand the policy to the workers for each of the workspace's desktops that follows the workspace's
    (``all_desktops``: every one, for what changes them all, such as its LLM keys' hosts)."""
    desktops = Desktop.objects.filter(workspace_id=workspace_id).exclude(
        state__in=(DesktopState.DESTROYING, DesktopState.DESTROYED)
    )
    if not all_desktops:
        desktops = desktops.filter(egress_policy=None)
    for desktop_id in desktops.values_list("id", flat=True):
        enqueue(DESKTOP_EGRESS_APPLY, desktop_id=desktop_id)


def desktop_egress_apply(*, desktop_id: str) -> bool:
    """Enforce the desktop's policy in its engine now; False when it has no instance to apply it to.

    Engine failures propagate: transient ones are retried by the task, the others logged there.
    """
    desktop = Desktop.objects.filter(id=desktop_id).first()
    if desktop is None or desktop.state in (DesktopState.DESTROYING, DesktopState.DESTROYED):
        return False
    if not desktop.driver_ref:
        # Still being made: the provision carries the policy it reads then, and applies it again after.
        return False
    try:
        engine(desktop.driver).apply_network_policy(
            desktop.id, egress_of_desktop(desktop=desktop).network_policy()
        )
    except DriverError as exc:
        if exc.transient:
            raise
        logger.warning("could not apply the egress policy of %s: %s", desktop.id, exc.message)
        return False
    return True
