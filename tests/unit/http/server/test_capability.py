"""Capability URLs of OpenEnv/MCP clients: per-client, unforgeable without the server's token."""

from __future__ import annotations

import pytest

from agentrl.http.server.capability import NO_AUTH, base_url, mint, verify

TOKEN = "t" * 32


def test_each_client_has_its_own_valid_capability() -> None:
    a, b = mint(TOKEN, "alice"), mint(TOKEN, "bob")
    assert a != b and a.startswith("alice.") and b.startswith("bob.")
    assert verify(TOKEN, a) == "alice" and verify(TOKEN, b) == "bob"
    assert base_url("http://h:1/", TOKEN, "alice") == f"http://h:1/openenv/{a}"


@pytest.mark.parametrize("cap", ["", "alice", "alice.", ".abc", "alice." + "0" * 32, "bob." + "x" * 40,
                                 "al ice." + "0" * 32])
def test_forged_or_malformed_capabilities_are_refused(cap: str) -> None:
    assert verify(TOKEN, cap) is None


def test_a_capability_is_bound_to_its_name_and_token() -> None:
    mac = mint(TOKEN, "alice").split(".")[1]
    assert verify(TOKEN, f"bob.{mac}") is None
    assert verify("u" * 32, mint(TOKEN, "alice")) is None


def test_without_auth_any_capability_is_accepted() -> None:
    assert mint(None) == NO_AUTH and verify(None, "anything") == "default"


def test_client_names_are_checked() -> None:
    with pytest.raises(ValueError, match="client name"):
        mint(TOKEN, "a/b")
