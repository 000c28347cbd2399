"""The session store: admission (limits), lookup, idle/age expiry by a named reaper task, and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from agentrl.config.server import ServerConfig
from agentrl.http.errors import ApiError
from agentrl.http.limits import Admission
from agentrl.http.server.catalog import EnvCatalog
from agentrl.http.server.metrics import Metrics
from agentrl.http.server.protocol import CreateSession, SessionCreated
from agentrl.http.server.session import EnvFailure, Session

log = logging.getLogger("agentrl.http.server")

REAPER_TASK_NAME = "agentrl-env-session-reaper"


class SessionManager:
    """Owns every open session; each holds an environment instance (and its sandboxes) until closed."""

    def __init__(self, config: ServerConfig, catalog: EnvCatalog, metrics: Metrics) -> None:
        self.config = config
        self.catalog = catalog
        self.metrics = metrics
        self.sessions: dict[str, Session] = {}
        self.admission = Admission(config.max_sessions, config.max_sessions_per_client)
        self._creating: dict[tuple[str, str], asyncio.Future[SessionCreated]] = {}
        self._key_of: dict[str, tuple[str, str]] = {}
        self._reaper: asyncio.Task[None] | None = None
        self._closing = False
        metrics.gauge("agentrl_env_sessions_open", "Open sessions.", lambda: len(self.sessions))

    # ----- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the reaper (idempotent); sessions are admitted from now on."""
        self._closing = False
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap_loop(), name=REAPER_TASK_NAME)

    async def shutdown(self) -> None:
        """Stop the reaper and close every session (concurrently, each bounded by ``close_timeout_s``)."""
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        sessions = list(self.sessions)
        await asyncio.gather(
            *(self.close(sid, "shutdown", wait_s=5.0) for sid in sessions), return_exceptions=True
        )
        if sessions:
            log.info("closed %d session(s) at shutdown", len(sessions))

    # ----- sessions -----------------------------------------------------------------------------------
    async def create(self, req: CreateSession, client: str, key: str | None = None) -> SessionCreated:
        """Open a session for ``client``; with ``key`` (Idempotency-Key) a retried create returns the same
        session instead of opening a second one."""
        if self._closing:
            raise ApiError(503, "the server is shutting down")
        if key is not None:
            pending = self._creating.get((client, key))
            if pending is not None:
                try:
                    return await asyncio.shield(pending)
                except asyncio.CancelledError:
                    if not pending.cancelled():
                        raise  # this request was cancelled; else the first create was: make a new one
        name, cls = self.catalog.resolve(req.env)
        task = self.catalog.task_for(name, req.task_id, req.split, req.task)
        self.admission.admit(client)
        session = Session(name, cls, task, client, self.config, self.metrics)
        future: asyncio.Future[SessionCreated] = asyncio.get_running_loop().create_future()
        if key is not None:
            self._creating[(client, key)] = future
            self._key_of[session.id] = (client, key)
        try:
            created = await session.open()
        except BaseException as e:
            self.admission.release(client)
            if key is not None:
                self._creating.pop((client, key), None)
                self._key_of.pop(session.id, None)
            if isinstance(e, EnvFailure):
                self.metrics.inc("agentrl_env_session_errors_total", "Sessions whose reset failed.", env=name)
                err = ApiError(
                    422,
                    f"environment {name!r} could not start task {session.task_id[:100]!r}: {e}",
                    code="env_error",
                )
                future.set_exception(err)
                future.exception()  # mark retrieved
                raise err from None
            future.cancel()
            raise
        self.sessions[session.id] = session
        future.set_result(created)
        self.metrics.inc("agentrl_env_sessions_created_total", "Sessions created, by environment.", env=name)
        return created

    def get(self, session_id: str) -> Session:
        """The open session ``session_id``; raises ``ApiError(404)``."""
        session = self.sessions.get(session_id)
        if session is None or session.closed:
            raise ApiError(
                404, f"unknown session {session_id[:64]!r} (closed, expired, or the server restarted)"
            )
        return session

    async def close(self, session_id: str, reason: str = "client", *, wait_s: float | None = None) -> bool:
        """Close a session and release its resources; False if it was not open.

        Waits (bounded) for a step in flight to finish, so tools and ``close`` never overlap unless the
        step overruns its time limit."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            return False
        self.admission.release(session.client)
        key = self._key_of.pop(session_id, None)
        if key is not None:
            self._creating.pop(key, None)
        wait = self.config.step_timeout_s + 5.0 if wait_s is None else wait_s
        try:
            await asyncio.wait_for(session.lock.acquire(), timeout=wait)
            locked = True
        except asyncio.TimeoutError:
            locked = False
            log.warning("session %s: closing while a step is still running", session_id)
        try:
            await session.close()
        finally:
            if locked:
                session.lock.release()
        self.metrics.inc("agentrl_env_sessions_closed_total", "Sessions closed, by reason.", reason=reason)
        return True

    async def reap(self) -> int:
        """Close sessions idle for longer than ``session_ttl_s`` or older than ``max_session_age_s``."""
        now = time.monotonic()
        expired = []
        for sid, s in list(self.sessions.items()):
            if now - s.created > self.config.max_session_age_s:
                expired.append((sid, "max_age"))
            elif now - s.last_active > self.config.session_ttl_s and not s.lock.locked():
                expired.append((sid, "idle"))
        for sid, why in expired:
            log.info("session %s expired (%s)", sid, why)
            await self.close(sid, why, wait_s=1.0)
        return len(expired)

    async def _reap_loop(self) -> None:
        interval = min(self.config.reap_interval_s, max(0.05, self.config.session_ttl_s / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                await self.reap()
            except asyncio.CancelledError:
                raise
            except Exception:  # the reaper must survive anything
                log.exception("session reaper failed; retrying")
