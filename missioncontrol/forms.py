"""Input checks of the pages; the services decide everything else."""

import re

from django import forms
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy as _lazy

from billing.selectors import price_of
from desktops.alerts import THRESHOLDS
from desktops.models import ApiScope, DesktopState, EgressMode, LLMProvider, Role
from desktops.selectors import plan_list

LIFECYCLE_ACTIONS = [
    ("start", _lazy("Start")),
    ("stop", _lazy("Stop")),
    ("suspend", _lazy("Suspend")),
    ("resume", _lazy("Resume")),
    ("destroy", _lazy("Destroy")),
]
# What the fleet's list does to many desktops at once.
ACTIONS = [(action, label) for action, label in LIFECYCLE_ACTIONS if action in ("start", "stop", "destroy")]
# Filing the selected desktops under a label, or taking them out of it.
LABEL_ACTIONS = [("label", _lazy("Add label")), ("unlabel", _lazy("Remove label"))]


class PageForm(forms.Form):
    """A form of the pages: ids of its own (several forms share a page) and every field named for
    assistive technologies, also where a page shows a bare field without its <label>."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("auto_id", f"{type(self).__name__.lower()}-%s")
        super().__init__(*args, **kwargs)
        for field in self.fields.values():
            field.widget.attrs.setdefault("aria-label", field.label)


class PlanChoice(forms.ModelChoiceField):
    def label_from_instance(self, plan):
        price = price_of(plan)
        return _(
            "%(name)s — %(vcpus)d vCPU, %(memory)d GiB RAM, %(disk)d GiB disk — "
            "€%(hourly)s an hour running, €%(storage)s per GiB of disk a month"
        ) % {
            "name": plan.name,
            "vcpus": plan.vcpus,
            "memory": plan.memory_mib // 1024,
            "disk": plan.disk_gib,
            "hourly": f"{price.hourly.normalize():f}",
            "storage": f"{price.storage_gib_month.normalize():f}",
        }


class NewComputerForm(PageForm):
    name = forms.CharField(
        max_length=63,
        label=_lazy("Name"),
        help_text=_lazy("Lowercase letters, digits and hyphens; its hostname."),
    )
    plan = PlanChoice(queryset=plan_list().select_related("price"), empty_label=None, label=_lazy("Plan"))
    image_profile = forms.ChoiceField(
        label=_lazy("Image profile"),
        choices=[
            ("full", _lazy("Full (XFCE, Chromium, LibreOffice, agent runtime)")),
            ("minimal", _lazy("Minimal (fast, no agent: screen and terminal only)")),
        ],
    )


# Not a state: the desktops the engine failed and those whose agent's last turn failed.
FAILING = "failing"


class DesktopFilterForm(PageForm):
    state = forms.ChoiceField(
        choices=[("", _lazy("Any state")), *DesktopState.choices, (FAILING, _lazy("In error or failed"))],
        required=False,
        label=_lazy("State"),
    )
    q = forms.CharField(required=False, label=_lazy("Name"))
    label = forms.CharField(required=False, label=_lazy("Label"))


class FleetActionForm(PageForm):
    action = forms.ChoiceField(choices=ACTIONS + LABEL_ACTIONS, label=_lazy("Action"))
    label = forms.CharField(required=False, max_length=63, label=_lazy("Label"))
    desktops = forms.MultipleChoiceField(
        choices=[],
        label=_lazy("Desktops"),
        error_messages={"required": _lazy("Select at least one desktop.")},
    )
    confirm = forms.CharField(required=False, label=_lazy("Names of the desktops to destroy"))

    def __init__(self, *args, desktop_names=None, **kwargs):
        """`desktop_names`: id -> name of the desktops that may be chosen."""
        super().__init__(*args, **kwargs)
        self.names = desktop_names or {}
        self.fields["desktops"].choices = [(i, i) for i in self.names]

    def clean_label(self):
        return self.cleaned_data["label"].strip().lower()

    def clean(self):
        data = super().clean()
        if data.get("action") == "destroy":
            # Names, not a count: the person reads what goes. Names have no spaces nor commas.
            wanted = {self.names[i] for i in data.get("desktops", [])}
            if set(re.split(r"[\s,]+", data.get("confirm", "").strip())) - {""} != wanted:
                raise forms.ValidationError(
                    _(
                        "Nothing was destroyed: type the names of the selected desktops "
                        "(%(names)s) to destroy them."
                    )
                    % {"names": ", ".join(sorted(wanted))}
                )
        if data.get("action") in dict(LABEL_ACTIONS) and not data.get("label", "").strip():
            raise forms.ValidationError(_("Type the label to add or remove."))
        return data


class RenameForm(PageForm):
    name = forms.CharField(max_length=100, label=_lazy("Name"))


class AgentCommandForm(PageForm):
    command = forms.CharField(max_length=500, required=False, label=_lazy("Command"))


class EgressForm(forms.Form):
    mode = forms.ChoiceField(
        label=_lazy("Where agents may go"), choices=EgressMode.choices, widget=forms.RadioSelect
    )
    entries = forms.CharField(
        label=_lazy("Allowed domains and networks"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 40, "spellcheck": "false"}),
        help_text=_lazy(
            "One a line: a domain covers its subdomains (pypi.org), *.example.com only its subdomains; "
            "an IPv4 network as 203.0.113.0/24. Private, link-local and metadata networks stay closed."
        ),
    )
    allow_llm_providers = forms.BooleanField(
        label=_lazy("Also the APIs of this workspace's LLM keys"), required=False
    )

    def clean_entries(self) -> list[str]:
        return [line.strip() for line in self.cleaned_data["entries"].splitlines() if line.strip()]


class DesktopEgressForm(EgressForm):
    """A desktop's policy: its own, or its workspace's."""

    INHERIT = "inherit"
    mode = forms.ChoiceField(
        label=_lazy("Where this desktop's agent may go"),
        choices=[(INHERIT, _lazy("As its workspace says")), *EgressMode.choices],
        widget=forms.RadioSelect,
    )


class ApprovalPolicyForm(forms.Form):
    approval_role = forms.ChoiceField(
        choices=[(r.value, r.label) for r in (Role.MEMBER, Role.ADMIN, Role.OWNER)],
        label=_lazy("Who may answer"),
    )
    approval_timeout = forms.IntegerField(
        min_value=1, max_value=24 * 60, label=_lazy("Minutes a request waits before it is refused")
    )
    approval_commands = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4}),
        label=_lazy("Commands the agent runs only once approved (one a line, e.g. git push)"),
    )
    webhook_url = forms.URLField(
        required=False, max_length=500, assume_scheme="https", label=_lazy("Webhook (requests and answers)")
    )
    rotate_secret = forms.BooleanField(required=False, label=_lazy("New signing secret"))


class AlertThresholdsForm(PageForm):
    """One field per threshold of the workspace's alerts (desktops.alerts.THRESHOLDS)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, t in THRESHOLDS.items():
            self.fields[name] = forms.IntegerField(min_value=t.low, max_value=t.high, label=t.label)


class InviteForm(PageForm):
    email = forms.EmailField(label=_lazy("Email"))
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER, label=_lazy("Role"))


class RoleForm(PageForm):
    role = forms.ChoiceField(choices=Role.choices, label=_lazy("Role"))


class ApiKeyForm(PageForm):
    name = forms.CharField(max_length=100, label=_lazy("Name"))
    scope = forms.ChoiceField(choices=ApiScope.choices, initial=ApiScope.WRITE, label=_lazy("Scope"))
    expires_at = forms.DateTimeField(
        required=False, widget=forms.DateTimeInput(attrs={"type": "datetime-local"}), label=_lazy("Expires")
    )


class LLMKeyForm(PageForm):
    provider = forms.ChoiceField(choices=LLMProvider.choices, label=_lazy("Provider"))
    name = forms.CharField(max_length=100, label=_lazy("Name"))
    base_url = forms.URLField(
        required=False, label=_lazy("Base URL (OpenAI-compatible only)"), assume_scheme="https"
    )
    model = forms.CharField(
        max_length=200,
        required=False,
        label=_lazy("Model"),
        help_text=_lazy("Blank: the provider's own. Required for OpenAI-compatible."),
        widget=forms.TextInput(attrs={"placeholder": _lazy("Model (blank: provider's default)")}),
    )
    secret = forms.CharField(
        widget=forms.PasswordInput(attrs={"placeholder": _lazy("Key")}), label=_lazy("Key")
    )


class ModelPriceForm(PageForm):
    model = forms.CharField(
        max_length=200, label=_lazy("Model"), widget=forms.TextInput(attrs={"placeholder": _lazy("Model")})
    )
    input_per_million = forms.DecimalField(
        min_value=0,
        max_digits=10,
        decimal_places=4,
        label=_lazy("€ per million input tokens"),
        widget=forms.NumberInput(attrs={"placeholder": _lazy("€ per million in")}),
    )
    output_per_million = forms.DecimalField(
        min_value=0,
        max_digits=10,
        decimal_places=4,
        label=_lazy("€ per million output tokens"),
        widget=forms.NumberInput(attrs={"placeholder": _lazy("€ per million out")}),
    )


class RotateForm(PageForm):
    secret = forms.CharField(widget=forms.PasswordInput, label=_lazy("New key"))


class AuditFilterForm(PageForm):
    actor = forms.CharField(required=False, label=_lazy("Actor"))
    # Its code, or the start of one (desktop. for every act on desktops); the page lists them.
    action = forms.CharField(
        required=False, label=_lazy("Action"), widget=forms.TextInput(attrs={"list": "audit-actions"})
    )
    target = forms.CharField(required=False, label=_lazy("Target (name, e-mail or id)"))
    since = forms.DateField(
        required=False, widget=forms.DateInput(attrs={"type": "date"}), label=_lazy("Since")
    )
    until = forms.DateField(
        required=False, widget=forms.DateInput(attrs={"type": "date"}), label=_lazy("Until")
    )


class ScheduleForm(PageForm):
    cron = forms.CharField(
        max_length=100,
        label=_lazy("When (cron)"),
        help_text=_lazy("minute hour day month weekday, e.g. 0 9 * * 1-5: 9:00 on weekdays"),
    )
    timezone = forms.CharField(max_length=64, initial="Europe/Paris", label=_lazy("Time zone"))
    message = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), label=_lazy("Message for the agent"))
    stop_after = forms.BooleanField(required=False, label=_lazy("Stop the desktop after the answer"))
