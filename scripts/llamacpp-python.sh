#!/usr/bin/env bash
# Creates (once) the llama-cpp-python venv, ~/.cache/logits-processing/llamacpp-python-venv, and
# prints its path. llama-cpp-python is built from its PyPI sdist (it compiles llama.cpp) with the
# smallest CMake configuration that serves `Llama` on the CPU: no server, tools, examples, tests or
# multimodal library, GGML_NATIVE off (the wheel runs on any x86_64 here), OpenMP off; the built
# wheel is kept in ~/.cache/logits-processing/llamacpp-python-wheels and reused, so only the first
# run on a machine compiles. The rest comes from PyPI (python/requirements-llamacpp.txt: gguf to write
# the tests' GGUF models, transformers' tokenizer and safetensors to read the test command's tiny
# model); this checkout's package is installed as a release wheel, as scripts/engine-venv.sh does.
# Beside the wheel it keeps the sdist's Qwen2 vocab (vendor/llama.cpp/models/ggml-vocab-qwen2.gguf,
# no weights), over which python/tests/test_engine_llama_cpp.py writes its tiny model.
#
#   scripts/llamacpp-python.sh          # JOBS=2 compile jobs by default
#
# Cost measured on the shared 2-core machine: see docs/engines/llama_cpp.md.
set -euo pipefail
version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${LOGITS_PROCESSING_ENGINE_VENVS:-$HOME/.cache/logits-processing}"
venv="$cache/llamacpp-python-venv"
wheels="$cache/llamacpp-python-wheels"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3
mkdir -p "$cache" "$wheels"

# One build at a time: the wheel cache and the venv are shared by every checkout on this machine.
exec 9>"$cache/llamacpp-python.lock"
flock 9

uv="$(command -v uv || true)"
if [ -z "$uv" ]; then
  if [ ! -x "$cache/uv-tool/bin/uv" ]; then
    "$python" -m venv "$cache/uv-tool" >&2
    "$cache/uv-tool/bin/pip" install -q uv >&2
  fi
  uv="$cache/uv-tool/bin/uv"
fi

wheel="$(ls "$wheels"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -1 || true)"
# The test's model is written over a real vocab: the Qwen2 one the sdist ships (vocab only).
vocab="$wheels/vocab/ggml-vocab-qwen2.gguf"
if [ -z "$wheel" ] || [ ! -f "$vocab" ]; then
  builder="$cache/llamacpp-python-builder"
  [ -x "$builder/bin/pip" ] || "$python" -m venv "$builder" >&2
  tmp="$(mktemp -d)"
  "$builder/bin/pip" download -q --no-deps --no-binary llama-cpp-python "llama-cpp-python==$version" -d "$tmp" >&2
  sdist="$(ls "$tmp"/llama_cpp_python-*.tar.gz)"
  mkdir -p "$wheels/vocab"
  tar xzf "$sdist" -C "$tmp" --wildcards '*/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf'
  cp "$tmp"/*/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf "$vocab"
  if [ -z "$wheel" ]; then
    # Only llama-cpp-python itself from source; its build tools (scikit-build-core, cmake) are wheels.
    CMAKE_ARGS="-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
-DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF -DLLAMA_BUILD_MTMD=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-2}" \
      "$builder/bin/pip" wheel -q --no-deps "$sdist" -w "$tmp/wheel" >&2
    mv "$tmp"/wheel/llama_cpp_python-*.whl "$wheels"/
  fi
  rm -rf "$tmp"
  wheel="$(ls "$wheels"/llama_cpp_python-"$version"-*.whl | head -1)"
fi

stamp="$venv/.llamacpp-python.stamp"
requirements="$root/python/requirements-llamacpp.txt"
want="$(basename "$wheel") $(sha256sum "$requirements" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$venv"
  "$uv" venv -q -p "$python" "$venv" >&2
  "$uv" pip install -q -p "$venv/bin/python" "$wheel" -r "$requirements" >&2
  echo "$want" > "$stamp"
fi

# This checkout's package, as a release wheel (its own wheel folder: this script's lock is not
# engine-venv.sh's).
"$root/scripts/checkout-wheel.sh" "$venv" "$uv" "$cache/llamacpp-python-pkg"
echo "$venv"
