"""What a Tinker request can fail with. Each error carries the HTTP status it answers with and the SDK's
error category (``user``: the request was wrong, ``server``: this server failed), which ``retrieve_future``
reports for a request that failed after it was accepted."""

from __future__ import annotations

from agentrl.core.errors import AgentRLError


class TinkerError(AgentRLError):
    """A Tinker request failed; ``status`` is its HTTP answer, ``category`` the SDK's error category."""

    code = "tinker"
    status = 500
    category = "server"


class TinkerUserError(TinkerError, ValueError):
    """The request cannot be served as sent (a bad value, a malformed body): HTTP 400, category ``user``."""

    code = "tinker.bad_request"
    status = 400
    category = "user"


class TinkerAuthError(TinkerError, PermissionError):
    """No API key, or one this server does not know: HTTP 401."""

    code = "tinker.unauthorized"
    status = 401
    category = "user"


class TinkerNotFound(TinkerUserError, LookupError):
    """No such session, model, sampler, checkpoint or request for this key (another key's are not found
    either): HTTP 404."""

    code = "tinker.not_found"
    status = 404


class TinkerGone(TinkerUserError):
    """The session was finished: HTTP 410, which ends the SDK's heartbeat."""

    code = "tinker.gone"
    status = 410


class SeqIdError(TinkerUserError):
    """A model's request arrived with a ``seq_id`` that leaves a gap no later request filled in time."""

    code = "tinker.seq_id"
