"""The benchmark starts and produces every row on a tiny configuration (its numbers are not judged here)."""
import subprocess
import sys

import pytest

from conftest import require_component, require_sandbox
from harness import REAL_ACP_VERSIONS, REAL_HERMES_VERSIONS, REPO

pytestmark = [pytest.mark.e2e, pytest.mark.posix("the benchmark drives the fake hermes, a shell script")]

TINY_ACP_VERSIONS = REAL_ACP_VERSIONS[-1:]  # --tiny runs the real Hermes rows on the newest ACP version only
ROWS = ["server start: spawn to the initialize reply", "cold start: spawn, initialize, tools/list",
        "server RSS after start", "spawn to the initialize reply at load 10", "one hermes_health call, warm",
        "hermes_run(wait_s=0) until the record shows Hermes' pid", "supervisor RSS",
        "supervisor CPU per minute with a token and a cost budget",
        "hermes_status of a job with a 8 MiB log", "start listing of a folder of 2,000 files",
        "hermes_run(wait_s=0) until Hermes runs, folder of 2,000 files",
        "hermes_status of a running job with activity, store of 2,000 messages",
        "hermes_capabilities over 50 skills", "supervisor spawn until Hermes' pid", "supervisor RSS at Hermes' start",
        "the sandbox's step: spawn until the program has run",
        "a job's start under network allow-list", "one HTTP request through the job's proxy",
        "hermes_jobs with 100 records",
        "hermes_jobs with 1,000 records",
        *(f"{kind} (network ask, the default) until the model's first request, Hermes {version} over ACP, warm"
          for kind in ("hermes_run", "a worktree job", "jobs taking turns in 2 folders",
                       "hermes_run in a new folder, bound late", "hermes_resume", "a resumed worktree job")
          for version in TINY_ACP_VERSIONS),
        *(f"hermes_run (network model-only) until the model's first request, Hermes {version} over ACP, warm"
          for version in TINY_ACP_VERSIONS),
        *(f"session/new on a warmed hermes acp {version}, a new folder" for version in TINY_ACP_VERSIONS),
        *(f"a server's first job until the model's first request, Hermes {version} over ACP, warm"
          for version in TINY_ACP_VERSIONS),
        *(f"3 jobs started together in one folder, each until its model's first request, Hermes {version}"
          for version in TINY_ACP_VERSIONS),
        *(f"Hermes {version}'s modules imported first, then bound to a new folder" for version in TINY_ACP_VERSIONS),
        *(f"Hermes {version}'s core modules imported, confined, from an install without bytecode"
          for version in TINY_ACP_VERSIONS)]


@pytest.mark.timeout(900)  # a dozen real Hermes starts: 1-2 minutes alone, 4 or more beside the Windows lane
def test_bench_runs_tiny_and_prints_every_row():
    require_sandbox()  # its row is printed where a job is sandboxed
    for version in TINY_ACP_VERSIONS:  # the warm start rows run the real Hermes
        require_component(REAL_HERMES_VERSIONS[version], f"the real Hermes CLI {version}")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench.py"), "--tiny"], capture_output=True,
                          text=True, timeout=840)
    assert done.returncode == 0, done.stdout + done.stderr
    table = [line for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(table) == len(ROWS) + 1
    for row, line in zip(ROWS, table[1:], strict=True):
        assert line.startswith(f"| {row}"), line
        assert "PASS" in line or "MISS" in line or "baseline" in line or "measured" in line
