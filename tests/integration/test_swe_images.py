"""Tasks with their own ``image`` (SWE-bench/SWE-Gym style) on a real Docker engine: images built here
from the sandbox image with a bundled repository at ``/testbed``; warm pools per image, bounded and fed by
the task order; the oracle solves image tasks; nothing is left behind."""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from agentrl.environment.base import run_scope
from agentrl.envs.swe import SweConfig, SweEnv
from agentrl.envs.swe.repo import base_tree
from agentrl.envs.swe.task import SweTask
from agentrl.rollout.scripted import NullPolicy, OraclePolicy, run_scripted
from tests.integration.test_swe import _docker, containers_of, swe_image  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration

BASE = next(t for t in SweEnv.tasks("all") if t["instance_id"] == "agentrl__durations-1")
TAGS = ("a", "b", "c")


def _context(sandbox_image: str, files: dict[str, str]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))

        add("Dockerfile", f"FROM {sandbox_image}\nCOPY repo /testbed\n".encode())
        for rel, content in files.items():
            add(f"repo/{rel}", content.encode())
    buf.seek(0)
    return buf


@pytest.fixture(scope="module")
def task_images(swe_image: str) -> Iterator[list[str]]:  # noqa: F811
    """Three task images (same content, three names, as three SWE-bench instances of one repository);
    removed afterwards."""
    client = _docker()
    ctx = _context(swe_image, base_tree(SweTask.model_validate(BASE)))
    client.images.build(fileobj=ctx, custom_context=True, tag="agentrl-test-task:a", rm=True, forcerm=True,
                        network_mode="none")
    names = []
    for t in TAGS:
        client.api.tag("agentrl-test-task:a", "agentrl-test-task", t)
        names.append(f"agentrl-test-task:{t}")
    yield names
    for name in names:
        client.images.remove(name, noprune=False)


def _image_task(image: str, i: int) -> dict[str, Any]:
    return {**BASE, "instance_id": f"durations-img-{i}", "id": f"durations-img-{i}", "image": image}


class ImageSwe(SweEnv):
    config: ClassVar[SweConfig] = SweConfig(pool_size=0, image_pool_size=1, image_pool_images=2, max_sandboxes=4)
    _run = None


async def test_image_pools_warm_the_next_tasks_images_within_bounds(task_images: list[str]) -> None:
    tasks = [_image_task(img, i) for i, img in enumerate(task_images)]
    async with run_scope(ImageSwe, f"test-imgpool-{uuid.uuid4().hex[:6]}"):
        runner = ImageSwe._run
        assert runner is not None and runner.image_pools is not None
        pools = runner.image_pools
        ImageSwe.upcoming(tasks)
        assert pools.wanted() == task_images[:2]  # the first two images of the plan, not the third
        for img in task_images[:2]:
            await pools.wait_warm(img, timeout=120)
        assert pools.warm == {task_images[0]: 1, task_images[1]: 1}
        assert len(containers_of(runner.owner)) == 2  # bounded: 1 per image, 2 images
        sb = await runner.acquire(task_images[0])  # consumes one entry of a's plan
        assert pools.stats["acquired_warm"] == 1
        await runner.release(sb)
        oracle = await run_scripted(ImageSwe, tasks, OraclePolicy(), max_concurrency=1)
        null = await run_scripted(ImageSwe, tasks[:1], NullPolicy(), max_concurrency=1)
        assert [t.reward for t in oracle] == [1.0, 1.0, 1.0], [(t.task_id, t.error) for t in oracle]
        assert null[0].reward == 0.0 and not null[0].failed, null[0].error
        # episodes in plan order find their images warm: agent and grader sandboxes of the oracle run
        assert pools.stats["acquired_warm"] >= 4, pools.stats
        owner = runner.owner
    assert containers_of(owner) == []


async def test_a_missing_task_image_is_a_failed_rollout_not_a_hang(task_images: list[str]) -> None:
    task = _image_task("agentrl-test-task:does-not-exist", 9)
    async with run_scope(ImageSwe, f"test-imgmiss-{uuid.uuid4().hex[:6]}"):
        ImageSwe.upcoming([task])
        [traj] = await run_scripted(ImageSwe, [task], NullPolicy())
        owner = ImageSwe._run.owner  # type: ignore[union-attr]
    assert traj.failed and "does-not-exist" in (traj.error or ""), traj.error
    assert containers_of(owner) == []
