"""The floor for the benchmark: a minimal MCP server with one tool, on the same SDK line as the bridge.

Its tool answers "pong", or with a path, the last 64 KiB of that file read with a seek (the floor for a
status call on a big log: the same transport and the same I/O, nothing else).
"""
import importlib
import os

try:
    mcp = importlib.import_module("mcp.server.mcpserver").MCPServer("minimal")  # mcp 2.x
except ImportError:
    mcp = importlib.import_module("mcp.server.fastmcp").FastMCP("minimal")  # mcp 1.x


@mcp.tool()
def tail(path: str = "") -> str:
    """'pong', or the last 64 KiB of a file."""
    if not path:
        return "pong"
    with open(path, "rb") as handle:
        handle.seek(max(0, os.fstat(handle.fileno()).st_size - 65536))
        return handle.read().decode("utf-8", "replace")


if __name__ == "__main__":
    mcp.run()
