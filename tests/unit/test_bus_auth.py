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


def test_a_tenant_may_publish_its_own_subjects_and_read_its_own_stream_but_not_change_it() -> None:
    permissions = bus_auth.permissions("tenant", "tenant.vision.k", "vision")
    allowed = permissions["publish"]["allow"]
    assert allowed[:2] == [subjects.submit("vision"), subjects.release("vision")]
    assert {"$JS.API.DIRECT.GET.CLAIMBROKER_STATUS", "$JS.API.CONSUMER.>",
            "$JS.API.STREAM.INFO.CLAIMBROKER_STATUS"} <= set(allowed)
    assert not [s for s in allowed if any(w in s for w in ("CREATE.CLAIMBROKER", "DELETE", "PURGE", "UPDATE"))]
    assert "deny" not in permissions["publish"]  # what is not allowed is refused
    assert permissions["subscribe"] == {"allow": ["_I.tenant.vision.k.>", "claimbroker.v1.claims.status.vision.>"]}


@pytest.mark.parametrize(("role", "user", "tenant", "publishes", "reads"), [
    ("alerts", "alerts.k", None, [], [subjects.ALERTS_ALL, "_I.alerts.k.>"]),
    ("alerts", "alerts.vision.k", "vision", [], ["claimbroker.v1.alerts.*.*.vision", "_I.alerts.vision.k.>"]),
    ("service", "service.watcher", None,
     [subjects.INVENTORY_ALL, subjects.ALERTS_ALL, "$JS.API.>", "$JS.ACK.>", "$JS.FC.>"], ["_I.service.watcher.>"]),
    ("service", "service.allocator", None,
     [subjects.STATUS_ALL, subjects.ALERTS_ALL, subjects.SUBMIT_ALL, subjects.RELEASE_ALL, "$JS.API.>", "$JS.ACK.>",
      "$JS.FC.>"], ["_I.service.allocator.>"]),
    ("admin", "admin.local", None, [">"], [">"]),
])
def test_what_other_identities_may_do(role: str, user: str, tenant: str | None, publishes: list[str],
                                      reads: list[str]) -> None:
    permissions = bus_auth.permissions(role, user, tenant)
    assert permissions["publish"].get("allow", []) == publishes
    assert permissions["subscribe"]["allow"] == reads
    if role == "alerts":
        assert permissions["publish"]["deny"] == [">"]


def test_a_tenant_credential_names_its_tenant_and_roles_are_known() -> None:
    with pytest.raises(ValueError, match="names its tenant"):
        bus_auth.permissions("tenant", "tenant.x.k")
    with pytest.raises(ValueError, match="unknown bus role"):
        bus_auth.permissions("root", "root.k")


@pytest.mark.parametrize(("severity", "kind", "tenant", "subject"), [
    ("warning", "claim-rejected", "vision", "claimbroker.v1.alerts.warning.claim-rejected.vision"),
    ("critical", "node-lost", None, "claimbroker.v1.alerts.critical.node-lost._fleet"),
    ("warning", "invalid-message", "not a token", "claimbroker.v1.alerts.warning.invalid-message._fleet"),
    ("warning", "invalid-message", "a.b", "claimbroker.v1.alerts.warning.invalid-message._fleet"),
])
def test_an_alert_subject_ends_with_its_tenant_or_the_fleet(severity: str, kind: str, tenant: str | None,
                                                           subject: str) -> None:
    assert subjects.alert(severity, kind, tenant) == subject


USERS = [bus_auth.BusUser("tenant.vision.k", "$2b$10$hash", "tenant", "vision"),
         bus_auth.BusUser("alerts.vision.k", "$2b$10$al", "alerts", "vision"),
         bus_auth.BusUser("alerts.k", "$2b$10$fleet", "alerts"),
         bus_auth.BusUser("service.allocator", "$2b$10$svc", "service"),
         bus_auth.BusUser("admin.local", "$2b$10$other", "admin")]
LIMITS = bus_auth.TenantLimits(connections=3, subscriptions=40, consumers=5, status_bytes=1 << 20, replicas=3)


def accounts(users: list[bus_auth.BusUser], tenants: list[str],  # type: ignore[type-arg]
             bare: frozenset[str] | set[str] = frozenset()) -> dict:
    text = bus_auth.render_accounts(users, tenants, LIMITS, bare=bare)
    assert text.startswith("accounts ")
    return json.loads(text.removeprefix("accounts "))  # type: ignore[no-any-return]


def test_each_tenant_is_an_account_of_its_own_with_hashes_only() -> None:
    block = accounts(USERS, ["research"])  # research: a tenant whose credentials are all revoked
    assert set(block) == {"CLAIMBROKER", "tenant-vision", "tenant-research", "ALERTS"}
    assert [u["user"] for u in block["CLAIMBROKER"]["users"]] == ["admin.local", "service.allocator"]
    assert [u["user"] for u in block["tenant-vision"]["users"]] == ["alerts.vision.k", "tenant.vision.k"]
    assert block["tenant-research"]["users"] == [] and [u["user"] for u in block["ALERTS"]["users"]] == ["alerts.k"]
    assert block["tenant-vision"]["users"][1]["password"] == "$2b$10$hash"
    assert block["tenant-vision"]["users"][1]["permissions"] == bus_auth.permissions("tenant", "tenant.vision.k",
                                                                                    "vision")
    assert block["CLAIMBROKER"]["jetstream"] == "enabled" and "jetstream" not in block["ALERTS"]
    assert block["tenant-vision"]["jetstream"] == {"max_mem": 0, "max_file": 3 << 20, "max_streams": 1,
                                                   "max_consumers": 5}
    assert block["tenant-vision"]["limits"] == block["ALERTS"]["limits"] == {"max_connections": 3,
                                                                            "max_subscriptions": 40}


def test_what_crosses_between_the_broker_and_a_tenant() -> None:
    block = accounts(USERS, [])
    broker, vision = block["CLAIMBROKER"], block["tenant-vision"]
    to_vision = [e for e in broker["exports"] if e["accounts"] == ["tenant-vision"]]
    assert [(e.get("service"), e.get("stream")) for e in to_vision] == [
        ("claimbroker.v1.claims.submit.vision", None), ("claimbroker.v1.claims.release.vision", None),
        (None, "claimbroker.v1.claims.status.vision.>"), (None, "claimbroker.v1.alerts.*.*.vision")]
    assert {"stream": subjects.ALERTS_ALL, "accounts": ["ALERTS"]} in broker["exports"]
    assert {(i["service"]["subject"], i["to"]) for i in broker["imports"]} == {
        ("$JS.API.STREAM.CREATE.CLAIMBROKER_STATUS", "claimbroker.v1.provision.vision.create"),
        ("$JS.API.STREAM.INFO.CLAIMBROKER_STATUS", "claimbroker.v1.provision.vision.info"),
        ("$JS.API.STREAM.UPDATE.CLAIMBROKER_STATUS", "claimbroker.v1.provision.vision.update"),
        ("claimbroker.v1.claims.status.vision.>", "claimbroker.v1.provision.vision.status.>")}
    assert [e["service"] for e in vision["exports"]] == [i["service"]["subject"] for i in broker["imports"]]
    assert all(e["accounts"] == ["CLAIMBROKER"] for e in vision["exports"])
    assert [i.get("service", i.get("stream")) for i in vision["imports"]] == [
        {"account": "CLAIMBROKER", "subject": s} for s in (
            "claimbroker.v1.claims.submit.vision", "claimbroker.v1.claims.release.vision",
            "claimbroker.v1.claims.status.vision.>", "claimbroker.v1.alerts.*.*.vision")]


def test_a_new_tenant_account_comes_bare_first_and_a_rendered_block_says_which_tenants_it_serves() -> None:
    """Imports that arrive in the same reload as their account do nothing (nats-server 2.15): a new
    tenant's account is applied alone first, without users or anything crossing, then whole."""
    staged, whole = accounts(USERS, ["research"], bare={"vision"}), accounts(USERS, ["research"])
    assert staged["tenant-vision"] == {k: whole["tenant-vision"][k] for k in ("jetstream", "limits")} | {"users": []}
    assert not [e for e in staged["CLAIMBROKER"]["exports"] if e["accounts"] == ["tenant-vision"]]
    assert staged["tenant-research"] == whole["tenant-research"]  # an account the server has: whole
    text = bus_auth.render_accounts(USERS, ["research"], LIMITS)
    assert bus_auth.served_tenants(text) == {"vision", "research"}
    assert bus_auth.served_tenants("") == set()


def test_a_tenant_stream_keeps_the_last_status_of_each_claim_within_its_bytes() -> None:
    config = bus_auth.tenant_status_stream("vision", LIMITS)
    assert config["subjects"] == ["claimbroker.v1.claims.status.vision.>"] and config["name"] == "CLAIMBROKER_STATUS"
    assert (config["max_msgs_per_subject"], config["max_bytes"], config["discard"]) == (1, 1 << 20, "old")
    assert config["allow_direct"] is True and config["num_replicas"] == 3


def test_the_open_bus_is_the_broker_account_for_everyone() -> None:
    text = bus_auth.render_open()
    block = json.loads(text[len("accounts "):text.index("\nno_auth_user")])
    assert block == {"CLAIMBROKER": {"jetstream": "enabled", "users": [{"user": "open", "password": ""}]}}
    assert text.rstrip().endswith('no_auth_user: "open"')


@pytest.mark.parametrize("name", ["", "a.b", "a b", "a*", "a>"])
def test_names_that_are_no_subject_token_are_refused(name: str) -> None:
    with pytest.raises(subjects.SubjectError):
        bus_auth.tenant_user(name, "k")
