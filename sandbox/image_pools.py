"""Warm sandboxes for many images (SWE-bench style: one image per task), bounded and fed by the task order.

``plan(images)`` tells the pools which images the next acquisitions will ask for, in order. A background
loop keeps ``per_image`` started sandboxes of each of the first ``max_images`` distinct images of that plan
(after the plan: the most recently used images), and destroys the warm sandboxes of images that dropped
out of that window. So at most ``per_image * max_images`` idle containers exist, and the next tasks' images
are warm when their episodes start. ``acquire(image)`` consumes the image's first entry of the plan and
hands out a warm sandbox when one is ready, else starts one (a cold start, as without pools). Sandboxes are
single-use: ``release`` destroys them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

from ._engine import SandboxError, make_client, to_thread
from .config import SandboxConfig, SandboxConfigError
from .docker_sandbox import DockerSandbox

log = logging.getLogger("agentrl.sandbox")


class ImagePools:
    """Warm sandboxes per image (see module docstring). ``config`` is the template (its ``image`` is
    replaced per image)."""

    def __init__(self, config: SandboxConfig, *, per_image: int = 1, max_images: int = 2,
                 max_idle_s: float = 600.0, refill_parallelism: int = 2) -> None:
        if per_image < 0 or max_images < 0 or refill_parallelism < 1:
            raise SandboxConfigError("per_image >= 0, max_images >= 0, refill_parallelism >= 1")
        self.config = config
        self.per_image, self.max_images, self.max_idle_s = per_image, max_images, max_idle_s
        self.refill_parallelism = refill_parallelism
        self._plan: deque[str] = deque()
        self._recent: OrderedDict[str, None] = OrderedDict()  # most recently used last
        self._warm: dict[str, deque[DockerSandbox]] = {}
        self._failed: dict[str, str] = {}  # image -> why it could not be started (not retried until re-planned)
        self._need = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None
        self._closed = False
        self.stats = {"created": 0, "acquired_warm": 0, "acquired_cold": 0, "evicted": 0, "errors": 0}

    async def start(self) -> ImagePools:
        """Connect to the engine and start the background loop."""
        cfg = self.config
        self._client = await to_thread(make_client, cfg.docker_host, cfg.api_timeout_s,
                                       self.per_image * max(self.max_images, 1) + 16)
        self._task = asyncio.create_task(self._loop(), name="agentrl-image-pools")
        return self

    # -- what to keep warm --------------------------------------------------------------------------
    def plan(self, images: Iterable[str]) -> None:
        """The images of the next acquisitions, in order (replaces the previous plan)."""
        self._plan = deque(i for i in images if i)
        for image in set(self._plan):
            self._failed.pop(image, None)
        self._need.set()

    def wanted(self) -> list[str]:
        """The images kept warm now: the first ``max_images`` distinct ones of the plan, then recent ones."""
        out: list[str] = []
        for image in [*self._plan, *reversed(self._recent)]:
            if len(out) >= self.max_images:
                break
            if image not in out and image not in self._failed:
                out.append(image)
        return out

    @property
    def warm(self) -> dict[str, int]:
        """Idle sandboxes per image."""
        return {image: len(q) for image, q in self._warm.items() if q}

    async def wait_warm(self, image: str, n: int | None = None, timeout: float | None = None) -> None:
        """Wait until ``image`` has ``n`` (default ``per_image``) idle sandboxes (raises TimeoutError)."""
        want = self.per_image if n is None else n

        async def ready() -> None:
            while len(self._warm.get(image, ())) < want:
                if image in self._failed:
                    raise SandboxError(f"image {image} cannot be started: {self._failed[image]}")
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(ready(), timeout)

    # -- use ----------------------------------------------------------------------------------------
    def _config(self, image: str) -> SandboxConfig:
        return self.config.model_copy(update={"image": image})

    def _fresh(self, sb: DockerSandbox) -> bool:
        now = time.time()
        return now - sb.started_at < self.max_idle_s and sb.expires_at - now > self.config.lifetime_s / 2

    async def acquire(self, image: str) -> DockerSandbox:
        """A started sandbox of ``image`` for one use: warm when one is ready, else started now."""
        if self._closed or self._client is None:
            raise SandboxError("image pools are not started (or closed)")
        try:
            self._plan.remove(image)
        except ValueError:
            pass
        self._recent.pop(image, None)
        self._recent[image] = None
        while len(self._recent) > max(self.max_images, 1) * 4:
            self._recent.popitem(last=False)
        self._need.set()
        queue = self._warm.get(image)
        while queue:
            sb = queue.popleft()
            if self._fresh(sb):
                self.stats["acquired_warm"] += 1
                return sb
            asyncio.create_task(sb.close())  # noqa: RUF006 (gc is the backstop)
        self.stats["acquired_cold"] += 1
        return await DockerSandbox(self._config(image), client=self._client).start()

    async def release(self, sb: DockerSandbox) -> None:
        """Destroy ``sb`` (never reused)."""
        await sb.close()

    # -- background ---------------------------------------------------------------------------------
    async def _create(self, image: str) -> None:
        try:
            sb = await DockerSandbox(self._config(image), client=self._client).start()
        except Exception as e:
            self.stats["errors"] += 1
            self._failed[image] = str(e)
            log.warning("warm sandbox of image %s failed: %s", image, e)
            return
        self.stats["created"] += 1
        if self._closed or image not in self.wanted():
            await sb.close()
        else:
            self._warm.setdefault(image, deque()).append(sb)

    async def _evict(self, wanted: list[str]) -> None:
        drop: list[DockerSandbox] = []
        for image in [i for i in self._warm if i not in wanted]:
            drop += self._warm.pop(image)
        if drop:
            self.stats["evicted"] += len(drop)
            await asyncio.gather(*(sb.close() for sb in drop), return_exceptions=True)

    async def _loop(self) -> None:
        while not self._closed:
            await self._need.wait()
            self._need.clear()
            wanted = self.wanted()
            await self._evict(wanted)
            todo = [image for image in wanted for _ in range(self.per_image - len(self._warm.get(image, ())))]
            for i in range(0, len(todo), self.refill_parallelism):
                if self._closed or self._need.is_set():
                    break  # the plan moved on: recompute
                await asyncio.gather(*(self._create(image) for image in todo[i : i + self.refill_parallelism]))
                self._changed.set()
            self._changed.set()

    async def close(self) -> None:
        """Stop the loop and destroy every idle sandbox (checked-out ones are closed by their users)."""
        self._closed = True
        self._need.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 60)
            except (asyncio.TimeoutError, Exception):
                self._task.cancel()
        await self._evict([])
        if self._client is not None:
            await to_thread(self._client.close)
