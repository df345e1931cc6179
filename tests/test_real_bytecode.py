"""The real Hermes 0.22.2 installed without bytecode, as uv leaves it: a server's start compiles it, confined to its
site-packages, and a job then runs from it over ACP with the scripted model."""
import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_real_hermes import assert_turn_ended, finish, write_hermes_home

from claude_hermes_bridge.hermes_cli import install_without_bytecode
from conftest import require_component, require_sandbox
from harness import REAL_HERMES_VERSIONS, Bridge, wait_until
from scripted_model import ScriptedModel

pytestmark = [pytest.mark.e2e,
              pytest.mark.posix("the real Hermes installs here are Linux ones; the Windows lane has its own")]


def uncompiled_copy(exe: Path, into: Path) -> Path:
    """A virtual environment of the same Python holding a copy of this install's site-packages without its
    bytecode, and its `hermes` console script as an installer writes it."""
    python = os.path.realpath(exe.parent / "python")
    subprocess.run([python, "-m", "venv", "--without-pip", str(into)], check=True)
    [site] = glob.glob(str(exe.parent.parent / "lib" / "python3.*" / "site-packages"))
    [copy] = glob.glob(str(into / "lib" / "python3.*" / "site-packages"))
    shutil.copytree(site, copy, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True, symlinks=True)
    hermes = into / "bin" / "hermes"
    hermes.write_text(f"#!{into / 'bin' / 'python'}\nimport sys\nfrom hermes_cli.main import main\nsys.exit(main())\n")
    hermes.chmod(0o755)
    return hermes


def test_a_real_hermes_without_bytecode_is_compiled_at_a_servers_start_and_then_runs_a_job(bridge: Bridge) -> None:
    require_sandbox()
    exe = require_component(REAL_HERMES_VERSIONS["0.22.2"], "the real Hermes CLI 0.22.2")
    hermes = uncompiled_copy(exe, bridge.tmp / "uv-hermes")
    site = install_without_bytecode(str(hermes))
    assert site, "the copy holds no bytecode"
    home = bridge.tmp / "real-home"
    with ScriptedModel(bridge.tmp) as model:
        write_hermes_home(home, model.base_url)
        bridge.configure(hermes_exe=str(hermes), hermes_home=str(home), kill_grace_s=5, hermes_driver="acp",
                         approvals="yolo")
        with bridge.client() as client:
            def compiled() -> str | None:
                text = client.call("hermes_health").text
                return text if "HERMES_BYTECODE: compiled by the bridge" in text else None
            health = wait_until(compiled, 600, "the install compiled", interval=1)
            assert f" in {site} (Hermes' install had none" in health
            job = finish(client, client.call("hermes_run", task="Hello.\nRUN: pwd", wait_s=45), timeout=300)
            assert_turn_ended(job)
    assert install_without_bytecode(str(hermes)) is None
    assert len(glob.glob(os.path.join(site, "run_agent*.py"))) == 1 and glob.glob(
        os.path.join(site, "__pycache__", "run_agent.*.pyc"))
