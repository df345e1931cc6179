"""claude-hermes-bridge: an MCP stdio server that gives a planner an executor, the Hermes Agent CLI.

Nothing is imported here: server.py, `python -m claude_hermes_bridge` and the wheel's console script guard stdio
(stdio_guard) before any other module is loaded. The map of the package is in server.py's docstring."""
