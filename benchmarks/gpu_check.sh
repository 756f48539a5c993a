#!/usr/bin/env bash
# One-command GPU check (< 8 minutes): what runs on this GPU machine, with figures.
#
#   bash benchmarks/gpu_check.sh            # from the repository root, after `make setup` (offline is fine)
#
# Installs nothing (the machine may have no internet). It detects what is there and prints, for each check,
# RAN (with figures), SKIPPED (why) or FAILED (the tail of its log):
#   1. environment: GPUs, torch + CUDA, SGLang (importable or not), the default model
#   2. one bf16 FSDP2 training step of the default model on the GPUs (torch.distributed, NCCL, fully_shard)
#   3. a real SGLang server with the default model (python -m sglang.launch_server), /health within 300 s
#   4. a proxy session on it: `rein proxy --engine sglang --sglang-url URL`, one chat completion (OpenAI SDK)
#   5. an NCCL weight sync to it: /init_weights_update_group + bucketed /update_weights_from_distributed
#      (bf16 weights from this process's GPU 0 to the server on the last GPU), then a generation stamped with
#      the new version; needs 2 GPUs (NCCL refuses two ranks on one GPU)
# Checks 3-5 need SGLang installed in the Python that runs Rein or in $SGLANG_PYTHON (a separate env with
# CUDA torch + sglang, e.g. from carried wheels); without it they are SKIPPED, not faked.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
SGLANG_PY="${SGLANG_PYTHON:-$PY}"
LOGS="$(mktemp -d /tmp/rein-gpu-check.XXXXXX)"
START=$(date +%s)
declare -a SUMMARY=()
record() { SUMMARY+=("$1"); echo ">>> $1"; }
elapsed() { echo $(( $(date +%s) - START )); }
cleanup() { [ -n "${SGLANG_PID:-}" ] && kill "$SGLANG_PID" 2>/dev/null; [ -n "${PROXY_PID:-}" ] && kill "$PROXY_PID" 2>/dev/null; true; }
trap cleanup EXIT

echo "== 1. environment (logs: $LOGS)"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"
MODEL="$("$PY" -c 'from components.models.registry import default_model_dir; print(default_model_dir())' 2>/dev/null)"
"$PY" - <<'EOF' | tee "$LOGS/env.txt"
import importlib.util, torch
print(f"python torch {torch.__version__}, cuda available {torch.cuda.is_available()}, "
      f"gpus {torch.cuda.device_count()}, bf16 {torch.cuda.is_available() and torch.cuda.is_bf16_supported()}")
print("sglang in this python:", "yes" if importlib.util.find_spec("sglang") else "no")
EOF
HAVE_CUDA=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
HAVE_SGLANG=$("$SGLANG_PY" -c 'import sglang, torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
[ "$HAVE_SGLANG" = 1 ] && echo "sglang: $("$SGLANG_PY" -c 'import sglang; print(sglang.__version__)') via $SGLANG_PY" \
  || echo "sglang: not importable with CUDA by $SGLANG_PY (set SGLANG_PYTHON to an env that has it)"
if [ -f "$MODEL/config.json" ]; then echo "default model: $MODEL"; else echo "default model: MISSING at $MODEL (run make setup)"; fi
record "environment: cuda=$HAVE_CUDA sglang=$HAVE_SGLANG model=$([ -f "$MODEL/config.json" ] && echo yes || echo no)"

echo "== 2. one bf16 FSDP2 step"
if [ "$HAVE_CUDA" != 1 ] || [ ! -f "$MODEL/config.json" ]; then
  record "fsdp2 bf16 step: SKIPPED (needs CUDA and the default model)"
else
  NGPU=$("$PY" -c 'import torch; print(min(torch.cuda.device_count(), 8))')
  cat > "$LOGS/fsdp_step.py" <<'EOF'
import os, sys, time, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from transformers import AutoModelForCausalLM
dist.init_process_group("nccl")
rank = dist.get_rank(); torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32).cuda()
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for layer in model.model.layers:
    fully_shard(layer, mp_policy=policy)
fully_shard(model, mp_policy=policy)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
batch, length = 8, 2048
ids = torch.randint(0, model.config.vocab_size, (batch, length), device="cuda", generator=torch.Generator("cuda").manual_seed(rank))
for step in range(3):  # step 0 warms up (kernels, allocator); 1-2 are timed
    torch.cuda.synchronize(); started = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize(); took = time.perf_counter() - started
tokens = batch * length * dist.get_world_size()
if rank == 0:
    print(f"FIGURE fsdp2 bf16: {dist.get_world_size()} GPUs, loss {loss.item():.3f}, step {took:.3f} s, "
          f"{tokens / took:,.0f} tok/s, peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB/GPU")
dist.destroy_process_group()
EOF
  if timeout 240 "$PY" -m torch.distributed.run --standalone --nproc-per-node "$NGPU" "$LOGS/fsdp_step.py" "$MODEL" > "$LOGS/fsdp.log" 2>&1; then
    record "fsdp2 bf16 step: RAN — $(grep FIGURE "$LOGS/fsdp.log" | sed 's/FIGURE //')"
  else
    record "fsdp2 bf16 step: FAILED (rc $?) — $(tail -3 "$LOGS/fsdp.log" | tr '\n' ' ')"
  fi
fi

echo "== 3. SGLang server"
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"
SERVER_UP=0
if [ "$HAVE_SGLANG" != 1 ] || [ ! -f "$MODEL/config.json" ]; then
  record "sglang server: SKIPPED (SGLang with CUDA not importable, or no default model)"
else
  # The last GPU serves (the FSDP step above is done); a small memory fraction leaves room for the sender.
  LAST_GPU=$(( $("$PY" -c 'import torch; print(torch.cuda.device_count())') - 1 ))
  CUDA_VISIBLE_DEVICES=$LAST_GPU "$SGLANG_PY" -m sglang.launch_server --model-path "$MODEL" --host 127.0.0.1 \
    --port "$PORT" --mem-fraction-static 0.5 --dtype bfloat16 > "$LOGS/sglang.log" 2>&1 &
  SGLANG_PID=$!
  T0=$(date +%s)
  if timeout 320 "$PY" - "$URL" <<'EOF' > "$LOGS/health.log" 2>&1; then
import asyncio, sys
from components.engine.sglang_fleet import SGLangFleet, SGLangFleetConfig
from components.engine.sglang import SGLangEngineConfig
async def main():
    url = sys.argv[1]
    fleet = await SGLangFleet.connect(SGLangFleetConfig(urls=(url,), server=SGLangEngineConfig.for_url(url, startup_timeout_s=300)))
    print(f"context window {fleet.context_window}, weight version {fleet.weight_version}")
    await fleet.aclose()
asyncio.run(main())
EOF
    SERVER_UP=1
    record "sglang server: RAN — healthy after $(( $(date +%s) - T0 )) s, $(tail -1 "$LOGS/health.log")"
  else
    record "sglang server: FAILED — $(tail -3 "$LOGS/health.log" | tr '\n' ' ') | server log: $(tail -3 "$LOGS/sglang.log" | tr '\n' ' ')"
  fi
fi

echo "== 4. proxy session on SGLang"
if [ "$SERVER_UP" != 1 ]; then
  record "proxy session: SKIPPED (no SGLang server)"
else
  "$PY" -m components.cli proxy --engine sglang --sglang-url "$URL" --model "$MODEL" --port 0 --run-dir "$LOGS/run" > "$LOGS/proxy.log" 2>&1 &
  PROXY_PID=$!
  if timeout 120 "$PY" - "$LOGS/proxy.log" <<'EOF' > "$LOGS/session.log" 2>&1; then
import re, sys, time, httpx
from openai import OpenAI
deadline = time.time() + 90
while time.time() < deadline:
    match = re.search(r"at (http://\S+) \(context window", open(sys.argv[1]).read())
    if match: break
    time.sleep(0.5)
url = match.group(1)
session = httpx.post(f"{url}/sessions").json()
client = OpenAI(base_url=f"{session['base_url']}/v1", api_key="unused")
started = time.perf_counter()
reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Write a haiku about GPUs."}], max_tokens=128)
took = time.perf_counter() - started
trajectory = httpx.post(f"{url}/s/{session['session_id']}/finalize", json={}).json()
print(f"{reply.usage.completion_tokens} tokens in {took:.2f} s ({reply.usage.completion_tokens / took:.0f} tok/s), trajectory {trajectory['status']}")
EOF
    record "proxy session: RAN — $(tail -1 "$LOGS/session.log")"
  else
    record "proxy session: FAILED — $(tail -3 "$LOGS/session.log" | tr '\n' ' ')"
  fi
  kill "$PROXY_PID" 2>/dev/null; PROXY_PID=""
fi

echo "== 5. NCCL weight sync"
NUM_GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "$SERVER_UP" != 1 ]; then
  record "nccl weight sync: SKIPPED (no SGLang server)"
elif [ "$NUM_GPUS" -lt 2 ]; then
  # NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"); a single-GPU colocated
  # setup syncs through /update_weights_from_tensor (CUDA IPC) instead.
  record "nccl weight sync: SKIPPED (needs 2 GPUs: the sender and the server each own one; found $NUM_GPUS)"
else
  if CUDA_VISIBLE_DEVICES=0 timeout 180 "$PY" - "$URL" "$MODEL" <<'EOF' > "$LOGS/nccl.log" 2>&1; then
import asyncio, sys, time, torch
from transformers import AutoModelForCausalLM
from components.engine.sglang import SGLangEngineConfig
from components.engine.sglang_fleet import SGLangFleet, SGLangFleetConfig
from components.engine.sglang_weight_transfer import DistributedWeightSyncConfig
from components.protocols import SamplingParams
async def main():
    url, model_path = sys.argv[1], sys.argv[2]
    weights = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.bfloat16).cuda().state_dict()
    fleet = await SGLangFleet.connect(SGLangFleetConfig(urls=(url,), server=SGLangEngineConfig.for_url(url),
        distributed=DistributedWeightSyncConfig(backend="nccl", master_address="127.0.0.1", bucket_bytes=128 << 20)))
    size = sum(t.numel() * t.element_size() for t in weights.values())
    for version in (1, 2):  # the first includes the group set-up
        started = time.perf_counter()
        await fleet.update_weights(weights, version=version)
        took = time.perf_counter() - started
    result = await fleet.generate([1, 2, 3, 4], SamplingParams(max_tokens=8, temperature=0.0))
    assert set(result.weight_versions) == {2}, result.weight_versions
    print(f"{size / 2**20:.0f} MiB bf16 in {took:.2f} s ({size / 2**30 / took:.1f} GiB/s), tokens after it stamped version 2")
    await fleet.aclose()
asyncio.run(main())
EOF
    record "nccl weight sync: RAN — $(tail -1 "$LOGS/nccl.log")"
  else
    record "nccl weight sync: FAILED — $(tail -3 "$LOGS/nccl.log" | tr '\n' ' ')"
  fi
fi

echo
echo "== summary ($(elapsed) s; logs in $LOGS)"
for line in "${SUMMARY[@]}"; do echo "  $line"; done
RAN=$(printf '%s\n' "${SUMMARY[@]}" | grep -c ": RAN")
echo "gpu_check: $RAN of 4 GPU checks ran (target 4 of 4, < 480 s)"
