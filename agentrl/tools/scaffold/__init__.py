"""``agentrl init-env NAME``: write a runnable environment file and its tests, from a working example.

The example (`example_env.py`, `example_env_check.py` in this package) is real code that the test suite
runs; writing it for ``NAME`` only renames ``example_env`` and ``ExampleEnv``.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from agentrl.core.errors import ConfigError

_HERE = Path(__file__).parent
_MODULE, _CLASS = "example_env", "ExampleEnv"


class EnvNameError(ConfigError, ValueError):
    """The name given to ``agentrl init-env`` cannot name a Python module and class."""

    code = "config.env_name"


class ScaffoldExists(ConfigError, FileExistsError):
    """``agentrl init-env`` would overwrite existing files (and ``--force`` was not given)."""

    code = "config.scaffold_exists"


def class_name(name: str) -> str:
    """``stock_count`` -> ``StockCount``."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or name


def check_name(name: str) -> None:
    """Refuse a name that cannot be a Python module and a class name (with the rule in the message)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise EnvNameError(f"{name!r} cannot name an environment: use lower-case letters, digits and _, starting "
                         "with a letter (it becomes NAME.py and the class of the same name in CamelCase)")


def write_env(name: str, directory: Path, *, force: bool = False) -> list[Path]:
    """Write ``NAME.py`` and ``test_NAME.py`` into ``directory``; returns the paths. Existing files are
    refused unless ``force``."""
    check_name(name)
    directory.mkdir(parents=True, exist_ok=True)
    out = {directory / f"{name}.py": _HERE / f"{_MODULE}.py", directory / f"test_{name}.py": _HERE / f"{_MODULE}_check.py"}
    existing = [str(p) for p in out if p.exists()]
    if existing and not force:
        raise ScaffoldExists(f"{', '.join(existing)} already exist(s); choose another name or pass --force")
    for dest, source in out.items():
        text = source.read_text().replace(_CLASS, class_name(name)).replace(_MODULE, name)
        dest.write_text(text)
    return list(out)
