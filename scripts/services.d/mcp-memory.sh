#!/usr/bin/env bash
# The reference MCP memory server from the npm registry, for the audit's
# third-party tool-source test (tests/test_audit_npm_tools.py): installed
# globally here, at install time, so the test never downloads anything.
set -euo pipefail
PACKAGE=@modelcontextprotocol/server-memory
VERSION=2026.8.31
if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
  echo "mcp-memory: node/npm missing; the npm tool-source test will be skipped"
  exit 0
fi
if [ -e "$(npm root -g)/$PACKAGE/dist/index.js" ]; then
  exit 0
fi
echo "mcp-memory: installing $PACKAGE@$VERSION from the npm registry"
timeout 300 npm install -g --no-audit --no-fund "$PACKAGE@$VERSION" >/dev/null 2>&1 \
  || echo "mcp-memory: WARNING: could not install (the npm tool-source test will be skipped)"
exit 0
