"""The peer's own environment: TRL installed into a directory of its own, never into agentrl's dependencies.

``pip install --no-deps --target .cache/peers/trl-<version> trl==<version>``, once (idempotent: a directory
with the release's metadata is kept). TRL's side then runs with agentrl's interpreter and that directory on
``PYTHONPATH``, so it uses the same torch and transformers as agentrl (and ``trl[vllm]``, which pins the CUDA
vLLM distribution, is never installed). The requirements TRL declares are checked against what agentrl's
environment has; one that is missing or too old stops the benchmark with one sentence naming it.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from agentrl.tools.bench.errors import BenchUnavailable


class PeerUnavailable(BenchUnavailable):
    """The peer cannot be installed or run here."""

    code = "bench.peer_unavailable"


def trl_dir(version: str, root: Path = Path(".cache/peers")) -> Path:
    return root / f"trl-{version}"


def ensure_trl(version: str, root: Path = Path(".cache/peers"), timeout_s: float = 600.0) -> Path:
    """The directory holding TRL ``version``, installed there first when it is not."""
    target = trl_dir(version, root)
    if not _installed(target, version):
        target.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(target),
               f"trl=={version}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise PeerUnavailable(f"installing TRL {version} took more than {timeout_s:.0f} s") from None
        if proc.returncode != 0 or not _installed(target, version):
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise PeerUnavailable(f"TRL {version} could not be installed into {target} (pip: {last[0]})")
    missing = unmet_requirements(target, version)
    if missing:
        raise PeerUnavailable(f"TRL {version} needs {', '.join(missing)}, which this environment lacks "
                              "(install agentrl with its dev extras: make install)")
    return target


def _dist(target: Path, version: str) -> metadata.Distribution | None:
    found = [d for d in metadata.distributions(path=[str(target)]) if (d.metadata["Name"] or "").lower() == "trl"]
    return found[0] if found and found[0].version == version else None


def _installed(target: Path, version: str) -> bool:
    return _dist(target, version) is not None and (target / "trl" / "__init__.py").is_file()


def unmet_requirements(target: Path, version: str) -> list[str]:
    """TRL's own requirements (no extras) that agentrl's environment does not satisfy, as ``name>=x`` strings."""
    from packaging.requirements import Requirement

    dist = _dist(target, version)
    assert dist is not None
    out = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            out.append(str(req))
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            out.append(f"{req} (found {have})")
    return out
