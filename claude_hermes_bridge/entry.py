"""[both] The program picker: guard stdio first, then the supervisor (`--supervise ID`), a standby (`--standby
ID`), a job offered to a standby first (`--offered ID`) or the server.

Only the stdio guard is imported before the guard runs, and the supervisor's way never imports a server
module: server.py, `python -m claude_hermes_bridge`, the wheel's console script and the supervisor's boot all
come here."""
import sys

from claude_hermes_bridge.stdio_guard import guard_stdio, serves_protocol


def console_main() -> None:
    argv = sys.argv[1:]
    protocol_fds = guard_stdio() if serves_protocol(argv) else None
    from claude_hermes_bridge import preflight

    preflight.exit_if_missing(need_mcp=False)
    if len(argv) == 2 and argv[0] == "--supervise":
        with preflight.bytecode_cached():
            from claude_hermes_bridge import supervisor
        sys.exit(supervisor.main(argv[1]))
    if len(argv) == 2 and argv[0] in ("--standby", "--standby-any"):
        with preflight.bytecode_cached():
            from claude_hermes_bridge import standby
        sys.exit(standby.main(argv[1], any_folder=argv[0] == "--standby-any"))
    if len(argv) == 2 and argv[0] == "--offered":
        with preflight.bytecode_cached():
            from claude_hermes_bridge import taking
        sys.exit(taking.offered_main(argv[1]))
    early = None
    if protocol_fds is not None:  # the host's initialize, answered before the SDK is imported where it can be
        with preflight.bytecode_cached():
            from claude_hermes_bridge import handshake
        early = handshake.answer_early(protocol_fds, argv)
    with preflight.bytecode_cached():
        from claude_hermes_bridge import cli
    sys.exit(cli.main(argv, protocol_fds, early))
