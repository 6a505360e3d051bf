"""MCP transport over the same services: streamable HTTP per agent and stdio."""
