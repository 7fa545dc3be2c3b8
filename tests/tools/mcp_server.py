"""A real MCP tool server for Skein's tests, written with the official Python SDK (PyPI
`mcp`; its FastMCP, named `MCPServer` since mcp 2): the same tools as the Rust
`mcp-tools` (testkit/src/bin/mcp-tools.rs), so an agent's tool calls are tested against
a second, independent implementation of the protocol.

    python mcp_server.py --count-file PATH [--http PORT]

Without --http it speaks MCP over stdio (the orchestrator starts stdio servers with an
empty environment: nothing here reads one). With --http PORT it serves streamable HTTP
at http://127.0.0.1:PORT/mcp and prints `listening on 127.0.0.1:PORT` once bound (port
0 picks one, and the line says which).

Tools: count (appends a line to the count file, synced, and answers the number of
lines), add {a, b}, echo {text}, sleep {ms} (appends a line to the count file too,
before it sleeps, so that a call cut short still counts; answers `slept MS ms`) and
fail {message} (a tool error result with the message). The venv is made by
tests/engines/mcp-python.sh.
"""

import argparse
import os
import socket
import sys

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

# The longest `sleep` a test may ask for, so a mistaken argument cannot hang a run.
MAX_SLEEP_MS = 600_000


def build(count_file: str) -> MCPServer:
    server = MCPServer("mcp-tools-python", log_level="WARNING")
    # One `count` at a time, so that the number it answers is its own line's.
    counting = anyio.Lock()

    async def append_and_count() -> str:
        async with counting:
            with open(count_file, "ab") as f:
                f.write(b"called\n")
                f.flush()
                os.fsync(f.fileno())
            with open(count_file, "rb") as f:
                return str(f.read().count(b"\n"))

    @server.tool(structured_output=False)
    async def count() -> str:
        """Count this call: appends a line to the count file and answers how many lines it has."""
        return await append_and_count()

    @server.tool(structured_output=False)
    def add(a: float, b: float) -> str:
        """Add two numbers."""
        total = a + b
        return str(int(total)) if total.is_integer() else str(total)

    @server.tool(structured_output=False)
    def echo(text: str) -> str:
        """Answer the text given."""
        return text

    @server.tool(structured_output=False)
    async def sleep(ms: int) -> str:
        """Count this call (a line in the count file), sleep for ms milliseconds, then answer."""
        if ms < 0 or ms > MAX_SLEEP_MS:
            raise ToolError(f"sleep: {ms} ms is outside 0..{MAX_SLEEP_MS} ms")
        await append_and_count()
        await anyio.sleep(ms / 1000)
        return f"slept {ms} ms"

    @server.tool(structured_output=False)
    def fail(message: str) -> str:
        """Fail with the message given (a tool error result)."""
        raise ToolError(message)

    return server


async def serve_http(server: MCPServer, port: int) -> None:
    # Bound here, before uvicorn starts, so the line below is printed only once the port
    # accepts connections and names the port that port 0 picked.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    host, bound = sock.getsockname()
    print(f"listening on {host}:{bound}", flush=True)
    app = server.streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning")
    await uvicorn.Server(config).serve(sockets=[sock])


def main() -> int:
    parser = argparse.ArgumentParser(description="MCP tool server for Skein's tests")
    parser.add_argument("--count-file", required=True)
    parser.add_argument("--http", type=int, metavar="PORT")
    args = parser.parse_args()
    server = build(args.count_file)
    if args.http is None:
        server.run("stdio")
    else:
        anyio.run(serve_http, server, args.http)
    return 0


if __name__ == "__main__":
    sys.exit(main())
