"""tests/install_chromium.sh, the README test command's first step: Chromium for the browser test,
installed without recommends and only when that upgrades nothing already installed; otherwise one
line saying why, nothing installed, exit 0 (the browser test skips). Run against a stand-in apt-get
that logs its calls and answers the simulated install with a given list of `Inst` lines."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "tests" / "install_chromium.sh"

FAKE_APT = """#!/bin/sh
echo "$*" >> "$APT_LOG"
case "$*" in
  update*) exit "${APT_UPDATE_RC:-0}" ;;
  "-s "*) cat "$APT_SIMULATION" ;;
esac
exit 0
"""

# What `apt-get -s install --no-install-recommends chromium` prints on a bookworm host whose packages
# lag behind the archive (shape from apt's simulation output: `Inst NAME [OLD] (NEW ARCHIVE [ARCH])`).
LAGGING = """Inst libudev1 [252.30-1~deb12u2] (252.38-1~deb12u1 Debian:12.11/stable [amd64])
Inst perl-base [5.36.0-7+deb12u1] (5.36.0-7+deb12u2 Debian:12.11/stable [amd64])
Inst chromium-common (156.0.8078.114-1~deb12u1 Debian-Security:12/stable-security [amd64])
Inst chromium (156.0.8078.114-1~deb12u1 Debian-Security:12/stable-security [amd64])
"""
CURRENT = """Inst chromium-common (156.0.8078.114-1~deb12u1 Debian-Security:12/stable-security [amd64])
Inst chromium (156.0.8078.114-1~deb12u1 Debian-Security:12/stable-security [amd64])
Conf chromium (156.0.8078.114-1~deb12u1 Debian-Security:12/stable-security [amd64])
"""


@pytest.fixture
def host(tmp_path):
    """A PATH with the stand-in apt-get and the few tools the script uses, and no chromium."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(FAKE_APT)
    (bin_dir / "apt-get").chmod(0o755)
    for tool in ("sed", "tr", "cat"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    return tmp_path


def install(host: Path, simulation: str, **env) -> tuple[subprocess.CompletedProcess, list[str]]:
    (host / "simulation").write_text(simulation)
    log = host / "apt.log"
    result = subprocess.run(["/bin/sh", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                            env={"PATH": str(host / "bin"), "APT_LOG": str(log),
                                 "APT_SIMULATION": str(host / "simulation"), **env})
    return result, log.read_text().splitlines() if log.exists() else []


def test_chromium_is_installed_without_recommends_when_nothing_else_is_upgraded(host):
    result, calls = install(host, CURRENT)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert calls == ["update -q", "-s install -q --no-install-recommends chromium",
                     "install -y -q --no-install-recommends chromium"]


def test_nothing_is_installed_when_chromium_would_upgrade_installed_packages(host):
    result, calls = install(host, LAGGING)
    assert (result.returncode, result.stdout, result.stderr) == (
        0, "no chromium (installing it would upgrade libudev1 perl-base): its test will skip\n", "")
    assert calls == ["update -q", "-s install -q --no-install-recommends chromium"]


def test_a_failed_apt_update_installs_nothing(host):
    result, calls = install(host, CURRENT, APT_UPDATE_RC="100")
    assert (result.returncode, result.stdout) == (
        0, "no chromium (apt-get update failed: not root, or no archive): its test will skip\n")
    assert calls == ["update -q"]


def test_a_host_that_has_chromium_runs_no_apt_get(host):
    (host / "bin" / "chromium").write_text("#!/bin/sh\n")
    (host / "bin" / "chromium").chmod(0o755)
    result, calls = install(host, LAGGING)
    assert (result.returncode, result.stdout, calls) == (0, "", [])


def test_the_readme_test_command_installs_chromium_through_the_script():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "sh tests/install_chromium.sh && CMAKE_ARGS=-DLLAVA_BUILD=OFF python3 -m pip install" in ci
    assert "apt-get" not in ci and os.access(SCRIPT, os.R_OK)
