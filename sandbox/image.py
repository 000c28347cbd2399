"""Offline build of the default sandbox image ``agentrl-sandbox:<recipe hash>`` (no registry needed).

The rootfs comes from ``sandbox/recipe/build.sh`` (debootstrap minbase bookworm + packages.txt, user
``agent`` uid 1000, ``/workspace``) and is loaded with ``docker import``. The tag is a hash of the recipe
directory, so an existing tag means "already built" and building is a no-op. Downloads and the rootfs
tarball are cached under ``$AGENTRL_SANDBOX_CACHE`` (default: ``<repo>/.cache/sandbox``).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ._engine import SandboxError, make_client

log = logging.getLogger("agentrl.sandbox")
RECIPE_DIR = Path(__file__).resolve().parent / "recipe"
REPOSITORY = "agentrl-sandbox"
IMAGE_CHANGES = [
    "USER agent",
    "WORKDIR /workspace",
    "ENV HOME=/home/agent",
    "ENV PATH=/usr/local/bin:/usr/bin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    'CMD ["sleep", "infinity"]',
]


def recipe_version() -> str:
    """12 hex digits of the SHA-256 of every file in the recipe directory (names and contents)."""
    h = hashlib.sha256()
    for p in sorted(RECIPE_DIR.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(RECIPE_DIR).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def default_tag() -> str:
    """``agentrl-sandbox:<recipe version>``."""
    return f"{REPOSITORY}:{recipe_version()}"


def cache_dir() -> Path:
    """Where debootstrap downloads and rootfs tarballs are kept (git-ignored ``.cache/`` in a checkout)."""
    env = os.environ.get("AGENTRL_SANDBOX_CACHE")
    if env:
        return Path(env)
    repo = RECIPE_DIR.parent.parent
    if (repo / "pyproject.toml").exists() and os.access(repo, os.W_OK):
        return repo / ".cache" / "sandbox"
    return Path.home() / ".cache" / "agentrl" / "sandbox"


def _image_exists(client: Any, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _build_rootfs(out: Path, cache: Path) -> None:
    cmd = ["bash", str(RECIPE_DIR / "build.sh"), str(out), str(cache)]
    if os.geteuid() != 0:
        cmd = ["sudo", "-n", *cmd]
    log.info("building sandbox rootfs: %s", " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SandboxError(f"sandbox recipe failed (rc={proc.returncode}); needs root and debootstrap "
                           f"(run sandbox/provision.sh):\n{proc.stdout[-3000:]}")


def _import(client: Any, rootfs: Path, repo: str, name: str, changes: list[str], timeout: float = 600) -> None:
    """``docker import`` of a tarball, with a timeout (the SDK's import_image_from_file has none)."""
    api = client.api
    with open(rootfs, "rb") as f:
        res = api._post(api._url("/images/create"), data=f, timeout=timeout,
                        params={"fromSrc": "-", "repo": repo, "tag": name, "changes": changes},
                        headers={"Content-Type": "application/tar"})
    api._raise_for_status(res)
    if '"error"' in res.text:
        raise SandboxError(f"docker import failed: {res.text[-500:]}")


def build_image(tag: str | None = None, force: bool = False, *, client: Any = None,
                docker_host: str | None = None) -> str:
    """Build (or find) the sandbox image and return its tag.

    A no-op when ``tag`` (default :func:`default_tag`) already exists, unless ``force``. Otherwise the
    rootfs tarball is built (or taken from the cache) and imported. Safe against concurrent callers
    (a file lock in the cache directory).
    """
    version = recipe_version()
    tag = tag or f"{REPOSITORY}:{version}"
    own = client is None
    client = client or make_client(docker_host, timeout=600)
    try:
        if not force and _image_exists(client, tag):
            return tag
        cache = cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not force and _image_exists(client, tag):
                return tag
            t0 = time.monotonic()
            rootfs = cache / f"rootfs-{version}.tar"
            if force or not rootfs.exists():
                _build_rootfs(rootfs, cache)
                for old in cache.glob("rootfs-*.tar"):
                    if old != rootfs:
                        old.unlink(missing_ok=True)
            repo, _, name = tag.rpartition(":") if ":" in tag.split("/")[-1] else (tag, ":", "latest")
            changes = [*IMAGE_CHANGES, f"LABEL agentrl.recipe={version}"]
            _import(client, rootfs, repo, name, changes)
            if not _image_exists(client, tag):
                raise SandboxError(f"docker import did not produce {tag}")
            log.info("sandbox image %s ready in %.1fs", tag, time.monotonic() - t0)
            return tag
    finally:
        if own:
            client.close()


def main(argv: list[str] | None = None) -> int:
    """``agentrl sandbox build [--force] [TAG]``: build the image, print its tag."""
    import argparse

    ap = argparse.ArgumentParser(prog="agentrl sandbox build",
                                 description="Build the sandbox image offline from Debian packages (cached).")
    ap.add_argument("tag", nargs="?", default=None, help="image tag (default: agentrl-sandbox:<recipe hash>)")
    ap.add_argument("--force", action="store_true", help="rebuild even if the tag exists")
    args = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t0 = time.monotonic()
    try:
        tag = build_image(args.tag, force=args.force)
    except SandboxError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{tag} ({time.monotonic() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
