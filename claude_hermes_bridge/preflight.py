"""[both] What must hold before the rest is imported: the dependencies, named with the command that installs them."""
import contextlib
import functools
import importlib.util
import re
import sys
from pathlib import Path
from typing import Iterator

VERSION = "0.1.0"
PACKAGE_DIR = Path(__file__).resolve().parent
# The folder a user installed: server.py, config.json and requirements.txt in a clone or a bundle (the
# site-packages folder of a wheel, where none of them is)
SERVER_DIR = PACKAGE_DIR.parent
APP_NAME = "claude-hermes-bridge"
MCP_SUPPORTED = "mcp>=1.24,<3"


def version_tuple(version: str) -> tuple[int, ...]:
    """'1.24.0' -> (1, 24, 0); the leading numbers of any version string."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


@functools.cache
def dependency_version(package: str) -> str | None:
    """The installed version, read once per process: the running code does not change with the disk, and
    reading a dist-info costs hermes_health most of its call."""
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_dependencies(need_mcp: bool) -> str | None:
    """One line naming the interpreter, what is wrong and the command that fixes it; None when all is well.

    The supervisor (need_mcp=False) only looks for modules: importlib.metadata costs it 30 ms and 4 MB."""
    fix = f'"{sys.executable}" -m pip install -r "{SERVER_DIR / "requirements.txt"}"'
    if need_mcp:
        found = dependency_version("mcp")
        if found is None or not (1, 24) <= version_tuple(found)[:2] < (3, 0):
            return (f"claude-hermes-bridge needs the MCP Python SDK {MCP_SUPPORTED} (1.24 or later on the 1.x line, "
                    f"or 2.x); interpreter {sys.executable} has {'no mcp' if found is None else 'mcp ' + found}. "
                    f"Fix: {fix}")
    for module, package in (("psutil", "psutil"), ("yaml", "PyYAML"), ("platformdirs", "platformdirs")):
        if importlib.util.find_spec(module) is None:
            return (f"claude-hermes-bridge needs {package}; interpreter {sys.executable} does not have it. "
                    f"Fix: {fix}")
    return None


def exit_if_missing(need_mcp: bool) -> None:
    """Stop with the fix on stderr (exit 2) before a missing dependency can end in an ImportError traceback."""
    problem = missing_dependencies(need_mcp)
    if problem:
        sys.stderr.write(problem + "\n")
        sys.exit(2)


def user_dir(kind: str) -> Path:
    """A per-user folder (platformdirs: state, log, config or cache) that survives reinstalling or updating
    the bridge, and lies outside a bundle's folder (which Claude Desktop replaces on update, and which the
    Microsoft Store build virtualises)."""
    import platformdirs

    return Path(getattr(platformdirs, f"user_{kind}_dir")(APP_NAME, appauthor=False))


@contextlib.contextmanager
def bytecode_cached() -> Iterator[None]:
    """Import the package with its bytecode in the per-user cache: written even where PYTHONDONTWRITEBYTECODE
    is set (every job starts a supervisor, which then skips compiling), and never into the install folder (a
    bundle's is read-only and replaced on update). Later imports (the MCP stack) use their own caches."""
    saved = sys.pycache_prefix, sys.dont_write_bytecode
    sys.pycache_prefix, sys.dont_write_bytecode = str(user_dir("cache") / "bytecode"), False
    try:
        yield
    finally:
        sys.pycache_prefix, sys.dont_write_bytecode = saved
