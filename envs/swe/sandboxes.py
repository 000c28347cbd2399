"""The sandboxes of a run: a warm pool for the default image, warm pools for the images of the next tasks
(`ImagePools`, fed by `plan`), and cleanup.

One `SandboxRun` serves every episode of a training or evaluation run (`SweEnv.setup_run` creates it).
All its containers carry the run's owner label, so `teardown` (or ``agentrl sandbox gc --owner``) removes
whatever is left, and the next run's start removes the containers of drivers that died (``kill -9``).
Episodes that run without a set-up run (a bare ``run_episode``) get a standalone `SandboxRun` of their
own: cold sandboxes, same cleanup.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from agentrl.envs.swe.config import SweConfig
from agentrl.sandbox import DockerSandbox, SandboxPool, cleanup_on_start, gc
from agentrl.sandbox.image_pools import ImagePools

log = logging.getLogger(__name__)


class SandboxRun:
    """Sandboxes for one run, owned by ``owner`` (see module docstring)."""

    def __init__(self, config: SweConfig, run_id: str = "swe", *, pooled: bool = True) -> None:
        self.config = config
        self.owner = f"{run_id}-{secrets.token_hex(4)}"
        self.pooled = pooled
        self.sandbox_config = config.sandbox.model_copy(update={"owner": self.owner, "image": config.image})
        self.pool: SandboxPool | None = None
        self.image_pools: ImagePools | None = None
        self._slots = asyncio.Semaphore(config.max_sandboxes)
        self._pooled_ids: set[str] = set()
        self.orphans_removed: list[str] = []

    async def start(self) -> SandboxRun:
        """Remove orphans of dead drivers, then start the warm pool (builds the default image if needed)."""
        self.orphans_removed = await asyncio.to_thread(cleanup_on_start, self.sandbox_config.docker_host)
        if self.orphans_removed:
            log.info("removed %d orphaned sandbox(es) of dead runs", len(self.orphans_removed))
        if self.pooled:
            self.pool = SandboxPool(self.sandbox_config, size=self.config.pool_size,
                                    max_concurrency=self.config.max_sandboxes)
            await self.pool.start()
            self.sandbox_config = self.pool.config  # with the resolved image tag
            if self.config.image_pool_size and self.config.image_pool_images:
                self.image_pools = await ImagePools(self.sandbox_config, per_image=self.config.image_pool_size,
                                                    max_images=self.config.image_pool_images).start()
        return self

    def plan(self, images: list[str]) -> None:
        """The task images of the next acquisitions, in order (their sandboxes are started ahead)."""
        if self.image_pools is not None:
            self.image_pools.plan(images)

    async def acquire(self, image: str | None = None) -> DockerSandbox:
        """A started sandbox of ``image`` (None: the run's default image), for one use."""
        if self.pool is not None and not image:
            sb = await self.pool.acquire()
            self._pooled_ids.add(sb.id)
            return sb
        await self._slots.acquire()
        try:
            if image and self.image_pools is not None:
                return await self.image_pools.acquire(image)
            cfg = self.sandbox_config.model_copy(update={"image": image}) if image else self.sandbox_config
            return await DockerSandbox(cfg).start()
        except BaseException:
            self._slots.release()
            raise

    async def release(self, sb: DockerSandbox) -> None:
        """Destroy ``sb`` and free its slot (never raises)."""
        try:
            if sb.id in self._pooled_ids and self.pool is not None:
                self._pooled_ids.discard(sb.id)
                await self.pool.release(sb)
            else:
                try:
                    await sb.close()
                finally:
                    self._slots.release()
        except Exception as e:  # the owner label lets teardown/gc remove it later
            log.warning("releasing sandbox %s failed: %s", sb.id[:12], e)

    async def teardown(self) -> list[str]:
        """Close the pool and remove every container still carrying this run's owner label.

        Also runs while the run is being cancelled (Ctrl-C, SIGTERM): the pool's refill may then have been
        cut off mid-creation, so removal is repeated until a pass finds nothing (at most 3 passes)."""
        try:
            if self.image_pools is not None:
                await self.image_pools.close()
            if self.pool is not None:
                await self.pool.close()
        except BaseException as e:  # CancelledError included: clean up, then re-raise
            log.warning("closing the sandbox pool failed: %r", e)
            if not isinstance(e, Exception):
                await self._remove_all(settle=True)
                raise
        return await self._remove_all(settle=False)

    async def _remove_all(self, settle: bool) -> list[str]:
        removed: list[str] = []
        for attempt in range(3 if settle else 1):
            try:
                batch = await asyncio.shield(asyncio.to_thread(
                    gc, self.owner, False, False, docker_host=self.sandbox_config.docker_host))
            except Exception as e:
                log.warning("sandbox cleanup of run %s failed: %s", self.owner, e)
                break
            removed += batch
            if attempt and not batch:
                break
            if settle:
                await asyncio.sleep(1.0)
        return removed
