"""The install's bridge from pip's settings to uv's: what pip would read, uv is told."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from agentrl.tools.install.pip_to_uv import pip_settings, uv_environment

LISTING = """global.cert='/etc/certs/ca.crt'
global.constraint='/etc/pip/constraints.txt'
global.extra-index-url='file:///srv/a/simple https://mirror.example/simple'
global.find-links='/srv/wheels'
:env:.find-links='/srv/env-wheels /srv/more-wheels'
:env:.disable-pip-version-check='1'
not a setting line
global.index-url='https://index.example/simple'
"""


def test_settings_split_and_the_environment_wins() -> None:
    s = pip_settings(LISTING)
    assert s["find-links"] == ["/srv/env-wheels", "/srv/more-wheels"]  # pip's environment replaces its files
    assert s["extra-index-url"] == ["file:///srv/a/simple", "https://mirror.example/simple"]
    assert s["constraint"] == ["/etc/pip/constraints.txt"]


def test_uv_gets_each_setting_it_has_and_pips_index_rule() -> None:
    env = uv_environment(pip_settings(LISTING))
    assert env == {
        "UV_INDEX_STRATEGY": "unsafe-best-match",
        "UV_FIND_LINKS": "/srv/env-wheels,/srv/more-wheels",  # uv splits find-links on commas
        "UV_EXTRA_INDEX_URL": "file:///srv/a/simple https://mirror.example/simple",
        "UV_DEFAULT_INDEX": "https://index.example/simple",
        "UV_CONSTRAINT": "/etc/pip/constraints.txt",
        "SSL_CERT_FILE": "/etc/certs/ca.crt",
    }
    assert uv_environment({}) == {"UV_INDEX_STRATEGY": "unsafe-best-match"}


def test_the_script_prints_export_lines_a_shell_reads(tmp_path: Path) -> None:
    """Run as the Makefile runs it, by path, against this interpreter's pip."""
    script = Path(__file__).resolve().parents[4] / "agentrl" / "tools" / "install" / "pip_to_uv.py"
    out = subprocess.run([sys.executable, str(script), sys.executable], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    lines = out.splitlines()
    assert "export UV_INDEX_STRATEGY=unsafe-best-match" in lines
    for line in lines:
        word, assignment = shlex.split(line)
        assert word == "export" and "=" in assignment
