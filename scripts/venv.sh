#!/usr/bin/env bash
# Creates (once) and updates the Python venv the tests and demos use, and prints its path.
# torch from PyPI pulls ~2.5 GB of CUDA libraries, so the venv lives outside the checkout and is
# reused by every clone on this machine. Override its place with LOGITS_PROCESSING_VENV.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LOGITS_PROCESSING_VENV:-$HOME/.cache/logits-processing/venv}"
requirements="$root/python/requirements-dev.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q -r "$requirements" >&2
  # The reference implementation, for differential tests and benchmarks: its wheel's
  # dependencies are a whole serving stack, and its logits_processing package needs only torch.
  "$venv/bin/pip" install -q --no-deps "ai-dynamo-runtime==1.6.1" >&2
  echo "$want" > "$stamp"
fi
echo "$venv"
