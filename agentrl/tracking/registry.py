"""Tracker names to tracker classes. A built-in tracker's module (and so its library) is imported only
when the tracker is chosen; ``package.module:Class`` names a tracker of the user's own."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from agentrl.tracking.base import Tracker, TrackerUnavailable

BUILTIN = {
    "tensorboard": ("agentrl.tracking.tensorboard_tracker:TensorBoardTracker", ("tensorboard", "torch")),
    "wandb": ("agentrl.tracking.wandb_tracker:WandbTracker", ("wandb",)),
    "trackio": ("agentrl.tracking.trackio_tracker:TrackioTracker", ("trackio",)),
    "mlflow": ("agentrl.tracking.mlflow_tracker:MlflowTracker", ("mlflow",)),
}
"""Name -> (class, the packages it needs); all of them come with ``pip install 'agentrl[trackers]'``."""
EXTRA = "trackers"


def _load(target: str) -> type[Tracker]:
    module_name, _, attr = target.partition(":")
    if str(Path.cwd()) not in sys.path:  # a tracker module of the user's project, as for environments
        sys.path.append(str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise TrackerUnavailable(f"tracker {target!r}: cannot import {module_name!r} ({e})") from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Tracker)):
        raise TrackerUnavailable(f"tracker {target!r}: {module_name} has no Tracker subclass named {attr!r}")
    return cls


def tracker_class(name: str) -> type[Tracker]:
    """The class of tracker ``name``; :class:`TrackerUnavailable` when its library is missing (naming the
    extra to install) or the name is unknown."""
    if ":" in name:
        return _load(name)
    if name not in BUILTIN:
        raise TrackerUnavailable(f"unknown tracker {name!r}; known: {', '.join(BUILTIN)}, or package.module:Class")
    target, packages = BUILTIN[name]
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        raise TrackerUnavailable(f"tracker {name!r} needs {', '.join(missing)}, which is not installed: "
                                 f"pip install 'agentrl[{EXTRA}]'")
    return _load(target)
