"""A confined Hermes cannot write bytecode into its install, so an install without it (uv installs so) compiled
every module it imports at each job's start (about 2 s more before the model; more when busy). A server's start
compiles it once, with Hermes' own Python, confined to that site-packages, and hermes_health says so; a compile
that cannot run leaves the advice."""
import subprocess
import sys
from pathlib import Path

import pytest

from claude_hermes_bridge.hermes_cli import install_without_bytecode
from conftest import require_sandbox
from harness import SERVER, Bridge, BridgeClient, wait_until

pytestmark = pytest.mark.posix("the sandbox confines the compile (Landlock or Seatbelt)")


def uv_like_install(bridge: Bridge, python: str | None) -> tuple[Path, Path, Path]:
    """An install laid out as uv leaves it, without bytecode: the fake `hermes` as its console script, Hermes'
    core modules in its site-packages, and bin/python (given `python`: a wrapper that first tries to write
    OUTSIDE beside the install, then runs this Python). Its `hermes`, its site-packages and OUTSIDE."""
    install = bridge.tmp / "uv-install"
    site = install / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "hermes_cli").mkdir(parents=True)
    for module in ("run_agent.py", "model_tools.py", "hermes_cli/__init__.py", "hermes_cli/main.py"):
        (site / module).write_text("ANSWER = 42\n")
    (install / "bin").mkdir()
    outside = bridge.tmp / "OUTSIDE"
    if python:
        (install / "bin" / "python").write_text(f"#!/bin/sh\necho ran > '{outside}'\nexec '{python}' \"$@\"\n")
        (install / "bin" / "python").chmod(0o755)
    hermes = install / "bin" / "hermes"
    hermes.write_text(bridge.hermes.read_text())
    hermes.chmod(0o755)
    bridge.configure(hermes_exe=str(hermes))
    return hermes, site, outside


def health_saying(client: BridgeClient, words: str, what: str) -> str:
    """hermes_health's answer once it says words (the compile runs in a thread of the server's start)."""
    def answer() -> str | None:
        text = client.call("hermes_health").text
        return text if words in text else None
    return wait_until(answer, 60, what, interval=0.5)


def test_a_servers_start_compiles_an_install_without_bytecode_once_confined_to_its_site_packages(bridge):
    require_sandbox()
    hermes, site, outside = uv_like_install(bridge, sys.executable)
    assert install_without_bytecode(str(hermes)) == str(site)
    with bridge.client() as client:
        compiled = site / "__pycache__" / f"run_agent.{sys.implementation.cache_tag}.pyc"
        wait_until(compiled.exists, 120, "Hermes' install compiled")
        health = health_saying(client, "compiled by the bridge", "hermes_health saying so")
    assert "HERMES_BYTECODE: compiled by the bridge at " in health and f" in {site} (Hermes' install had none" in health
    assert (site / "hermes_cli" / "__pycache__" / f"main.{sys.implementation.cache_tag}.pyc").exists()
    assert install_without_bytecode(str(hermes)) is None
    assert not outside.exists()  # the compile's own Python was held by the sandbox: it wrote nothing outside


def test_an_install_the_bridge_cannot_compile_keeps_the_advice_and_runs_jobs(bridge):
    require_sandbox()
    hermes, site, _ = uv_like_install(bridge, None)  # no bin/python: nothing to compile it with
    with bridge.client() as client:
        health = health_saying(client, "the last try", "the failed compile noted")
        line = next(line for line in health.splitlines() if line.startswith("HERMES_BYTECODE: "))
        assert line.startswith(f"HERMES_BYTECODE: none in {site}: a confined Hermes cannot write it there")
        assert f"(the last try: not compiled: Hermes' install has no {site.parents[2] / 'bin' / 'python'})" in line
        assert f"-m compileall -q {site}`" in line
        final = client.call("hermes_run", task="still runs", wait_s=30)
        assert final.field("STATUS") == "ok", final.text
    assert install_without_bytecode(str(hermes)) == str(site)
    check = subprocess.run([sys.executable, str(SERVER), "--check"], env=bridge.env, capture_output=True, text=True,
                           timeout=120)
    assert f"HERMES_BYTECODE: none in {site}: a confined Hermes cannot write it there" in check.stdout, check.stdout
