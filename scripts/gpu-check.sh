#!/usr/bin/env bash
# The CUDA path's check on a GPU machine, in under 8 minutes on an H200: the GPU tests (ignored in
# a plain `cargo test`; GPU vs CPU bit for bit, the self-check) with the embedded Triton images,
# every kind GPU vs host at B = 1, 16, 64, 256 with the waits a step counted, the fallback of a
# failed self-check, transformers' generate() on the GPU, compute-sanitizer's memcheck on the many-steps-in-flight test, then python/benchmarks/bench_cuda.py
# and python/benchmarks/bench_vllm_v2.py (vLLM's Model Runner V2 processor on CUDA tensors laid out
# as V2's); it ends with a short table.
#
#   scripts/gpu-check.sh --prepare   on a CPU machine with the toolchain and the venv
#                                    (scripts/venv.sh): builds the release test binaries and the
#                                    CUDA-enabled wheel into target/gpu-check/ (git-ignored, a few
#                                    tens of MB) for a GPU machine that cannot reach a registry;
#   scripts/gpu-check.sh             on the GPU machine: uses target/gpu-check/ when it is there,
#                                    else builds with cargo (and maturin, if present) itself.
#
# With the device tool: `run` with carry ["target/gpu-check"] and command
# `bash scripts/gpu-check.sh`; the summary is also written to $OUT/gpu-check.txt when $OUT is set.
# Environment: GPU_CHECK_QUICK=1 for a shorter benchmark; PYTHON (default python3).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="$root/target/gpu-check"
python="${PYTHON:-python3}"

test_binaries() { # prints "name path" for the crate's release test binaries and kernel benchmark
  {
    cargo test --release -p logits-processing-cuda --no-run --message-format=json
    cargo build --release -p logits-processing-cuda --example bench_kernel --message-format=json
  } 2>/dev/null |
    "$python" -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        if m["target"]["kind"] == ["test"] or m["target"]["name"] == "bench_kernel":
            print(m["target"]["name"], m["executable"])'
}

if [ "${1:-}" = "--prepare" ]; then
  set -e
  venv="$(scripts/venv.sh)"
  python="$venv/bin/python"
  rm -rf "$out" && mkdir -p "$out/bin" "$out/wheels" "$out/py"
  echo "== release test binaries and the kernel benchmark"
  cargo test --release -p logits-processing-cuda --no-run
  cargo build --release -p logits-processing-cuda --example bench_kernel
  test_binaries | while read -r name path; do cp "$path" "$out/bin/$name"; done
  echo "== wheel with CUDA support"
  "$venv/bin/maturin" build --release --features cuda -o "$out/wheels" --quiet
  echo "== the reference (dynamo.logits_processing, pure Python) for the benchmark"
  site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$out/py/dynamo"
  cp -r "$site/dynamo/logits_processing" "$out/py/dynamo/"
  find "$out" -name __pycache__ -prune -exec rm -rf {} +
  ls -l "$out/bin" "$out/wheels"
  du -sh "$out"
  exit 0
fi

summary=()
failed=0
record() { # name, status, seconds
  summary+=("$(printf '%-44s %-8s %6ss' "$1" "$2" "$3")")
  [ "$2" = FAIL ] && failed=1
  return 0
}
run_step() { # name, timeout seconds, command...
  local name="$1" limit="$2" t0 status
  shift 2
  echo "== $name"
  t0=$(date +%s)
  if timeout "$limit" "$@"; then status=PASS; else status=FAIL; fi
  record "$name" "$status" "$(($(date +%s) - t0))"
}

mkdir -p "$out" && rm -f "$out"/bench*.txt "$out"/bench*.json "$out/summary.txt"
echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

# Test binaries: carried, or built here.
declare -A bin
if [ -d "$out/bin" ] && [ -n "$(ls -A "$out/bin" 2>/dev/null)" ]; then
  for f in "$out/bin"/*; do bin[$(basename "$f")]="$f"; done
  echo "using the prebuilt test binaries in $out/bin"
elif command -v cargo >/dev/null; then
  t0=$(date +%s)
  if cargo test --release -p logits-processing-cuda --no-run &&
    cargo build --release -p logits-processing-cuda --example bench_kernel; then
    while read -r name path; do bin[$name]="$path"; done < <(test_binaries)
    record "build (cargo, release)" PASS "$(($(date +%s) - t0))"
  else
    record "build (cargo, release)" FAIL "$(($(date +%s) - t0))"
  fi
else
  record "build: no cargo and no target/gpu-check/bin" FAIL 0
fi

if [ -n "${bin[gpu]:-}" ]; then
  # The GPU tests are #[ignore]d where there is no GPU; here they run, and fail if it is unusable.
  run_step "GPU tests, embedded Triton images" 150 "${bin[gpu]}" --include-ignored --test-threads 1 --nocapture
  sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)"
  if [ -n "$sanitizer" ]; then
    run_step "compute-sanitizer memcheck (steps in flight)" 120 "$sanitizer" --tool memcheck \
      --error-exitcode 1 "${bin[gpu]}" --include-ignored many_steps_in_flight --test-threads 1
  else
    record "compute-sanitizer (not found)" SKIP 0
  fi
fi
# The kernel alone, from Rust (no Python on the path): the mixed batch and an all-temperature one.
if [ -n "${bin[bench_kernel]:-}" ]; then
  kq=()
  [ "${GPU_CHECK_QUICK:-0}" = 1 ] && kq=(--quick)
  t0=$(date +%s)
  if timeout 120 "${bin[bench_kernel]}" "${kq[@]}" | tee "$out/bench_kernel.txt"; then
    record "kernel benchmark (examples/bench_kernel.rs)" PASS "$(($(date +%s) - t0))"
  else
    record "kernel benchmark (examples/bench_kernel.rs)" FAIL "$(($(date +%s) - t0))"
  fi
fi

# The benchmark: the wheel carried (or maturin here), the reference beside it.
pypath=""
wheel="$(ls "$out"/wheels/*.whl 2>/dev/null | head -1)"
if [ -n "$wheel" ]; then
  rm -rf "$out/site"
  "$python" -m pip install --quiet --no-deps --no-index --target "$out/site" "$wheel" && pypath="$out/site"
elif command -v maturin >/dev/null; then
  maturin build --release --features cuda -o "$out/wheels" --quiet &&
    "$python" -m pip install --quiet --no-deps --no-index --target "$out/site" "$out"/wheels/*.whl &&
    pypath="$out/site"
fi
if [ -n "$pypath" ]; then
  [ -d "$out/py/dynamo" ] && pypath="$pypath:$out/py"
  quick=()
  [ "${GPU_CHECK_QUICK:-0}" = 1 ] && quick=(--quick)
  t0=$(date +%s)
  # Every kind GPU against host bit for bit at B = 1..256, vocab 151,936, the kernels and the host
  # round trip (LOGITS_PROCESSING_DEVICE=host); a failed step leaves the logits as they were.
  if PYTHONPATH="$pypath" timeout 240 "$python" python/benchmarks/check_device_kinds.py --steps 2 \
    --json "$out/device_kinds.json" | tee "$out/device_kinds.txt"; then
    record "every kind, GPU vs host (check_device_kinds.py)" PASS "$(($(date +%s) - t0))"
  else
    record "every kind, GPU vs host (check_device_kinds.py)" FAIL "$(($(date +%s) - t0))"
  fi
  # The fallback: a device whose self-check fails warns once and takes the host round trip.
  t0=$(date +%s)
  if LOGITS_PROCESSING_TEST_SELF_CHECK=fail PYTHONPATH="$pypath" timeout 120 "$python" \
    python/benchmarks/check_device_kinds.py --expect-fallback --rows 1 --steps 2 | tail -2; then
    record "failed self-check: warned, round trip, exact" PASS "$(($(date +%s) - t0))"
  else
    record "failed self-check: warned, round trip, exact" FAIL "$(($(date +%s) - t0))"
  fi
  # transformers' generate() with ids and logits on the GPU (skipped without transformers).
  t0=$(date +%s)
  PYTHONPATH="$pypath" timeout 120 "$python" python/benchmarks/check_hf_gpu.py | tee "$out/hf_gpu.txt"
  case "${PIPESTATUS[0]}" in
    0) record "HF generate() on the GPU (check_hf_gpu.py)" PASS "$(($(date +%s) - t0))" ;;
    2) record "HF generate() on the GPU (no transformers)" SKIP "$(($(date +%s) - t0))" ;;
    *) record "HF generate() on the GPU (check_hf_gpu.py)" FAIL "$(($(date +%s) - t0))" ;;
  esac
  t0=$(date +%s)
  if PYTHONPATH="$pypath" timeout 240 "$python" python/benchmarks/bench_cuda.py --require-gpu \
    --json "$out/bench.json" "${quick[@]}" | tee "$out/bench.txt"; then
    record "benchmark (python/benchmarks/bench_cuda.py)" PASS "$(($(date +%s) - t0))"
  else
    record "benchmark (python/benchmarks/bench_cuda.py)" FAIL "$(($(date +%s) - t0))"
  fi
  # vLLM's Model Runner V2 processor on CUDA tensors laid out as V2's (stand-ins for vLLM's types:
  # the GPU machine has no vLLM): every row against the CPU path, a step's cost, device waits.
  t0=$(date +%s)
  if PYTHONPATH="$pypath" timeout 180 "$python" python/benchmarks/bench_vllm_v2.py --device cuda \
    --json "$out/bench_vllm_v2.json" "${quick[@]}" | tee "$out/bench_vllm_v2.txt"; then
    record "vLLM V2 processor (bench_vllm_v2.py)" PASS "$(($(date +%s) - t0))"
  else
    record "vLLM V2 processor (bench_vllm_v2.py)" FAIL "$(($(date +%s) - t0))"
  fi
else
  record "benchmark: no wheel (run --prepare) and no maturin" FAIL 0
fi

{
  echo
  echo "== gpu-check summary ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
  printf '%s\n' "${summary[@]}"
  if [ -f "$out/bench_kernel.txt" ]; then
    echo
    grep -E '^(kernels from|batch|kernel )' "$out/bench_kernel.txt"
  fi
  if [ -f "$out/bench.txt" ]; then
    echo
    sed -n '/^ *B /,/^$/p' "$out/bench.txt"
  fi
  if [ -f "$out/bench_vllm_v2.txt" ]; then
    echo
    cat "$out/bench_vllm_v2.txt"
  fi
  if [ -f "$out/device_kinds.txt" ]; then
    echo
    tail -1 "$out/device_kinds.txt"
  fi
} | tee "$out/summary.txt"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  cp "$out/summary.txt" "$OUT/gpu-check.txt"
  [ -f "$out/bench.json" ] && cp "$out/bench.json" "$OUT/bench.json"
  [ -f "$out/bench_kernel.txt" ] && cp "$out/bench_kernel.txt" "$OUT/bench_kernel.txt"
  [ -f "$out/bench_vllm_v2.json" ] && cp "$out/bench_vllm_v2.json" "$OUT/bench_vllm_v2.json"
  [ -f "$out/device_kinds.json" ] && cp "$out/device_kinds.json" "$OUT/device_kinds.json"
fi
exit $failed
