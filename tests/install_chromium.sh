#!/bin/sh
# Debian's Chromium, for the test that opens the report in a real headless browser
# (tests/test_report.py), installed without its recommends and only when that upgrades nothing
# already on the host: on a host whose packages lag behind the archive, apt would upgrade systemd,
# perl and the rest with it. Otherwise (or without apt-get, or not as root) it says why, installs
# nothing and exits 0: that test skips. Part of the README's test command (and .ci/run).
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "no chromium (no apt-get here): its test will skip"
  exit 0
fi
if ! apt-get update -q >/dev/null 2>&1; then
  echo "no chromium (apt-get update failed: not root, or no archive): its test will skip"
  exit 0
fi
# A simulated install lists an upgrade as `Inst NAME [INSTALLED VERSION] (NEW VERSION ...)`.
upgrades=$(apt-get -s install -q --no-install-recommends chromium 2>/dev/null | sed -n 's/^Inst \([^ ]*\) \[.*/\1/p' | tr '\n' ' ')
if [ -n "$upgrades" ]; then
  echo "no chromium (installing it would upgrade ${upgrades% }): its test will skip"
  exit 0
fi
if ! apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; then
  echo "no chromium (apt-get install failed): its test will skip"
fi
exit 0
