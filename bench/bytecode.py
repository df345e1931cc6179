"""The benchmark's row for an install of the real Hermes without bytecode (as uv leaves it): a confined Hermes
cannot write its bytecode, so it compiled every module at each start until the bridge compiled the install
(launch.compile_at_start)."""
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rows import Row
from test_real_bytecode import uncompiled_copy
from warm_starts import installed_acp_versions

from claude_hermes_bridge.config import Config
from claude_hermes_bridge.hermes_cli import compile_install, confined_call, install_without_bytecode

HERMES_IMPORTS = "import run_agent, model_tools, acp_adapter.server"


def confined_import_s(cfg: Config, hermes: Path) -> float:
    """Hermes' core imports, run by its install's Python inside the sandbox a job's Hermes gets."""
    with confined_call(cfg, [str(hermes.parent / "python"), "-c", HERMES_IMPORTS]) as (argv, env):
        started = time.perf_counter()
        subprocess.run(argv, check=True, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
        return time.perf_counter() - started


def bytecode_rows(runs: int, versions: Sequence[str]) -> list[Row]:
    """Issue 65 (found on the way): two uncompiled copies of each installed ACP version, one then compiled by the
    bridge; the confined imports of each, alternating."""
    rows = []
    for version, exe in installed_acp_versions("bytecode", versions):
        with tempfile.TemporaryDirectory() as tmp:
            as_installed = uncompiled_copy(exe, Path(tmp) / "as-installed")
            compiled = uncompiled_copy(exe, Path(tmp) / "compiled")
            cfg = Config(path=Path(tmp) / "config.json", hermes_exe=str(compiled), hermes_home=str(Path(tmp)))
            site = install_without_bytecode(str(compiled))
            assert site and install_without_bytecode(str(as_installed)), "the copies hold no bytecode"
            started = time.perf_counter()
            outcome = compile_install(cfg, str(compiled), site)
            compile_s = time.perf_counter() - started
            assert outcome == "compiled", outcome
            times: dict[str, list[float]] = {"compiled": [], "as installed": []}
            for _ in range(runs):
                times["as installed"].append(confined_import_s(cfg, as_installed))
                times["compiled"].append(confined_import_s(cfg, compiled))
        ratio = statistics.median(times["as installed"]) / statistics.median(times["compiled"])
        rows.append(Row(f"Hermes {version}'s core modules imported, confined, from an install without bytecode: "
                        f"compiled by the bridge (once, {compile_s:.0f} s) (floor: as uv installs it)",
                        times["compiled"], times["as installed"], "s",
                        f"{ratio:.1f}x faster {'PASS' if ratio >= 2 else 'MISS'}", "compiled >= 2x faster"))
    return rows
