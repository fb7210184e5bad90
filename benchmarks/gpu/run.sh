#!/usr/bin/env bash
# The GPU figures of issue 23 on one GPU, in about 10 minutes: a random-init model of Qwen3-0.6B's
# shape (local tokenizer), then
#   1. the rollout collector vs raw vLLM generate on the same prompts (target >= 0.9);
#   2. vLLM weight sync (ipc) and sleep/wake times, beside a bf16 policy;
#   3. a GRPO step's tokens/s and peak memory, bf16 with gradient checkpointing, full and LoRA;
#   4. the longest one-episode update that fits;
#   5. sync vs async training steps with the vLLM backend.
# Needs an environment with agentkit, vLLM and TextWorld: pip install -c constraints.txt -e '.[textworld,lora]' vllm
# (torch from vLLM's wheel, not constraints.txt's CPU pin). Results: JSON lines and logs in $RESULTS
# (default benchmarks/gpu/results), a summary on stdout. Each part has its own time limit; a part that
# fails or runs out of time is reported and the next one runs.
#
#   bash benchmarks/gpu/run.sh            # every part
#   PARTS="3 4" bash benchmarks/gpu/run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
RESULTS=${RESULTS:-benchmarks/gpu/results}
PARTS=${PARTS:-1 2 3 4 5}
WORK=${WORK:-$(mktemp -d)}
MODEL="$WORK/qwen3-0.6b"
VLLM_ARGS='{"dtype": "bfloat16", "gpu_memory_utilization": 0.35, "max_model_len": 8192}'
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$RESULTS"
python -c "import torch, vllm; assert torch.cuda.is_available(), 'no GPU'" || { echo "run.sh needs a GPU and vLLM"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$RESULTS/gpu.txt"

part() {  # part NUMBER SECONDS NAME COMMAND...
  local number=$1 limit=$2 name=$3; shift 3
  [[ " $PARTS " == *" $number "* ]] || return 0
  echo "== part $number: $name (at most ${limit}s)"
  local started=$SECONDS
  timeout "$limit" "$@" > "$RESULTS/part$number.log" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - started))s; log: $RESULTS/part$number.log"
  tail -n 12 "$RESULTS/part$number.log"
}

[ -f "$MODEL/config.json" ] || agentkit model init --size qwen3-0.6b --out "$MODEL" || exit 1
agentkit rollout --env textworld/coin-v0 --episodes 1 --max-turns 1 --out "$WORK/warm.jsonl" --quiet > /dev/null 2>&1  # games

part 1 150 "collector vs raw vLLM generate" \
  python benchmarks/rollout_throughput.py --backend vllm --model "$MODEL" --vllm-args "$VLLM_ARGS" \
    --env textworld/simple-v0 --batch 64 --turns 6 --max-new-tokens 64 --env-workers 8 --rounds 2 \
    --json "$RESULTS/rollout.jsonl"
part 2 90 "ipc weight sync, sleep and wake" \
  python benchmarks/gpu/engine.py --model "$MODEL" --weight-sync ipc --results "$RESULTS/engine.jsonl"
part 3 120 "GRPO step: tokens/s and peak memory" \
  python benchmarks/memory_levers.py --model "$MODEL" --size qwen3-0.6b --rows 8 --tokens 2048 --steps 3 \
    --configs "full fp32" "full bf16" "full bf16 + checkpointing" "LoRA r16 bf16 + checkpointing" \
    --results "$RESULTS/step.jsonl"
part 4 120 "the longest episode that fits" \
  python benchmarks/memory_levers.py --model "$MODEL" --size qwen3-0.6b --longest --tokens 16384 \
    --configs "full bf16 + checkpointing" "LoRA r16 bf16 + checkpointing" --results "$RESULTS/longest.jsonl"
train() {  # train OUT EXTRA...: 5 GRPO steps of the 0.6B-shape model on TextWorld Coin Collector with vLLM
  local out=$1; shift
  agentkit train --model "$MODEL" --out "$out" --env textworld/coin-v0 --env-workers 8 --steps 5 --quiet \
    --backend vllm --vllm-args dtype=bfloat16 gpu_memory_utilization=0.3 max_model_len=8192 \
    --precision bf16 --gradient-checkpointing --eval-every 0 --eval-episodes 8 \
    --set rollout.tasks_per_step=8 --set rollout.group_size=8 --set sampling.max_new_tokens=64 "$@"
}
part 5 180 "sync vs async steps" bash -c "$(declare -f train); MODEL=$MODEL; \
  train $WORK/sync && train $WORK/async --async --max-staleness 1 && \
  python - $WORK/sync $WORK/async <<'PY'
import json, statistics, sys
for run in sys.argv[1:]:
    rows = [json.loads(l) for l in open(run + '/metrics.jsonl')][1:-1]  # not the first (loads) nor the last (evaluates)
    print(run.rsplit('/', 1)[-1], 'median step s', round(statistics.median(r['step_s'] for r in rows), 2),
          'collect s', round(statistics.median(r['collect_s'] for r in rows), 2),
          'update s', round(statistics.median(r['update_s'] for r in rows), 2))
PY"
echo "results in $RESULTS"
