"""Request results: a poll waits for the result or answers "try again"; another owner's request is not found.
API keys: the SDK's form, a file or the environment, one tenant per key; an open server stays on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentrl.tinker.errors import TinkerAuthError, TinkerNotFound, TinkerUserError
from agentrl.tinker.futures import Futures
from agentrl.tinker.keys import KEYS_ENV, KeyFileError, Keys, check_open, load_keys, owner_of


async def test_a_poll_waits_for_the_result_or_says_try_again() -> None:
    futures = Futures()
    fut = futures.create("alice", "optim_step")
    assert await futures.wait(fut.request_id, "alice", timeout_s=0.01) is None  # try again
    asyncio.get_running_loop().call_later(0.02, lambda: Futures.succeed(fut, json={"metrics": {}}))
    done = await futures.wait(fut.request_id, "alice", timeout_s=5)
    assert done is fut and fut.json == {"metrics": {}}


async def test_another_owners_request_is_not_found() -> None:
    futures = Futures()
    fut = futures.create("alice", "sample")
    with pytest.raises(TinkerNotFound):
        await futures.wait(fut.request_id, "bob", timeout_s=0.01)
    with pytest.raises(TinkerNotFound):
        futures.get("sample-unknown", "alice")


def test_failures_keep_their_category_and_old_results_are_forgotten() -> None:
    futures = Futures(kept=2)
    a, b, c = (futures.create("o", "k") for _ in range(3))
    Futures.fail(a, TinkerUserError("bad input"))
    Futures.fail(b, ValueError("oops"))
    assert (a.error, a.category) == ("bad input", "user") and (b.error, b.category) == ("ValueError: oops", "server")
    futures.create("o", "k")  # a finished one goes first; a pending one (c) stays
    with pytest.raises(TinkerNotFound):
        futures.get(a.request_id, "o")
    assert futures.get(c.request_id, "o") is c


def test_keys_from_a_file_or_the_environment(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("# ours\ntml-aaaaaaaaaa\n\ntml-bbbbbbbbbb\n")
    keys = load_keys(f, environ={})
    assert keys == ["tml-aaaaaaaaaa", "tml-bbbbbbbbbb"]
    assert load_keys(None, environ={KEYS_ENV: "tml-cccccccccc, tml-dddddddddd"}) == ["tml-cccccccccc", "tml-dddddddddd"]
    assert load_keys(None, environ={}) is None
    f.write_text("sk-not-tinker-form\n")
    with pytest.raises(KeyFileError, match="'tml-'"):
        load_keys(f, environ={})
    with pytest.raises(KeyFileError, match="cannot read"):
        load_keys(tmp_path / "missing", environ={})


def test_each_key_is_its_own_owner_and_an_unknown_key_is_refused() -> None:
    keys = Keys(["tml-aaaaaaaaaa", "tml-bbbbbbbbbb"])
    assert keys.owner("tml-aaaaaaaaaa") == owner_of("tml-aaaaaaaaaa") != keys.owner("tml-bbbbbbbbbb")
    with pytest.raises(TinkerAuthError, match="unknown API key"):
        keys.owner("tml-cccccccccc")
    with pytest.raises(TinkerAuthError, match="X-API-Key"):
        keys.owner(None)
    open_keys = Keys(None)
    assert open_keys.owner("tml-anything-at-all") == owner_of("tml-anything-at-all")
    with pytest.raises(TinkerAuthError, match="start with 'tml-'"):
        open_keys.owner("sk-123")


def test_an_open_server_binds_to_loopback_only() -> None:
    check_open(None, "127.0.0.1")
    check_open(["tml-aaaaaaaaaa"], "0.0.0.0")
    with pytest.raises(KeyFileError, match="needs API keys"):
        check_open(None, "0.0.0.0")
