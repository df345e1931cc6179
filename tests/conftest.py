"""Fixtures: a throwaway bridge per test, one module-wide bridge laid with traps, and the rule for tests that need
a real component."""
import os
import socket
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from harness import IN_CI, UNDER_WINE, Bridge, BridgeClient


@pytest.fixture
def bridge(tmp_path: Path) -> Iterator[Bridge]:
    b = Bridge.create(tmp_path)
    yield b
    b.kill_leftovers()


RUNNING: dict[str, pytest.Item] = {}  # the test running in this worker, for the tier check below


def pytest_runtest_setup(item: pytest.Item) -> None:
    """The test about to run, before any fixture of its own is made (a module's fixture is made for its first
    test: that test is the one that asks for the component)."""
    RUNNING["test"] = item


def in_end_to_end_tier(what: str) -> None:
    """A test that drives a real component belongs to the end-to-end tier (marked e2e), never to the fast tier
    README's test command runs: fail one that is not marked, so the split cannot rot."""
    test = RUNNING.get("test")
    if test is not None and test.get_closest_marker("e2e") is None:
        pytest.fail(f"{test.nodeid} drives {what}, a real component: mark it e2e (the end-to-end tier)")


def require_component(path: Path, what: str) -> Path:
    """A real component the test needs: missing fails under CI=true, and skips with one line elsewhere."""
    in_end_to_end_tier(what)
    if path.exists():
        return path
    message = f"{what} is not installed at {path}; tests/install_e2e.sh installs it"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def require_tool(name: str, also: Path | None = None) -> str:
    """A toolchain on PATH (or at also) that a test needs: missing fails under CI=true (tests/install_e2e.sh
    installs it), and skips with one line naming it elsewhere."""
    import shutil

    in_end_to_end_tier(name)
    found = shutil.which(name) or (str(also) if also is not None and also.exists() else None)
    if found:
        return found
    message = f"{name} is not installed; tests/install_e2e.sh installs Debian's package"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def require_sandbox() -> None:
    """A test of what Landlock enforces (with its signal scope, ABI 6+): fails under CI=true without it."""
    from claude_hermes_bridge.sandbox import landlock_abi

    abi, why_not = landlock_abi()
    if abi >= 6:
        return
    message = f"the sandbox tests need Landlock ABI 6 or later: {why_not or f'this kernel has ABI {abi}'}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "posix(reason): needs a POSIX system; on Windows it is skipped, with "
                                       "the reason shown")
    config.addinivalue_line("markers", "sdk_lines: goes through what differs between the MCP SDK's two lines "
                                       "(McpEdge: the tools as listed, questions and elicitation, the job view's "
                                       "resources and _meta, --check and --try); .ci/run runs these again on 1.x")
    config.addinivalue_line("markers", "e2e: drives a real component (the real Hermes versions, a host from npm, "
                                       "Chromium, Wine, uv, a toolchain): the end-to-end tier, `pytest -m e2e`; "
                                       "README's test command (the fast tier) leaves it out")
    config.addinivalue_line("markers", "uv_environment: the server runs in an environment uv builds from the "
                                       "project's pins, whatever MCP SDK this interpreter has")
    config.addinivalue_line("markers", "wine_lacks(reason): Windows behaviour Wine does not reproduce; under Wine "
                                       "(the Windows lane) it is skipped with the reason shown, and "
                                       "docs/verification.md says what was checked instead")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                               ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that drove a bridge carries its jobs' records and log tails, so a failure seen once (in CI,
    under load) says what the supervisor wrote, not only which line of the tool's answer differed."""
    report = yield
    bridge = getattr(item, "funcargs", {}).get("bridge")
    if report.failed and call.when == "call" and isinstance(bridge, Bridge):
        report.sections.append(("the bridge's jobs", bridge.jobs_report()))
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.name != "nt":
        return
    for item in items:
        marker = item.get_closest_marker("posix")
        if marker:
            item.add_marker(pytest.mark.skip(reason=f"needs POSIX: {marker.args[0]}"))
        marker = item.get_closest_marker("wine_lacks")
        if marker and UNDER_WINE:
            item.add_marker(pytest.mark.skip(reason=f"Wine lacks it: {marker.args[0]}"))


@pytest.fixture(scope="module")
def playground(tmp_path_factory) -> Iterator[tuple[Bridge, BridgeClient]]:
    """One bridge and server for the case tables below, its root laid with every trap they name: a sibling
    folder that shares the root's prefix, symlinks out and in a loop, a file, a FIFO and a socket."""
    bridge = Bridge.create(tmp_path_factory.mktemp("playground"))
    root = bridge.root
    (root.parent / (root.name + "b")).mkdir()
    (root.parent / (root.name + "b") / "secret.txt").write_text("secret")
    (root / "out").symlink_to("/etc")
    (root / "loop").symlink_to(root / "loop")
    (root / "file.txt").write_text("not a folder")
    os.mkfifo(root / "fifo")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(root / "sock"))
    with bridge.client() as client:
        yield bridge, client
    listener.close()
    bridge.kill_leftovers()


def step_as(user: str, argv: list[str], folder: Path) -> list[str]:
    """The sandbox's step (argv from step_argv) run as `user` ("this user", or "nobody" through setpriv), its
    module copied into folder for another user: a clone may lie in a folder only its owner can read (issue 69),
    and this tests the sandbox, not the clone's folder mode."""
    import shutil

    if user == "this user":
        return argv
    from claude_hermes_bridge import sandbox

    package = folder / "step-package" / "claude_hermes_bridge"
    package.mkdir(parents=True, exist_ok=True)
    folder.chmod(folder.stat().st_mode | 0o755)
    for name in ("__init__.py", "sandbox.py"):
        shutil.copyfile(Path(sandbox.__file__).parent / name, package / name)
    for path in (package.parent, package, *package.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o644)
    parent = argv.index(os.path.dirname(os.path.dirname(os.path.abspath(sandbox.__file__))))
    return [shutil.which("setpriv") or "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
            *argv[:parent], str(package.parent), *argv[parent + 1:]]
