#!/usr/bin/env bash
# Create .venv and install stitch-graph into it.
#   ./setup.sh          the library, the CLI and the offline embedding model
#   ./setup.sh --test   the same plus the test tools
# PyTorch: set STITCH_TORCH to a pip requirement to choose the build (default: the newest
# release on a machine with an NVIDIA driver, else 2.13.0, which runs on the CPU).
set -euo pipefail
cd "$(dirname "$0")"
extras="embeddings"
[ "${1:-}" = "--test" ] && extras="embeddings,test"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -n "${STITCH_TORCH:-}" ]; then spec="$STITCH_TORCH"
  elif command -v nvidia-smi >/dev/null 2>&1; then spec="torch"
  else spec="torch==2.13.0"; fi
  .venv/bin/python -m pip install -q "$spec"
fi
if command -v nvidia-smi >/dev/null 2>&1; then extras="$extras,gpu"; fi
.venv/bin/python -m pip install -q -e ".[$extras]"
echo "stitch-graph installed in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
