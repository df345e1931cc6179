#!/usr/bin/env bash
# Installs the real components the end-to-end tests drive, into .e2e/ (git-ignored):
#   .e2e/hermes-venv  the Hermes Agent CLI from PyPI, in its own virtual environment
#   .e2e/inspector    the MCP Inspector CLI from npm, pinned
# Safe to re-run: what is already installed is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
HERMES_VERSION="${HERMES_VERSION:-0.19.0}"
INSPECTOR_VERSION="2.12.0"
PYTHON="${PYTHON:-python3}"

if [ ! -x .e2e/hermes-venv/bin/hermes ]; then
  echo "installing hermes-agent==$HERMES_VERSION into .e2e/hermes-venv"
  "$PYTHON" -m venv .e2e/hermes-venv
  .e2e/hermes-venv/bin/python -m pip install --quiet --disable-pip-version-check "hermes-agent==$HERMES_VERSION"
fi
version="$(.e2e/hermes-venv/bin/hermes --version 2>&1)"
echo "hermes: ${version%%$'\n'*}"

LAUNCHER=.e2e/inspector/node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js
if [ ! -f "$LAUNCHER" ]; then
  echo "installing @modelcontextprotocol/inspector@$INSPECTOR_VERSION into .e2e/inspector"
  mkdir -p .e2e/inspector
  (cd .e2e/inspector && npm install --no-audit --no-fund --loglevel=error "@modelcontextprotocol/inspector@$INSPECTOR_VERSION")
fi
echo "inspector: $LAUNCHER"
