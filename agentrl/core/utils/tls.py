"""One TLS verification context for the HTTP clients agentrl makes over and over.

An ``httpx`` client builds its own context unless it is given one, reading the whole CA bundle, even for
plain ``http://`` URLs: 30 to 120 ms of CPU on a 2-core machine, which blocks the event loop each time. The
agent loop opens a client per remote episode and the run builds 16 connection pools per engine client, so
the contexts added up to seconds of stalled loop per rejoin and a sizeable share of a remote episode's cost.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context (its CA bundle, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``), built once
    per process and shared by every client (``verify=tls_context()``)."""
    return httpx.create_ssl_context()
