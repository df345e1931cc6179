"""How close the bridge runs to its floor, and how its cost grows: one table, measured side by side.

    python bench/bench.py            # the full run (about two minutes on two cores)
    python bench/bench.py --tiny     # small sizes, one run each, the real Hermes rows on the newest Hermes
                                     # with ACP only: checks that every row is produced

Each figure is the median of several runs, with its spread (min-max), next to a floor measured in the same
run: the same SDK with a minimal one-tool server, a bare Popen, a seek, a folder listing, a bare
interpreter. Timings on shared machines are noisy, so only ratios measured together mean anything.
Uses the fake hermes from the tests; needs no other service.
"""
import argparse
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import psutil  # noqa: E402
from bytecode import bytecode_rows  # noqa: E402
from rows import Row, ms_since, ratio_row  # noqa: E402
from warm_starts import (  # noqa: E402
    first_job_rows,
    jobs_together_rows,
    late_binding_rows,
    session_new_rows,
    warm_start_rows,
)

import harness  # noqa: E402
from claude_hermes_bridge.folder_changes import snapshot_folder  # noqa: E402
from claude_hermes_bridge.job_queue import supervisor_argv  # noqa: E402
from claude_hermes_bridge.jobs import JobRecord, JobState, JobStore  # noqa: E402
from claude_hermes_bridge.launch import JobRequest  # noqa: E402
from claude_hermes_bridge.network import JobProxy, NetworkPolicy, host_rule  # noqa: E402
from claude_hermes_bridge.processes import JOB_MARKER  # noqa: E402
from claude_hermes_bridge.sandbox import mechanism, step_argv  # noqa: E402
from harness import REAL_ACP_VERSIONS, Bridge, BridgeClient, wait_until  # noqa: E402

harness.SERVERS_FORKED = False  # every server here starts as a host starts it: its start is measured

MINIMAL = [sys.executable, str(Path(__file__).resolve().parent / "minimal_server.py")]
MB = 2**20


def cold_start(bridge: Bridge, runs: int) -> tuple[Row, Row, Row]:
    """spawn -> the initialize reply (what a host waits on before it lists tools: Codex's startup timeout) ->
    tools/list, and the server's RSS right after, alternating with the floor."""
    times: dict[str, list[float]] = {"ours": [], "floor": []}
    initialized: dict[str, list[float]] = {"ours": [], "floor": []}
    rss: dict[str, list[float]] = {"ours": [], "floor": []}
    for _ in range(runs):
        for side, command in (("ours", None), ("floor", MINIMAL)):
            started = time.perf_counter()
            with BridgeClient(bridge.env, command=command) as client:
                initialized[side].append(ms_since(started))
                client.portal.call(client.session.list_tools)
                times[side].append(ms_since(started))
                rss[side].append(psutil.Process(client.server_pid).memory_info().rss / MB)
    return (ratio_row("server start: spawn to the initialize reply", initialized["ours"], initialized["floor"], "ms",
                      1.15),
            ratio_row("cold start: spawn, initialize, tools/list", times["ours"], times["floor"], "ms", 1.15),
            ratio_row("server RSS after start", rss["ours"], rss["floor"], "MB", 1.2))


def initialize_under_load(bridge: Bridge, runs: int, busy: int) -> Row:
    """Issue 67: spawn to the initialize reply with `busy` processes spinning on this machine's cores (load
    `busy`), the answer kept from the last start (ours) against the SDK's own answer (floor: the kept answers
    removed before the start), alternating; the bytecode cache is the same for both."""
    answers = Path(bridge.env["XDG_CACHE_HOME"]) / "claude-hermes-bridge" / "initialize"
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    times: dict[str, list[float]] = {"ours": [], "floor": []}
    try:
        with BridgeClient(bridge.env):
            pass  # an answer kept for this request
        for _ in range(runs):
            for side in ("ours", "floor"):
                if side == "floor":
                    shutil.rmtree(answers, ignore_errors=True)
                started = time.perf_counter()
                with BridgeClient(bridge.env):
                    times[side].append(ms_since(started))
    finally:
        for process in spinning:
            process.kill()
            process.wait()
    kept = statistics.median(times["ours"])
    return Row(f"spawn to the initialize reply at load {busy} ({os.cpu_count()} cores), the kept answer (floor: "
               "the SDK's)", times["ours"], times["floor"], "ms", f"{kept:.0f} ms {'PASS' if kept <= 1000 else 'MISS'}",
               "<= 1000 ms")


def warm_calls(ours: BridgeClient, floor: BridgeClient, calls: int) -> Row:
    times: dict[str, list[float]] = {"ours": [], "floor": []}
    for _ in range(calls):
        for side, call in (("ours", lambda: ours.call("hermes_health")), ("floor", lambda: floor.call("tail"))):
            started = time.perf_counter()
            call()
            times[side].append(ms_since(started))
    return ratio_row("one hermes_health call, warm (floor: trivial tool)", times["ours"], times["floor"], "ms", 1.5)


def run_until_pid(bridge: Bridge, client: BridgeClient, runs: int) -> tuple[Row, Row]:
    """hermes_run(wait_s=0) until the record shows Hermes' pid, against Popen of the same fake command."""
    ours, floor, supervisor_rss, bare_rss, job_ids = [], [], [], [], []
    for n in range(runs):
        started = time.perf_counter()
        job_id = client.call("hermes_run", task=f"bench run {n} !sleep=3", wait_s=0).field("JOB_ID")
        record = wait_for_hermes(bridge, job_id)
        ours.append(ms_since(started))
        job_ids.append(job_id)
        assert record.supervisor is not None
        supervisor_rss.append(psutil.Process(record.supervisor.pid).memory_info().rss / MB)
        started = time.perf_counter()
        proc = subprocess.Popen([str(bridge.hermes), "chat", "-q", f"floor {n} !sleep=3", "-Q"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        floor.append(ms_since(started))
        proc.kill()
        proc.wait()
        bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
        time.sleep(0.3)
        bare_rss.append(psutil.Process(bare.pid).memory_info().rss / MB)
        bare.kill()
        bare.wait()
    for job_id in job_ids:
        client.wait_final(job_id)
    overhead = statistics.median(ours) - statistics.median(floor)
    largest_rss = max(supervisor_rss)  # the first job's in a fresh jobs folder among them (issue 39 saw 33 MB)
    return (Row("hermes_run(wait_s=0) until the record shows Hermes' pid (floor: Popen)", ours, floor, "ms",
                f"overhead {overhead:.0f} ms {'PASS' if overhead <= 150 else 'MISS'}", "overhead <= 150 ms"),
            Row("supervisor RSS (floor: bare interpreter)", supervisor_rss, bare_rss, "MB",
                f"first job {supervisor_rss[0]:.1f} MB, largest {largest_rss:.1f} MB "
                f"{'PASS' if largest_rss <= 25 else 'MISS'}", "every one <= 25 MB"))


def spend_reading(bridge: Bridge, client: BridgeClient, seconds: float) -> Row:
    """Issue 29: a supervisor with a budget looks at Hermes' store twice a second, and reads it when it has
    changed. Two jobs run side by side, each making an API call every 0.3 s (a worst case: a real model takes
    seconds); one has budgets it never reaches, the other none (its spend is read once, at the end). Each figure
    is a supervisor's CPU time per minute over the same stretch of both runs."""
    calls = int(seconds / 0.3) + 10
    budgeted = client.call("hermes_run", task=f"bench budget !calls={calls}", max_tokens=10**9, max_cost_usd=1000,
                           wait_s=0).field("JOB_ID")
    plain = client.call("hermes_run", task=f"bench no budget !calls={calls}", wait_s=0).field("JOB_ID")
    supervisors = {job_id: psutil.Process(wait_for_hermes(bridge, job_id).supervisor.pid)  # type: ignore[union-attr]
                   for job_id in (budgeted, plain)}
    per_minute: dict[str, list[float]] = {budgeted: [], plain: []}
    for _ in range(4):  # CPU time is counted in 10 ms ticks: windows of seconds, not of one
        before = {job_id: sum(proc.cpu_times()[:2]) for job_id, proc in supervisors.items()}
        started = time.perf_counter()
        time.sleep(seconds / 4)
        elapsed = time.perf_counter() - started
        for job_id, proc in supervisors.items():
            per_minute[job_id].append((sum(proc.cpu_times()[:2]) - before[job_id]) / elapsed * 60 * 1000)
    for job_id in (budgeted, plain):
        client.call("hermes_cancel", job_id=job_id)
        client.wait_final(job_id)
    spent = statistics.median(per_minute[budgeted]) - statistics.median(per_minute[plain])
    return Row("supervisor CPU per minute with a token and a cost budget (floor: the same job without)",
               per_minute[budgeted], per_minute[plain], "ms/min",
               f"extra {spent:.0f} ms/min {'PASS' if spent <= 300 else 'MISS'}", "extra <= 300 ms/min (0.5% of a core)")


def status_of_big_log(bridge: Bridge, ours: BridgeClient, floor: BridgeClient, log_mb: int, calls: int) -> Row:
    job_id = "20261201-000000-1"
    log = bridge.jobs / f"{job_id}.log"
    line = b"a line of Hermes output, as a long job would print it, again and again.\n" * 1024
    with open(log, "wb") as handle:
        for _ in range(log_mb * MB // len(line)):
            handle.write(line)
    JobStore(bridge.jobs).write(JobRecord(
        id=job_id, state=JobState.OK, exit_code=0, created_at=time.time(), ended_at=time.time(),
        cwd=str(bridge.root), log=str(log)))
    rss_before = psutil.Process(ours.server_pid).memory_info().rss / MB
    times: dict[str, list[float]] = {"ours": [], "floor": []}
    for _ in range(calls):
        for side, call in (("ours", lambda: ours.call("hermes_status", job_id=job_id, wait_s=0)),
                           ("floor", lambda: floor.call("tail", path=str(log)))):
            started = time.perf_counter()
            call()
            times[side].append(ms_since(started))
    growth = psutil.Process(ours.server_pid).memory_info().rss / MB - rss_before
    row = ratio_row(f"hermes_status of a job with a {log_mb} MiB log (floor: seek + 64 KiB read)",
                    times["ours"], times["floor"], "ms", 2)
    row.verdict += f"; RSS growth {growth:.1f} MB {'PASS' if growth <= 5 else 'MISS'}"
    row.target += "; RSS growth <= 5 MB"
    log.unlink()
    return row


def fill_records(jobs: Path, count: int) -> None:
    existing = len([e for e in os.scandir(jobs) if e.name.endswith(".json")])
    day = time.strftime("%Y%m%d")
    store = JobStore(jobs)
    for n in range(existing, count):
        job_id = f"{day}-{n // 1000:06d}-{n % 1000 + 1}"
        store.write(JobRecord(id=job_id, state=JobState.OK, exit_code=0, created_at=1.0, ended_at=2.0,
                                     cwd="/w", task_preview=f"finished job {n}"))


def jobs_listing(sizes: list[int], runs: int) -> list[Row]:
    """hermes_jobs over many records, against listing the same folder with os.scandir."""
    rows, baseline = [], None
    with tempfile.TemporaryDirectory() as tmp:
        bridge = Bridge.create(Path(tmp))
        bridge.configure(retention_max_jobs=10**9)
        bridge.jobs.mkdir()
        with BridgeClient(bridge.env) as client:
            for size in sizes:
                fill_records(bridge.jobs, size)
                ours, floor = [], []
                for _ in range(runs):
                    started = time.perf_counter()
                    client.call("hermes_jobs")
                    ours.append(ms_since(started))
                    started = time.perf_counter()
                    with os.scandir(bridge.jobs) as entries:
                        [entry.name for entry in entries]
                    floor.append(ms_since(started))
                if baseline is None:
                    baseline = (statistics.median(ours), statistics.median(floor))
                    verdict, target = "baseline for growth", "-"
                else:
                    grow_ours = statistics.median(ours) / baseline[0]
                    grow_floor = statistics.median(floor) / baseline[1]
                    verdict = (f"grew x{grow_ours:.1f} vs listing x{grow_floor:.1f} "
                               f"{'PASS' if grow_ours <= grow_floor else 'MISS'}")
                    target = "grows no faster than the listing"
                if size == 10_000:
                    fine = statistics.median(ours) <= 300
                    verdict += f"; {statistics.median(ours):.0f} ms {'PASS' if fine else 'MISS'}"
                    target += "; <= 300 ms"
                rows.append(Row(f"hermes_jobs with {size:,} records (floor: os.scandir)", ours, floor, "ms",
                                verdict, target))
    return rows


def capabilities(bridge: Bridge, skills: int, repeats: int) -> Row:
    import yaml

    root = Path(bridge.settings["hermes_home"]) / "skills"
    for n in range(skills):
        path = root / f"category-{n % 25}" / f"skill-{n}" / "SKILL.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"---\nname: skill-{n}\ndescription: Skill number {n} does a thing well\nversion: 1.0.0\n"
                        f"metadata:\n  hermes:\n    tags: [tag-{n % 7}, bench]\n    related_skills: []\n---\n"
                        f"# skill {n}\n" + "body text\n" * 40)
    started = time.perf_counter()
    for path in root.rglob("SKILL.md"):
        yaml.load(path.read_text().split("---")[1], Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    parse_once = [ms_since(started)]
    with BridgeClient(bridge.env) as client:
        started = time.perf_counter()
        client.call("hermes_capabilities", query="thing")
        first = ms_since(started)
        repeated = []
        for _ in range(repeats):
            started = time.perf_counter()
            client.call("hermes_capabilities", query="thing")
            repeated.append(ms_since(started))
    share = statistics.median(repeated) / first
    return Row(f"hermes_capabilities over {skills:,} skills, repeated (floor: parsing them once)", repeated,
               parse_once, "ms", f"repeated = {share:.0%} of first ({first:.0f} ms) "
               f"{'PASS' if share <= 0.10 else 'MISS'}", "repeated <= 10 % of first")


def make_files(folder: Path, count: int) -> None:
    for n in range(count):
        sub = folder / f"d{n // 1000}"
        if n % 1000 == 0:
            sub.mkdir(parents=True, exist_ok=True)
        os.close(os.open(sub / f"f{n}.txt", os.O_CREAT | os.O_WRONLY, 0o644))


def wait_for_hermes(bridge: Bridge, job_id: str) -> JobRecord:
    """The record once it names Hermes' process, polled every millisecond: the launch is what is timed."""
    return wait_until(lambda: record if (record := bridge.record(job_id)).hermes else None, 60,
                      f"job {job_id} to start Hermes", interval=0.001)


SINGLE_FILE_COMMIT = "13ddf65"  # the last commit whose server.py held everything (issue 36 split it)


def supervisor_start(bridge: Bridge, runs: int) -> tuple[Row, Row]:
    """A real supervisor from spawn until its record names Hermes' pid, and its RSS then: booted from the package
    (through entry, the supervisor's modules only) against the single server.py before the split, alternating,
    each with its bytecode cache warm (one unmeasured run first)."""
    import importlib.util

    folder = Path(tempfile.mkdtemp(prefix="single-file-"))
    for name in ("server.py", "job_view.html"):
        shown = subprocess.run(["git", "show", f"{SINGLE_FILE_COMMIT}:{name}"], cwd=Path(__file__).parent,
                               capture_output=True, check=True)
        (folder / name).write_bytes(shown.stdout)
    spec = importlib.util.spec_from_file_location("single_file_server", folder / "server.py")
    assert spec is not None and spec.loader is not None
    single_file = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(single_file)
    boots = {"package": supervisor_argv, "single file": single_file.supervisor_argv}
    times: dict[str, list[float]] = {side: [] for side in boots}
    rss: dict[str, list[float]] = {side: [] for side in boots}
    store = JobStore(bridge.jobs)
    store.ensure()
    for n in range(runs + 1):
        for side, argv in boots.items():
            request = JobRequest(kind="run", task=f"supervisor {side} {n} !sleep=1", cwd=str(bridge.root),
                                 max_turns=None, timeout_s=60, skills=[], toolsets=[])
            job_id = store.claim_id(request.task.encode())
            record = request.record(job_id, str(store.log_path(job_id)))
            store.write(record)
            store.mark_active(job_id)
            started = time.perf_counter()
            proc = subprocess.Popen(argv(job_id), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env=dict(bridge.env, **{JOB_MARKER: record.marker}))
            wait_for_hermes(bridge, job_id)
            if n:
                times[side].append(ms_since(started))
                rss[side].append(psutil.Process(proc.pid).memory_info().rss / MB)
            proc.wait(60)
    return (ratio_row(f"supervisor spawn until Hermes' pid (floor: the single server.py of {SINGLE_FILE_COMMIT})",
                      times["package"], times["single file"], "ms", 1.1),
            ratio_row("supervisor RSS at Hermes' start (floor: the same, single server.py)", rss["package"],
                      rss["single file"], "MB", 1.05))


def activity_rows(bridge: Bridge, client: BridgeClient, files: int, messages: int, runs: int,
                  calls: int) -> list[Row]:
    """The costs issue 14 added: the activity lines on a big session store, the start listing of a big
    folder, and whether that listing ever sits on the launch path."""
    big = bridge.root / "big"
    make_files(big, files)
    (bridge.root / "empty").mkdir()
    rows = []
    walk, floor = [], []
    for _ in range(runs):
        started = time.perf_counter()
        snapshot = snapshot_folder(str(big), [], files * 2, 600)
        walk.append(ms_since(started))
        started = time.perf_counter()
        sum(len(names) for _, _, names in os.walk(big))
        floor.append(ms_since(started))
    assert len(snapshot.files) == files
    rows.append(Row(f"start listing of a folder of {files:,} files (floor: os.walk)", walk, floor, "ms",
                    f"measured, ratio {statistics.median(walk) / statistics.median(floor):.2f}",
                    "off the launch path (next row)"))
    launch: dict[str, list[float]] = {"big": [], "empty": []}
    job_ids = []
    for n in range(runs):
        for side in ("big", "empty"):
            started = time.perf_counter()
            job_id = client.call("hermes_run", task=f"launch {side} {n} !sleep=2", cwd=str(bridge.root / side),
                                 wait_s=0).field("JOB_ID")
            wait_for_hermes(bridge, job_id)
            launch[side].append(ms_since(started))
            job_ids.append(job_id)
    for job_id in job_ids:
        client.wait_final(job_id)
    rows.append(ratio_row(f"hermes_run(wait_s=0) until Hermes runs, folder of {files:,} files (floor: empty folder)",
                          launch["big"], launch["empty"], "ms", 1.2))
    job_id = client.call("hermes_run", task="!tool-sleep=300", wait_s=0).field("JOB_ID")
    record = wait_for_hermes(bridge, job_id)
    store = bridge.tmp / "hermes-home" / "state.db"
    while True:
        status = client.call("hermes_status", job_id=job_id, wait_s=0)
        if "CURRENT_TOOL: terminal" in status.text:
            break
        time.sleep(0.1)
    db = sqlite3.connect(store, timeout=30)
    session = db.execute("SELECT id FROM sessions ORDER BY started_at DESC LIMIT 1").fetchone()[0]
    with db:
        db.executemany("INSERT INTO messages (session_id, role, content, timestamp) VALUES (?, 'assistant', ?, ?)",
                       [(session, f"message {n}", (record.started_at or 0) - 1) for n in range(messages)])
    db.close()
    timed: dict[str, list[float]] = {"store": [], "none": []}
    for _ in range(calls):
        for side in ("store", "none"):
            moved = [Path(f"{store}{suffix}") for suffix in ("", "-wal", "-shm") if side == "none"
                     and Path(f"{store}{suffix}").exists()]
            for path in moved:
                path.rename(path.with_name(path.name + ".away"))
            started = time.perf_counter()
            text = client.call("hermes_status", job_id=job_id, wait_s=0).text
            timed[side].append(ms_since(started))
            for path in moved:
                path.with_name(path.name + ".away").rename(path)
            assert ("CURRENT_TOOL: terminal" in text) == (side == "store"), text
    client.call("hermes_cancel", job_id=job_id)
    rows.append(ratio_row(f"hermes_status of a running job with activity, store of {messages:,} messages "
                          "(floor: the same call without a store)", timed["store"], timed["none"], "ms", 1.5))
    return rows


def sandbox_step(folder: Path, runs: int) -> Row:
    """What the sandbox adds to a job's start: the same program spawned bare and through the sandbox's step
    (an interpreter that confines itself, then becomes the program), alternating, until it has exited."""
    program = [shutil.which("true") or "/bin/true"]
    times: dict[str, list[float]] = {"sandboxed": [], "bare": []}
    for n in range(runs + 1):
        for side in times:
            command = step_argv([str(folder)], program) if side == "sandboxed" else program
            started = time.perf_counter()
            subprocess.run(command, check=True, stdin=subprocess.DEVNULL)
            if n:
                times[side].append(ms_since(started))
    added = statistics.median(times["sandboxed"]) - statistics.median(times["bare"])
    return Row("the sandbox's step: spawn until the program has run (floor: the same, unconfined)",
               times["sandboxed"], times["bare"], "ms", f"adds {added:.1f} ms {'PASS' if added < 20 else 'MISS'}",
               "adds < 20 ms")


def proxy_rows(folder: Path, runs: int, requests: int) -> list[Row]:
    """What a limited network costs (network: allow-list against open): at a job's start, the job's proxy started
    and the sandbox's step with its network rules, against the step alone; per request, a GET through the proxy
    against the same GET straight to the server (on 127.0.0.1, so the proxy's own cost is all there is)."""
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Small(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Small)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    program = [shutil.which("true") or "/bin/true"]
    starts: dict[str, list[float]] = {"limited": [], "open": []}
    for n in range(runs + 1):
        for side in starts:
            started = time.perf_counter()
            proxy = JobProxy(NetworkPolicy("allow-list", (host_rule(f"127.0.0.1:{port}"),), None)) if (
                side == "limited") else None
            subprocess.run(step_argv([str(folder)], program, None, proxy.port if proxy else None), check=True,
                           stdin=subprocess.DEVNULL)
            if n:
                starts[side].append(ms_since(started))
            if proxy:
                proxy.close()
    proxy = JobProxy(NetworkPolicy("allow-list", (host_rule(f"127.0.0.1:{port}"),), None))
    openers = {"proxied": urllib.request.build_opener(urllib.request.ProxyHandler(
        {"http": f"http://127.0.0.1:{proxy.port}"})), "direct": urllib.request.build_opener(
        urllib.request.ProxyHandler({}))}
    gets: dict[str, list[float]] = {"proxied": [], "direct": []}
    for n in range(requests + 1):
        for side, opener in openers.items():
            started = time.perf_counter()
            with opener.open(f"http://127.0.0.1:{port}/", timeout=10) as response:
                response.read()
            if n:
                gets[side].append(ms_since(started))
    proxy.close()
    server.shutdown()
    added = statistics.median(starts["limited"]) - statistics.median(starts["open"])
    per_request = statistics.median(gets["proxied"]) - statistics.median(gets["direct"])
    return [Row("a job's start under network allow-list: its proxy and the step's network rules (floor: open)",
                starts["limited"], starts["open"], "ms", f"adds {added:.1f} ms {'PASS' if added < 10 else 'MISS'}",
                "adds < 10 ms"),
            Row("one HTTP request through the job's proxy (floor: straight to the server)", gets["proxied"],
                gets["direct"], "ms", f"adds {per_request:.1f} ms {'PASS' if per_request < 5 else 'MISS'}",
                "adds < 5 ms")]


def machine() -> str:
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or "unknown CPU"
    import importlib.metadata
    return (f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} cores, "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB; Python {platform.python_version()}, "
            f"mcp {importlib.metadata.version('mcp')}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Benchmark the bridge against its floors.")
    parser.add_argument("--tiny", action="store_true",
                        help="small sizes, one run each, the real Hermes rows on the newest version: checks every row")
    args = parser.parse_args(argv)
    runs, calls, log_mb = (1, 5, 8) if args.tiny else (7, 40, 1024)
    sizes = [100, 1000] if args.tiny else [1000, 10_000, 100_000]
    skills = 50 if args.tiny else 1000
    files, messages = (2000, 2000) if args.tiny else (100_000, 100_000)
    started = time.time()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        bridge = Bridge.create(Path(tmp))
        bridge.configure(max_running_jobs=100)
        try:
            rows += cold_start(bridge, runs)
            rows.append(initialize_under_load(bridge, max(5, runs) if not args.tiny else runs, 10))
            with BridgeClient(bridge.env) as ours, BridgeClient(bridge.env, command=MINIMAL) as floor:
                rows.append(warm_calls(ours, floor, calls))
                rows += run_until_pid(bridge, ours, runs)
                rows.append(spend_reading(bridge, ours, 4 if args.tiny else 40))
                rows.append(status_of_big_log(bridge, ours, floor, log_mb, calls))
                rows += activity_rows(bridge, ours, files, messages, runs, calls)
            rows.append(capabilities(bridge, skills, runs + 1))
            rows += supervisor_start(bridge, runs)
            if mechanism().name:
                rows.append(sandbox_step(bridge.root, runs * 3))
                rows += proxy_rows(bridge.root, runs * 3, calls * 5)
        finally:
            bridge.kill_leftovers()
    rows += jobs_listing(sizes, runs)
    # a real Hermes start costs a few CPU-seconds; the rows' code is the same for every version
    acp_versions = REAL_ACP_VERSIONS[-1:] if args.tiny else REAL_ACP_VERSIONS
    rows += warm_start_rows(max(5, runs) if not args.tiny else runs, acp_versions)
    rows += warm_start_rows(max(3, runs) if not args.tiny else runs, acp_versions, worktree=True)
    rows += warm_start_rows(max(4, runs) if not args.tiny else runs, acp_versions, folders=2)
    rows += warm_start_rows(max(3, runs) if not args.tiny else runs, acp_versions, new_folders=True)
    rows += warm_start_rows(max(3, runs) if not args.tiny else runs, acp_versions, resumed=True)
    rows += warm_start_rows(max(3, runs) if not args.tiny else runs, acp_versions, worktree=True, resumed=True)
    rows += warm_start_rows(max(3, runs) if not args.tiny else runs, acp_versions, network="model-only")
    rows += session_new_rows(runs * 3, acp_versions)
    rows += first_job_rows(max(3, runs) if not args.tiny else runs, acp_versions)
    rows += jobs_together_rows(max(3, runs) if not args.tiny else runs, acp_versions)
    rows += late_binding_rows(max(3, runs) if not args.tiny else runs, acp_versions)
    rows += bytecode_rows(max(3, runs) if not args.tiny else runs, acp_versions)
    print(f"machine: {machine()}")
    print(f"runs: {runs} per figure ({calls} for single calls); total {time.time() - started:.0f} s\n")
    header = ["figure", "bridge: median (min-max)", "floor: median (min-max)", "result", "target"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        print("| " + " | ".join(row.cells()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
