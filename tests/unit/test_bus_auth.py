"""Bus identities' permissions and the server's users block (shared/contract/bus_auth.py); what the server does
with them is tests/e2e/test_bus_auth.py."""

from __future__ import annotations

import json

import pytest

from shared.contract import bus_auth, subjects


@pytest.mark.parametrize(("url", "user", "password", "expected"), [
    ("nats://127.0.0.1:4222", "tenant.vision.ab12", "pw", "nats://tenant.vision.ab12:pw@127.0.0.1:4222"),
    ("tls://nats:4222", "service.allocator", "a/b@c", "tls://service.allocator:a%2Fb%40c@nats:4222"),
    ("nats://old:secret@host:4222", "alerts.k1", "new", "nats://alerts.k1:new@host:4222"),
])
def test_a_url_carries_a_user_and_shows_no_password(url: str, user: str, password: str, expected: str) -> None:
    with_user = bus_auth.url_with_user(url, user, password)
    assert with_user == expected
    assert bus_auth.user_of(with_user) == user
    assert password not in bus_auth.redact(with_user) and "***" in bus_auth.redact(with_user)
    assert bus_auth.client_options(with_user) == {"inbox_prefix": f"_I.{user}"}


def test_a_url_without_a_user_has_no_inbox_of_its_own() -> None:
    assert bus_auth.client_options("nats://127.0.0.1:4222") == {}
    assert bus_auth.redact("nats://127.0.0.1:4222") == "nats://127.0.0.1:4222"


@pytest.mark.parametrize(("user", "tenant"), [
    ("tenant.vision.ab12", "vision"), ("alerts.ab12", None), ("service.allocator", None), ("admin.local", None),
    ("tenant.vision", None),
])
def test_the_tenant_of_a_user(user: str, tenant: str | None) -> None:
    assert bus_auth.tenant_of_user(user) == tenant


def test_a_tenant_may_publish_its_own_subjects_and_create_consumers_of_its_own_statuses() -> None:
    permissions = bus_auth.permissions("tenant", "tenant.vision.k", "vision")
    assert permissions["publish"]["allow"] == [
        subjects.submit("vision"), subjects.release("vision"),
        "$JS.API.CONSUMER.CREATE.CLAIMBROKER_STATUS.*.claimbroker.v1.claims.status.vision.>"]
    assert permissions["publish"]["deny"] == ["$JS.API.CONSUMER.CREATE.CLAIMBROKER_STATUS.notifier.>"]
    assert permissions["subscribe"] == {"allow": ["_I.tenant.vision.k.>"]}


@pytest.mark.parametrize(("role", "user", "publishes", "reads"), [
    ("alerts", "alerts.k", [], [subjects.ALERTS_ALL, "_I.alerts.k.>"]),
    ("service", "service.watcher", [subjects.INVENTORY_ALL, subjects.ALERTS_ALL, "$JS.API.>", "$JS.ACK.>", "$JS.FC.>"],
     ["_I.service.watcher.>"]),
    ("service", "service.allocator", [subjects.STATUS_ALL, subjects.ALERTS_ALL, "$JS.API.>", "$JS.ACK.>", "$JS.FC.>"],
     ["_I.service.allocator.>"]),
    ("admin", "admin.local", [">"], [">"]),
])
def test_what_other_identities_may_do(role: str, user: str, publishes: list[str], reads: list[str]) -> None:
    permissions = bus_auth.permissions(role, user)
    assert permissions["publish"].get("allow", []) == publishes
    assert permissions["subscribe"]["allow"] == reads
    if role == "alerts":
        assert permissions["publish"]["deny"] == [">"]


def test_a_tenant_credential_names_its_tenant_and_roles_are_known() -> None:
    with pytest.raises(ValueError, match="names its tenant"):
        bus_auth.permissions("tenant", "tenant.x.k")
    with pytest.raises(ValueError, match="unknown bus role"):
        bus_auth.permissions("root", "root.k")


def test_the_users_block_is_sorted_json_with_hashes_only() -> None:
    users = [bus_auth.BusUser("tenant.vision.k", "$2b$10$hash", "tenant", "vision"),
             bus_auth.BusUser("admin.local", "$2b$10$other", "admin")]
    text = bus_auth.render_authorization(users)
    assert text.startswith("authorization ")
    block = json.loads(text.removeprefix("authorization "))
    assert [u["user"] for u in block["users"]] == ["admin.local", "tenant.vision.k"]
    assert block["users"][1]["password"] == "$2b$10$hash"
    assert block["users"][1]["permissions"] == bus_auth.permissions("tenant", "tenant.vision.k", "vision")


@pytest.mark.parametrize("name", ["", "a.b", "a b", "a*", "a>"])
def test_names_that_are_no_subject_token_are_refused(name: str) -> None:
    with pytest.raises(subjects.SubjectError):
        bus_auth.tenant_user(name, "k")
