"""``agentrl bench env-server``: load test of the environment server on loopback.

``--sessions`` clients run episodes at once for ``--duration`` seconds: open a session, take tool steps,
answer (which ends and scores the episode), close, repeat. Every step's latency is recorded, and every
answer is checked (for ``calc`` the tool result must be the right number). Unless ``--url`` names a running
server, one is started as a subprocess (``agentrl serve-env``) and stopped at the end; for sandbox-backed
environments the bench then checks that no container of that server is left.

Prints human-readable lines, then as the LAST line one JSON object: ``steps``, ``steps_per_s``,
``step_ms_p50``, ``step_ms_p99``, ``episodes``, ``create_ms_p50``, ``errors`` (0 is the goal), ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.core.utils.lifeline import own_process, release_process
from agentrl.tools.bench.errors import BenchArgumentError, BenchFailed

if TYPE_CHECKING:
    from agentrl.tools.bench.http1 import Connection

SANDBOX_ENVS = ("swe", "shell", "agentrl.tools.bench.shell_env:ShellEnv")
"""Environments known to start a sandbox per session (the bench builds the image first)."""


def _pct_ms(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 2)


def _say(msg: str) -> None:
    print(msg, flush=True)


@dataclass
class LoadResult:
    """What the load generator measured."""

    step_s: list[float] = field(default_factory=list)
    create_s: list[float] = field(default_factory=list)
    close_s: list[float] = field(default_factory=list)
    episodes: int = 0
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        n = len(self.step_s)
        return {
            "steps": n,
            "steps_per_s": round(n / self.wall_s, 1) if self.wall_s else 0.0,
            "step_ms_p50": _pct_ms(self.step_s, 0.5),
            "step_ms_p99": _pct_ms(self.step_s, 0.99),
            "step_ms_max": _pct_ms(self.step_s, 1.0),
            "episodes": self.episodes,
            "episodes_per_s": round(self.episodes / self.wall_s, 2) if self.wall_s else 0.0,
            "create_ms_p50": _pct_ms(self.create_s, 0.5),
            "create_ms_p99": _pct_ms(self.create_s, 0.99),
            "close_ms_p50": _pct_ms(self.close_s, 0.5),
            "errors": len(self.errors),
            "error_samples": sorted(set(self.errors))[:5],
            "wall_s": round(self.wall_s, 2),
        }


def _default_action(info: dict[str, Any]) -> dict[str, Any] | None:
    """A harmless tool call for environments the bench knows how to drive (None: calc, checked maths)."""
    for t in info["tools"]:
        fn = t["function"]
        props = fn["parameters"].get("properties", {})
        for arg in ("command", "cmd"):
            if arg in props and props[arg].get("type") == "string":
                return {"name": fn["name"], "arguments": {arg: "echo ok"}}
    return None


async def run_load(
    url: str,
    token: str | None,
    *,
    env: str,
    sessions: int = 64,
    duration_s: float = 10.0,
    tool_steps: int = 2,
    action: dict[str, Any] | None = None,
    seed: int = 0,
    timeout_s: float = 120.0,
) -> LoadResult:
    """Drive ``sessions`` concurrent episodes of ``env`` on the server at ``url`` for ``duration_s``; each
    simulated client has its own keep-alive connection."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    out = LoadResult()
    info, page = await _served_env(url, headers, timeout_s, env)
    is_calc = info["name"] == "calc"
    if action is None and not is_calc:
        action = _default_action(info)
        if action is None:
            raise BenchArgumentError(f"no default tool call for {info['name']!r}: pass --action JSON")
    task_ids = [t["id"] for t in page["tasks"]]
    steps = max(0, min(tool_steps, info["max_turns"] - 1))
    deadline = time.monotonic() + duration_s
    clients = _LoadClients(
        url, headers, timeout_s, info["name"], task_ids, steps, action, is_calc, seed, deadline, out
    )
    t0 = time.perf_counter()
    await asyncio.gather(*(clients.worker(i) for i in range(sessions)))
    out.wall_s = time.perf_counter() - t0
    return out


async def _served_env(
    url: str, headers: dict[str, str], timeout_s: float, env: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The server's description of ``env`` (or of its only environment) and the first page of its tasks;
    raises when the server does not serve it or it has no tasks."""
    from agentrl.tools.bench.http1 import Connection

    setup = Connection(url, headers, timeout_s)
    try:
        status, body = await setup.request("GET", "/v1/envs")
        if status != 200:
            raise BenchFailed(f"GET /v1/envs answered HTTP {status}: {body}")
        infos = body["envs"]
        info = next((e for e in infos if e["name"] == env), infos[0] if len(infos) == 1 else None)
        if info is None:
            raise BenchArgumentError(f"the server serves {[e['name'] for e in infos]}, not {env!r}")
        status, page = await setup.request("GET", f"/v1/envs/{info['name']}/tasks?limit=100")
        if status != 200 or not page["tasks"]:
            raise BenchArgumentError(f"environment {info['name']!r} has no tasks to load: HTTP {status} {page}")
    finally:
        await setup.close()
    return info, page


@dataclass
class _LoadClients:
    """The simulated clients of one load run: each runs episodes of ``env`` (on ``task_ids``, ``steps`` tool
    steps then an answer) on its own connection until ``deadline``, recording into ``out``."""

    url: str
    headers: dict[str, str]
    timeout_s: float
    env: str
    task_ids: list[Any]
    steps: int
    action: dict[str, Any] | None
    """The tool call of every step (None for calc: checked additions)."""
    is_calc: bool
    seed: int
    deadline: float
    out: LoadResult

    def fail(self, what: str, status: int | None, body: Any) -> None:
        """Record an error of the run."""
        self.out.errors.append(
            f"{what}: HTTP {status}: {str(body)[:200]}" if status else f"{what}: {str(body)[:200]}"
        )

    def tool_call(self, rng: random.Random, i: int) -> tuple[dict[str, Any], str | None]:
        """The ``i``-th tool call of an episode and the observation it must give (None: any)."""
        if self.is_calc:
            a, b = rng.randint(1, 999), rng.randint(1, 999)
            args, want = {"expression": f"{a} + {b}"}, str(a + b)
            call = {
                "id": f"c{i}",
                "type": "function",
                "function": {"name": "calculate", "arguments": json.dumps(args)},
            }
            return call, want
        assert self.action is not None
        fn = {"name": self.action["name"], "arguments": json.dumps(self.action["arguments"])}
        return {"id": f"c{i}", "type": "function", "function": fn}, None

    async def one_episode(self, http: Connection, rng: random.Random) -> None:
        """Open a session, take the tool steps, answer, close; every latency recorded, every answer checked."""
        out = self.out
        t = time.perf_counter()
        status, body = await http.request(
            "POST", "/v1/sessions", {"env": self.env, "task_id": rng.choice(self.task_ids)}
        )
        out.create_s.append(time.perf_counter() - t)
        if status != 201:
            return self.fail("create", status, body)
        sid = body["session_id"]
        try:
            for i in range(self.steps):
                call, want = self.tool_call(rng, i)
                t = time.perf_counter()
                status, body = await http.request(
                    "POST",
                    f"/v1/sessions/{sid}/step",
                    {"tool_calls": [call]},
                    {"Idempotency-Key": secrets.token_hex(8)},
                )
                out.step_s.append(time.perf_counter() - t)
                if status != 200:
                    return self.fail("step", status, body)
                obs = body["observations"]
                if (
                    len(obs) != 1
                    or obs[0]["error"] is not None
                    or (want is not None and obs[0]["content"] != want)
                ):
                    return self.fail("step", None, f"unexpected observation {obs!r}")
            t = time.perf_counter()
            status, body = await http.request("POST", f"/v1/sessions/{sid}/step", {"content": "done"})
            out.step_s.append(time.perf_counter() - t)
            if status != 200:
                return self.fail("final step", status, body)
            if not body["done"] or body["reward"] is None or body["stop_reason"] != "completed":
                return self.fail("final step", None, f"episode not scored: {body!r}")
            out.episodes += 1
        finally:
            t = time.perf_counter()
            status, body = await http.request("DELETE", f"/v1/sessions/{sid}")
            out.close_s.append(time.perf_counter() - t)
            if status != 200:
                self.fail("close", status, body)

    async def worker(self, i: int) -> None:
        """Client ``i``: episodes one after another until the deadline, on its own connection."""
        from agentrl.tools.bench.http1 import Connection

        rng = random.Random(self.seed * 1000 + i)
        http = Connection(self.url, self.headers, self.timeout_s)
        try:
            while time.monotonic() < self.deadline:
                try:
                    await self.one_episode(http, rng)
                except Exception as e:  # a transport error is an error of the run, not of the bench
                    self.out.errors.append(f"{type(e).__name__}: {e}"[:200])
        finally:
            await http.close()


class ServerProcess:
    """``agentrl serve-env`` in a subprocess on a loopback port (a free one unless ``port``), owned by this
    process."""

    def __init__(
        self,
        envs: list[str],
        *,
        port: int = 0,
        token: str | None = None,
        extra: list[str] | None = None,
        log_path: Path | None = None,
        env_vars: dict[str, str] | None = None,
    ) -> None:
        self.token = token or secrets.token_urlsafe(24)
        self.envs = envs
        self.port = port
        self.extra = list(extra or [])
        self._own_log = log_path is None
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="agentrl-env-server-", suffix=".log")[1])
        self.env_vars = dict(env_vars or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.openenv_url = ""
        """The capability URL printed at start (``openenv: <url>``), for OpenEnv and MCP clients."""

    def start(self, timeout_s: float = 60.0) -> ServerProcess:
        """Start and wait until ``/health`` answers; raises RuntimeError with the log tail otherwise."""
        import httpx

        cmd = [sys.executable, "-m", "agentrl.cli", "serve-env", "--host", "127.0.0.1", "--port", str(self.port)]
        for e in self.envs:
            cmd += ["--env", e]
        env = {**os.environ, "AGENTRL_ENV_TOKEN": self.token, **self.env_vars}
        env.pop("AGENTRL_RUN_ID", None)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [*cmd, *self.extra], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        own_process(self.proc.pid)  # ended with this process, even when this process is SIGKILLed
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchFailed(f"the env server exited with {self.proc.returncode}:\n{self.log_tail()}")
            if not self.url:
                m = re.search(r"on (http://\S+) ", self.log_path.read_text(errors="replace"))
                self.url = m.group(1) if m else ""
            if not self.openenv_url:
                m = re.search(r"^openenv: (\S+)$", self.log_path.read_text(errors="replace"), re.M)
                self.openenv_url = m.group(1) if m else ""
            if self.url:
                try:
                    if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
            time.sleep(0.1)
        self.stop()
        raise BenchFailed(f"the env server did not become healthy in {timeout_s}s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL, as a crash would (nothing is cleaned up)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        if self.proc is not None and self.proc.poll() is not None:
            release_process(self.proc.pid)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM (graceful: sessions closed, sandboxes removed), then SIGKILL after ``timeout_s``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        release_process(self.proc.pid)
        if self._own_log and self.proc.returncode == 0:  # keep the log of a failed run only
            self.log_path.unlink(missing_ok=True)
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def containers_of_pid(pid: int) -> list[str]:
    """Ids of sandbox containers whose driver was process ``pid`` on this host ([] without an engine)."""
    from agentrl.sandbox import engine_reachable
    from agentrl.sandbox._engine import make_client
    from agentrl.sandbox._util import host_identity

    if not engine_reachable()[0]:
        return []
    client = make_client(None, 30)
    try:
        found = client.api.containers(
            all=True, filters={"label": [f"agentrl.pid={pid}", f"agentrl.host={host_identity()}"]}
        )
        return [c["Id"] for c in found]
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agentrl bench env-server", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="calc", help="environment to load (name or package.module:Class)")
    p.add_argument("--sessions", type=int, default=64, help="concurrent sessions")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    p.add_argument("--tool-steps", type=int, default=2, help="tool steps per episode before the answer")
    p.add_argument(
        "--action",
        type=json.loads,
        default=None,
        help='tool call for non-calc envs, e.g. \'{"name": "run", "arguments": {"command": "true"}}\'',
    )
    p.add_argument("--url", default=None, help="use this running server instead of starting one")
    p.add_argument("--token", default=os.environ.get("AGENTRL_ENV_TOKEN"), help="token for --url")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    args = p.parse_args(argv)
    say = (lambda _m: None) if args.json else _say
    sandboxed = args.env in SANDBOX_ENVS
    if sandboxed:
        from agentrl.sandbox import build_image, engine_reachable

        ok, why = engine_reachable()
        if not ok:
            print(f"error: {args.env} needs a Docker engine: {why}", file=sys.stderr)
            return 2
        t = time.monotonic()
        image = build_image()
        say(f"sandbox image {image} ready in {time.monotonic() - t:.1f}s")
    server = None
    url, token = args.url, args.token
    if url is None:
        extra = [
            "--max-sessions",
            str(max(256, 2 * args.sessions)),
            "--max-sessions-per-client",
            str(max(128, 2 * args.sessions)),
        ]
        server = ServerProcess([args.env], extra=extra).start()
        url, token = server.url, server.token
        say(f"started env server pid {server.pid} at {url}")
    result: dict[str, Any] = {
        "env": args.env,
        "sessions": args.sessions,
        "duration_s": args.duration,
        "tool_steps": args.tool_steps,
    }
    rc = 0
    try:
        env_name = args.env if ":" not in args.env else _env_name(url, token)
        load = asyncio.run(
            run_load(
                url,
                token,
                env=env_name,
                sessions=args.sessions,
                duration_s=args.duration,
                tool_steps=args.tool_steps,
                action=args.action,
            )
        )
        result.update(load.summary())
    except Exception as e:
        result["fatal"] = f"{type(e).__name__}: {e}"
        rc = 1
    finally:
        if server is not None:
            t = time.monotonic()
            result["server_exit_code"] = server.stop()
            result["server_stop_s"] = round(time.monotonic() - t, 2)
            if sandboxed:
                result["containers_left"] = len(containers_of_pid(server.pid))
    say(
        f"{result.get('steps', 0)} steps in {result.get('wall_s', 0)}s with {args.sessions} sessions: "
        f"{result.get('steps_per_s')} steps/s, p50 {result.get('step_ms_p50')} ms, "
        f"p99 {result.get('step_ms_p99')} ms, {result.get('errors')} errors"
    )
    print(json.dumps(result), flush=True)
    return rc


def _env_name(url: str, token: str | None) -> str:
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    envs = httpx.get(url + "/v1/envs", headers=headers, timeout=30).raise_for_status().json()["envs"]
    return str(envs[0]["name"])


if __name__ == "__main__":
    raise SystemExit(main())
