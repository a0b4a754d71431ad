"""The reference MCP servers from the npm registry, installed once into tests/.mcp-servers (gitignored)
with the machine's npm and its configured registry. Imported by test_mcp and test_pex."""
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SERVERS_DIR = HERE / ".mcp-servers"
# Pinned so that every machine runs the same servers; npm reads its registry from the machine's config.
SERVER_PACKAGES = ("@modelcontextprotocol/server-everything@2026.8.31",
                   "@modelcontextprotocol/server-filesystem@2026.8.31")
EVERYTHING = SERVERS_DIR / "node_modules" / ".bin" / "mcp-server-everything"
FILESYSTEM = SERVERS_DIR / "node_modules" / ".bin" / "mcp-server-filesystem"


def install_mcp_servers():
    """Install the reference servers once into tests/.mcp-servers; their executables by name."""
    if not (EVERYTHING.exists() and FILESYSTEM.exists()):
        SERVERS_DIR.mkdir(exist_ok=True)
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(SERVERS_DIR),
                        *SERVER_PACKAGES], check=True, timeout=600, stdout=subprocess.DEVNULL)
    return {"everything": str(EVERYTHING), "filesystem": str(FILESYSTEM)}


if __name__ == "__main__":  # .ci/run installs them before the suite
    print(install_mcp_servers())
