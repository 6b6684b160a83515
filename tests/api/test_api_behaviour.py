from datetime import timedelta

import pytest
from django.db import ProgrammingError, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from desktops import crypto
from desktops.audit import SYSTEM, audit_record
from desktops.models import ApiKey, AuditEvent, ChatMessage, Desktop, DesktopState, LLMKey, Role
from tests.conftest import client_for
from tests.factories import PASSWORD, DesktopFactory, MembershipFactory, api_key_for


@pytest.fixture
def owner(members):
    return members[Role.OWNER]


@pytest.fixture
def api(owner, plan):
    return client_for(key=api_key_for(owner))


# The seed documents' calls, as written apart from the host


def test_seed_curl_create_then_list(api, workspace):
    created = api.post("/api/desktops", {"name": "ci-agent", "workspaceId": workspace.id}, format="json")
    assert created.status_code == 201
    body = created.json()
    assert body["id"].startswith("dsk_") and body["workspaceId"] == workspace.id
    assert body["state"] == "provisioning" and body["plan"]["name"] == "starter"
    listed = api.get("/api/desktops").json()
    assert [d["id"] for d in listed["results"]] == [body["id"]]


def test_seed_curl_send_a_task(api, workspace):
    desktop = DesktopFactory(workspace=workspace)
    body = {"message": "Lance la suite de tests et rapporte les résultats"}
    response = api.post(f"/api/desktops/{desktop.id}/chat", body, format="json")
    assert response.status_code == 202
    reply = response.json()
    assert reply["author"] == "agent" and reply["status"] == "queued" and reply["replyTo"].startswith("msg_")
    conversation = api.get(f"/api/desktops/{desktop.id}/chat").json()["results"]
    assert [(m["author"], m["content"]) for m in conversation] == [
        ("operator", body["message"]),
        ("agent", ""),
    ]
    assert api.post(f"/api/desktops/{desktop.id}/chat", {"message": "  "}, format="json").status_code == 400
    audit = AuditEvent.objects.get(action="chat.send")
    assert body["message"] not in str(audit.detail)


def test_list_filters_and_paginates(api, workspace):
    DesktopFactory.create_batch(3, workspace=workspace, state=DesktopState.RUNNING)
    DesktopFactory(workspace=workspace, state=DesktopState.STOPPED)
    DesktopFactory(workspace=workspace, state=DesktopState.DESTROYED)
    assert api.get("/api/desktops").json()["count"] == 4
    assert api.get("/api/desktops?state=stopped").json()["count"] == 1
    assert api.get("/api/desktops?state=destroyed").json()["count"] == 1
    page = api.get("/api/desktops?pageSize=2").json()
    assert len(page["results"]) == 2 and page["next"]
    bad = api.get("/api/desktops?state=sleeping")
    assert bad.status_code == 400 and "state" in bad.json()["error"]["fields"]


# Errors


@pytest.mark.parametrize(
    ("name", "field_message"),
    [("Bad_Name", "lowercase"), ("-edge", "hyphen"), ("x" * 64, "63"), ("", "blank")],
)
def test_bad_names_are_400_with_the_field(api, name, field_message):
    response = api.post("/api/desktops", {"name": name}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid" and field_message in " ".join(error["fields"]["name"])
    assert not Desktop.objects.exists()


def test_duplicate_name_is_409(api, workspace):
    DesktopFactory(workspace=workspace, name="taken")
    response = api.post("/api/desktops", {"name": "taken"}, format="json")
    assert response.status_code in (400, 409)
    assert "already exists" in response.json()["error"]["message"]


def test_unknown_plan_names_the_choices(api):
    response = api.post("/api/desktops", {"name": "a", "plan": "gold"}, format="json")
    assert response.status_code == 400
    assert "starter" in response.json()["error"]["message"]


def test_unknown_api_path_is_json_404(owner):
    # CSRF checked as for a browser: an unknown path answers the same to a POST.
    api = APIClient(enforce_csrf_checks=True)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key_for(owner)}")
    for method, path in [("get", "/api/nothing-here"), ("post", "/api/nothing-here"), ("get", "/api/a%0Ab/")]:
        response = getattr(api, method)(path)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("query", "field"),
    [("page=0", "page"), ("page=two", "page"), ("pageSize=0", "pageSize"), ("pageSize=201", "pageSize")],
)
def test_a_page_or_page_size_out_of_bounds_is_400_naming_it(api, query, field):
    response = api.get(f"/api/desktops?{query}")
    assert response.status_code == 400 and field in response.json()["error"]["fields"]


def test_the_last_page_and_a_page_past_it(api, workspace):
    DesktopFactory.create_batch(3, workspace=workspace)
    assert len(api.get("/api/desktops?pageSize=2&page=last").json()["results"]) == 1
    assert api.get("/api/desktops?pageSize=2&page=3").status_code == 404


def test_an_empty_query_value_is_refused_not_ignored(api):
    response = api.get("/api/desktops?workspace=")
    assert response.status_code == 400 and "workspace" in response.json()["error"]["fields"]


def test_a_text_field_takes_only_a_string(api):
    response = api.post("/api/desktops", {"name": 123}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"name": ["Not a valid string."]}
    assert not Desktop.objects.exists()


def test_options_and_the_browsable_pages_answer_on_every_endpoint(api, owner, workspace):
    desktop = DesktopFactory(workspace=workspace)
    body = {"workspaceId": workspace.id, "provider": "openai", "name": "k", "secret": "sk-test-12345678"}
    llm_key = api.post("/api/llm-keys", body, format="json").json()["id"]
    paths = [
        "/api/desktops",
        f"/api/desktops/{desktop.id}",
        f"/api/desktops/{desktop.id}/events",
        f"/api/desktops/{desktop.id}/chat",
        "/api/plans",
        "/api/workspaces",
        f"/api/workspaces/{workspace.id}",
        f"/api/workspaces/{workspace.id}/members",
        "/api/keys",
        "/api/llm-keys",
        f"/api/llm-keys/{llm_key}",
        "/api/audit",
    ]
    for path in paths:
        options = api.options(path)
        assert options.status_code == 200, path
        assert "GET" in options["Allow"] and "actions" not in options.json(), path
        page = api.get(path, HTTP_ACCEPT="text/html")
        assert page.status_code == 200 and page["Content-Type"].startswith("text/html"), path


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'\xff\xfe{"name": 1}', b"[" * 100_000 + b"]" * 100_000],
    ids=["malformed", "not-utf-8", "nested-past-the-recursion-limit"],
)
def test_malformed_json_is_400_and_nothing_is_stored(api, body):
    response = api.post("/api/desktops", body, content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["message"]
    assert not Desktop.objects.exists()


def test_an_oversized_or_non_utf8_chat_message_is_400_and_nothing_is_stored(api, workspace):
    desktop = DesktopFactory(workspace=workspace)
    url = f"/api/desktops/{desktop.id}/chat"
    too_long = api.post(url, {"message": "x" * 32_001}, format="json")
    assert too_long.status_code == 400 and too_long.json()["error"]["fields"]["message"]
    lone_surrogate = api.post(url, b'{"message": "\\udc80"}', content_type="application/json")
    assert lone_surrogate.status_code == 400
    assert not ChatMessage.objects.filter(desktop=desktop).exists()


def test_illegal_transition_is_409_naming_the_state(api, workspace):
    desktop = DesktopFactory(workspace=workspace, state=DesktopState.STOPPED)
    response = api.post(f"/api/desktops/{desktop.id}/stop")
    assert response.status_code == 409
    assert "stopped" in response.json()["error"]["message"]


# Platform keys


def test_key_is_shown_once_and_stored_as_hash(owner, workspace):
    client = client_for(owner)
    created = client.post(
        "/api/keys", {"workspaceId": workspace.id, "name": "ci", "scope": "read"}, format="json"
    )
    assert created.status_code == 201
    token = created.json()["key"]
    key = ApiKey.objects.get(id=created.json()["id"])
    assert key.hashed == crypto.api_token_hash(token) and token not in key.hashed
    listed = client.get("/api/keys").json()["results"]
    assert "key" not in listed[0] and listed[0]["prefix"] == key.prefix
    assert token not in str(AuditEvent.objects.values_list("detail", "target"))


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("Bearer lb_nothere_xxxxxxxx", "not valid"),
        ("Bearer", "Bearer <key>"),
        ("Bearer garbage", "not valid"),
    ],
)
def test_bad_keys_are_401(db, header, message):
    response = client_for().get("/api/desktops", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401 and message in response.json()["error"]["message"]


def test_revoked_and_expired_keys_are_401(owner):
    expired = api_key_for(owner, expires_at=timezone.now() - timedelta(minutes=1))
    assert client_for(key=expired).get("/api/plans").status_code == 401
    token = api_key_for(owner)
    ApiKey.objects.filter(prefix=crypto.api_token_prefix(token)).update(revoked_at=timezone.now())
    response = client_for(key=token).get("/api/plans")
    assert response.status_code == 401 and "revoked" in response.json()["error"]["message"]


def test_read_key_cannot_write(owner, plan):
    client = client_for(key=api_key_for(owner, scope="read"))
    assert client.get("/api/desktops").status_code == 200
    response = client.post("/api/desktops", {"name": "nope"}, format="json")
    assert response.status_code == 403 and "read-only" in response.json()["error"]["message"]


def test_key_stops_working_when_its_creator_leaves(members, plan):
    member = members[Role.MEMBER]
    client = client_for(key=api_key_for(member))
    assert client.get(f"/api/workspaces/{member.workspace_id}").status_code == 200
    member.delete()
    assert client.get(f"/api/workspaces/{member.workspace_id}").status_code == 404


def test_last_used_is_recorded(owner):
    token = api_key_for(owner)
    client_for(key=token).get("/api/plans")
    assert ApiKey.objects.get(prefix=crypto.api_token_prefix(token)).last_used_at is not None


def test_no_auth_is_401_with_bearer_challenge(db):
    response = client_for().get("/api/desktops")
    assert response.status_code == 401 and response["WWW-Authenticate"] == "Bearer"


# BYOK keys


def test_llm_secret_is_encrypted_and_never_returned(owner, workspace):
    client = client_for(owner)
    secret = "sk-live-abcdefghijklmnop1234"
    created = client.post(
        "/api/llm-keys",
        {"workspaceId": workspace.id, "provider": "openai", "name": "main", "secret": secret},
        format="json",
    )
    assert created.status_code == 201
    assert secret not in created.content.decode() and created.json()["last4"] == "1234"
    stored = LLMKey.objects.get()
    assert secret not in stored.secret_encrypted and crypto.secret_decrypt(stored.secret_encrypted) == secret
    for response in (client.get("/api/llm-keys"), client.get(f"/api/llm-keys/{stored.id}")):
        assert secret not in response.content.decode()
    assert secret not in str(list(AuditEvent.objects.values("detail", "target", "actor")))


def test_llm_openai_compatible_needs_base_url(owner, workspace):
    body = {
        "workspaceId": workspace.id,
        "provider": "openai_compatible",
        "name": "local",
        "secret": "sk-12345678",
    }
    response = client_for(owner).post("/api/llm-keys", body, format="json")
    assert response.status_code == 400 and "baseUrl" in response.json()["error"]["fields"]


def test_llm_openai_compatible_needs_a_model(owner, workspace):
    body = {
        "workspaceId": workspace.id,
        "provider": "openai_compatible",
        "name": "local",
        "baseUrl": "http://10.0.0.5:8080/v1",
        "secret": "sk-12345678",
    }
    response = client_for(owner).post("/api/llm-keys", body, format="json")
    assert response.status_code == 400 and "model" in response.json()["error"]["fields"]
    assert not LLMKey.objects.exists()


def test_the_agent_configuration_holds_every_key_newest_first(owner, workspace):
    from desktops.agent_config import GATEWAY_PORT, WARMUP_PROVIDER, gateway_token, openclaw_config

    client = client_for(owner)
    for provider, name, extra in (
        ("anthropic", "claude", {}),
        ("openrouter", "router", {"model": "meta/llama-4"}),
        ("openai_compatible", "vllm", {"baseUrl": "http://10.0.0.5:8080/v1", "model": "qwen3"}),
    ):
        body = {
            "workspaceId": workspace.id,
            "provider": provider,
            "name": name,
            "secret": f"sk-{name}-123456",
            **extra,
        }
        assert client.post("/api/llm-keys", body, format="json").status_code == 201
    keys = list(LLMKey.objects.order_by("-created_at"))
    config = openclaw_config(desktop_id="dsk_abc", keys=keys)

    providers = config["models"]["providers"]
    vllm, router, claude = (providers[k.id.replace("_", "-")] for k in keys)
    assert vllm == {
        "baseUrl": "http://10.0.0.5:8080/v1",
        "apiKey": "sk-vllm-123456",
        "api": "openai-completions",
        # Taken to see images: the agent's screenshots of its screen reach it.
        "models": [
            {
                "id": "qwen3",
                "name": "qwen3",
                "input": ["text", "image"],
                "compat": {"supportsUsageInStreaming": True},
            }
        ],
    }
    assert router["baseUrl"] == "https://openrouter.ai/api/v1" and router["models"][0]["id"] == "meta/llama-4"
    assert claude["api"] == "anthropic-messages" and claude["models"][0]["id"] == "claude-sonnet-4-5"
    model = config["agents"]["defaults"]["model"]
    assert model["primary"].endswith("/qwen3") and len(model["fallbacks"]) == 2
    gateway = config["gateway"]
    assert gateway["port"] == GATEWAY_PORT and gateway["bind"] == "loopback"
    # Stable per desktop, different between desktops.
    assert gateway["auth"]["token"] == gateway_token("dsk_abc") != gateway_token("dsk_xyz")
    assert "agents" not in openclaw_config(desktop_id="dsk_abc", keys=[])
    # Besides the keys, only the desktop's own warm-up model, on its loopback.
    assert providers.keys() - {k.id.replace("_", "-") for k in keys} == WARMUP_PROVIDER.keys()
    assert all(p["baseUrl"].startswith("http://127.0.0.1:") for p in WARMUP_PROVIDER.values())
    # Our approvals plugin is loaded (told where to show the agent's commands) beside the screen's, and
    # OpenClaw's exec policy set explicitly rather than defaulted.
    assert config["plugins"] == {
        "load": {"paths": ["~/.openclaw/bureau/bureau-approvals", "~/.openclaw/bureau/bureau-screen"]},
        "entries": {
            "bureau-approvals": {
                "enabled": True,
                "config": {"screen": {"display": ":0", "title": "The agent's commands"}},
            },
            "bureau-screen": {"enabled": True},
        },
    }
    assert config["tools"]["exec"] == {"host": "gateway", "security": "full", "ask": "off"}
    # The browser is the image's Chromium, drawn on the desktop's screen (its display in the gateway's
    # environment), never headless.
    browser = config["browser"]
    assert (browser["headless"], browser["executablePath"]) == (False, "/usr/bin/chromium")
    assert config["env"]["vars"] == {"DISPLAY": ":0"}


# Workspaces and members


def test_the_agent_command_takes_the_message_and_nothing_unknown(owner, workspace):
    client = client_for(owner)
    url = f"/api/workspaces/{workspace.id}"
    bad_commands = (
        "my-agent --task",
        "my-agent {message} {model}",
        "my-agent {message",
        'sh -c "my-agent {message}"',  # $(…) in a message would run inside those quotes
        "sh -c 'my-agent --id {session}' {message}",
    )
    for bad in bad_commands:
        response = client.patch(url, {"agentCommand": bad}, format="json")
        assert response.status_code == 400 and "agentCommand" in response.json()["error"]["fields"], bad
    good = "crew run --id {session} -- {message}"
    assert client.patch(url, {"agentCommand": good}, format="json").json()["agentCommand"] == good
    reset = client.patch(url, {"agentCommand": ""}, format="json").json()
    assert reset["agentCommand"].startswith("bureau openclaw") and reset["name"] == workspace.name


def test_last_owner_cannot_be_demoted_or_removed(owner, workspace):
    client = client_for(owner)
    response = client.patch(
        f"/api/workspaces/{workspace.id}/members/{owner.id}", {"role": "admin"}, format="json"
    )
    assert response.status_code == 409
    assert client.delete(f"/api/workspaces/{workspace.id}/members/{owner.id}").status_code == 409


def test_an_admin_cannot_demote_or_remove_an_owner(members, workspace):
    admin = client_for(members[Role.ADMIN])
    owner = members[Role.OWNER]
    MembershipFactory(workspace=workspace, role=Role.OWNER)  # not the last owner: only the role stops it
    url = f"/api/workspaces/{workspace.id}/members/{owner.id}"
    assert admin.patch(url, {"role": "viewer"}, format="json").status_code == 403
    assert admin.delete(url).status_code == 403
    owner.refresh_from_db()
    assert owner.role == Role.OWNER


def test_admin_cannot_make_an_owner(members, workspace):
    client = client_for(members[Role.ADMIN])
    url = f"/api/workspaces/{workspace.id}/members/{members[Role.VIEWER].id}"
    assert client.patch(url, {"role": "owner"}, format="json").status_code == 400


def test_workspace_with_desktops_cannot_be_deleted(owner, workspace):
    DesktopFactory(workspace=workspace)
    response = client_for(owner).delete(f"/api/workspaces/{workspace.id}")
    assert response.status_code == 409 and "Destroy" in response.json()["error"]["message"]


# Audit


def test_what_people_do_is_audited_with_the_request_id_and_reads_are_not(api, workspace):
    response = api.post("/api/desktops", {"name": "audited"}, format="json", HTTP_X_REQUEST_ID="req-123")
    desktop_id = response.json()["id"]
    events = AuditEvent.objects.filter(request_id="req-123")
    assert list(events.values_list("action", flat=True)) == ["desktop.create"]
    assert all(e.workspace_id == workspace.id and e.actor.startswith("key:") for e in events)
    assert events.get().target == desktop_id
    before = AuditEvent.objects.count()
    for _ in range(5):
        api.get("/api/desktops")
        api.get(f"/api/desktops/{desktop_id}")
    assert AuditEvent.objects.count() == before, "reading (a page polling) wrote to the audit trail"
    listed = api.get(f"/api/audit?workspace={workspace.id}&action=desktop.").json()["results"]
    assert [e["action"] for e in listed] == ["desktop.create"]


def test_anonymous_requests_write_nothing_to_the_audit_trail(client, db):
    before = AuditEvent.objects.count()
    for _ in range(20):
        client.get("/api/desktops")
        client.post("/api/desktops", {"name": "x"})
    assert AuditEvent.objects.count() == before


def test_an_outsiders_body_is_not_read_before_their_access_is_refused(members, workspace):
    """An outsider's megabytes used to be parsed before the 404, slowing every request meanwhile."""
    desktop = DesktopFactory(workspace=workspace)
    outsider = client_for(key=api_key_for(members["outsider"]))
    huge = '{"message": "' + "x" * 200_000 + '"}'
    response = outsider.post(f"/api/desktops/{desktop.id}/chat", huge, content_type="application/json")
    assert response.status_code == 404
    too_big = '{"message": "' + "x" * 300_000 + '"}'
    member = client_for(key=api_key_for(members[Role.MEMBER]))
    response = member.post(f"/api/desktops/{desktop.id}/chat", too_big, content_type="application/json")
    assert response.status_code == 413 and response.json()["error"]["code"] == "too_large"


def test_audit_trail_is_append_only(db):
    event = audit_record(actor=SYSTEM, action="test")
    with pytest.raises(ProgrammingError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(id=event.id).update(action="forged")
    with pytest.raises(ProgrammingError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(id=event.id).delete()


def test_login_creates_a_workspace_and_is_audited(client, user):
    response = client.post("/accounts/login/", {"login": user.email, "password": PASSWORD})
    assert response.status_code == 302
    assert user.memberships.get().role == Role.OWNER
    assert AuditEvent.objects.filter(action="auth.login", actor=f"user:{user.email}").exists()
    client.post("/accounts/logout/")
    client.post("/accounts/login/", {"login": user.email, "password": "wrong"})
    failed = AuditEvent.objects.get(action="auth.login_failed")
    assert "wrong" not in str(failed.detail) + failed.target
    assert user.memberships.count() == 1


def test_session_auth_works_for_the_ui(owner):
    assert client_for(owner).get("/api/desktops").status_code == 200


# Schema and docs


def test_openapi_schema_and_docs(api, owner):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert "/api/desktops/" in schema.json()["paths"]
    docs = client_for(owner).get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()
