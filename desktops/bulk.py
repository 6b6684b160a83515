"""A fleet at once: many desktops made in one call, all of them or none; many acted on by ids, label or
state, each answered on its own. Always within one workspace: nothing here reaches another's desktops.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.utils.translation import gettext as _

from billing.quotas import quota_check_create
from desktops.audit import Actor
from desktops.errors import DomainError, Invalid
from desktops.labels import desktops_label
from desktops.models import Desktop, DesktopState, Plan, Role, Workspace
from desktops.selectors import desktop_list, workspace_get
from desktops.services import desktop_act, desktop_create

MAX_CREATE = 50
MAX_ACT = 500


def bulk_names(*, workspace: Workspace, prefix: str, count: int) -> list[str]:
    """`count` names `prefix-N`, numbered on from the highest the workspace's live desktops use."""
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)$")
    taken = Desktop.objects.filter(workspace=workspace, name__startswith=f"{prefix}-")
    taken = taken.exclude(state=DesktopState.DESTROYED).values_list("name", flat=True)
    highest = max((int(m.group(1)) for name in taken if (m := pattern.match(name))), default=0)
    return [f"{prefix}-{n}" for n in range(highest + 1, highest + count + 1)]


def desktops_create(
    *,
    actor: Actor,
    workspace: Workspace,
    plan: Plan,
    names: Sequence[str],
    image_profile: str = "",
    labels: Sequence[str] = (),
) -> list[Desktop]:
    """Make these desktops, all of them or none: the quota is checked for the whole batch first, and a
    name taken or refused undoes the batch."""
    workspace_get(actor=actor, workspace_id=workspace.id, minimum=Role.MEMBER)
    if not 1 <= len(names) <= MAX_CREATE:
        raise Invalid(
            _("Make 1 to %(max)d desktops at once.") % {"max": MAX_CREATE},
            fields={"count": [_("Out of range.")]},
        )
    if len(set(names)) != len(names):
        raise Invalid(_("Each desktop needs a name of its own."), fields={"names": [_("Names repeat.")]})
    with transaction.atomic():
        # Locks the workspace's row until the batch commits: a concurrent create waits, then counts it.
        quota_check_create(workspace=workspace, plan=plan, count=len(names))
        return [
            desktop_create(
                actor=actor,
                workspace=workspace,
                plan=plan,
                name=name,
                image_profile=image_profile,
                labels=labels,
            )
            for name in names
        ]


@dataclass(frozen=True)
class Selection:
    """Which desktops of the workspace a bulk call means; at least one criterion, or `everything`."""

    ids: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    state: str = ""
    everything: bool = False

    def __post_init__(self):
        if not (self.ids or self.labels or self.state or self.everything):
            raise Invalid(
                _("Say which desktops: ids, label, state, or all: true for every desktop of the workspace."),
                fields={"ids": [_("Give ids, a label, a state, or all.")]},
            )


@dataclass(frozen=True)
class Outcome:
    """What became of one desktop of a bulk call."""

    desktop_id: str
    ok: bool
    name: str = ""
    state: str = ""
    code: str = ""
    message: str = ""


def desktops_selected(
    *, actor: Actor, workspace: Workspace, selection: Selection
) -> tuple[list[Desktop], list[str]]:
    """The workspace's desktops the selection names, and the ids it names that are not among them
    (another workspace's included, told apart from nothing)."""
    desktops = desktop_list(
        actor=actor, workspace_id=workspace.id, state=selection.state or None, labels=list(selection.labels)
    )
    if selection.ids:
        desktops = desktops.filter(id__in=selection.ids)
    found = list(desktops.order_by("name")[: MAX_ACT + 1])
    if len(found) > MAX_ACT:
        raise Invalid(
            _("That is more than %(max)d desktops: narrow it down by label or state.") % {"max": MAX_ACT},
            fields={"ids": [_("Too many desktops.")]},
        )
    seen = {desktop.id for desktop in found}
    return found, [i for i in dict.fromkeys(selection.ids) if i not in seen]


def desktops_act(*, actor: Actor, workspace: Workspace, action: str, selection: Selection) -> list[Outcome]:
    """Request the step on each selected desktop of the workspace; one refusal stops no other."""
    workspace_get(actor=actor, workspace_id=workspace.id, minimum=Role.MEMBER)
    desktops, missing = desktops_selected(actor=actor, workspace=workspace, selection=selection)
    outcomes = _not_found(missing)
    for desktop in desktops:
        try:
            done = desktop_act(actor=actor, desktop=desktop, action=action)
        except DomainError as exc:
            outcomes.append(
                Outcome(desktop.id, False, desktop.name, desktop.state, code=exc.code, message=exc.message)
            )
        else:
            outcomes.append(Outcome(desktop.id, True, done.name, done.state))
    return outcomes


def desktops_relabel(
    *,
    actor: Actor,
    workspace: Workspace,
    selection: Selection,
    add: Sequence[str] = (),
    remove: Sequence[str] = (),
) -> list[Outcome]:
    """Add and remove labels on each selected desktop of the workspace."""
    workspace_get(actor=actor, workspace_id=workspace.id, minimum=Role.MEMBER)
    desktops, missing = desktops_selected(actor=actor, workspace=workspace, selection=selection)
    desktops_label(
        actor=actor, workspace=workspace, desktop_ids=[d.id for d in desktops], add=add, remove=remove
    )
    return _not_found(missing) + [Outcome(d.id, True, d.name, d.state) for d in desktops]


def _not_found(ids: list[str]) -> list[Outcome]:
    # The words of a single desktop's 404: nothing tells another workspace's desktop from none.
    return [
        Outcome(i, False, code="not_found", message=_("Desktop %(id)s not found.") % {"id": i}) for i in ids
    ]
