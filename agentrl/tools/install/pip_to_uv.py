"""The machine's pip settings, as the environment variables uv reads for the same things.

``make install`` installs with uv (about four times faster than pip here: parallel downloads and unpacking, and a
parallel bytecode compile), but uv does not read pip's configuration. A machine may depend on it: a local
directory of wheels (``find-links``) that holds its CPU build of torch, extra indexes, a constraints file, a CA
bundle. This prints those settings as shell ``export`` lines, one per setting, so that uv installs what pip
would have installed. Only the standard library: it runs before anything is installed.

    eval "$(python agentrl/tools/install/pip_to_uv.py [PYTHON])"   # PYTHON: whose pip to ask (default: this one)
"""

from __future__ import annotations

import ast
import shlex
import subprocess
import sys

# pip's setting -> (uv's variable, separator uv expects between several values)
_UV_NAMES: dict[str, tuple[str, str]] = {
    "find-links": ("UV_FIND_LINKS", ","),
    "index-url": ("UV_DEFAULT_INDEX", " "),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "constraint": ("UV_CONSTRAINT", " "),
    "cert": ("SSL_CERT_FILE", " "),
    "default-timeout": ("UV_HTTP_TIMEOUT", " "),
}


def pip_settings(listing: str) -> dict[str, list[str]]:
    """``pip config list`` output (``section.name='value'`` lines, the environment's as ``:env:.name``) as
    {name: values}; a value that holds several (pip splits them on whitespace) gives several, in order, without
    repeats. The environment's value of a name replaces the files' values, as it does for pip."""
    files: dict[str, list[str]] = {}
    env: dict[str, list[str]] = {}
    for line in listing.splitlines():
        key, sep, raw = line.partition("=")
        if not sep or "." not in key:
            continue
        section, name = key.rsplit(".", 1)
        try:
            value = ast.literal_eval(raw)
        except (SyntaxError, ValueError):
            continue
        target = env if section == ":env:" else files
        for item in str(value).split():
            if item not in target.setdefault(name, []):
                target[name].append(item)
    return {**files, **env}


def uv_environment(settings: dict[str, list[str]]) -> dict[str, str]:
    """The uv variables for the settings uv has an equivalent of (the others, such as pip's version check, are
    pip's own), and pip's way with several indexes: the best version from any of them (uv by default takes a
    package from the first index that has it, at any version)."""
    out: dict[str, str] = {"UV_INDEX_STRATEGY": "unsafe-best-match"}
    for name, values in settings.items():
        if name in _UV_NAMES and values:
            var, sep = _UV_NAMES[name]
            out[var] = sep.join(values)
    return out


def main(argv: list[str]) -> int:
    python = argv[0] if argv else sys.executable
    listing = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60, check=False).stdout
    for var, value in sorted(uv_environment(pip_settings(listing)).items()):
        print(f"export {var}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
