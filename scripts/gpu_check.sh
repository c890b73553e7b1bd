#!/usr/bin/env bash
# The one script run on a lent GPU machine (see BENCHMARKS.md). It checks and times the CUDA paths:
#   1. update throughput on HalfCheetah-v5 shapes, batch 256 and 1024: eager fp32 (autograd and the
#      hand-written --backward manual), --amp bf16, --compile,
#      --cuda-graphs and their combination, 8-layer critics with and without --grad-checkpoint, with each
#      update's peak GPU memory (bench/train_speed.py, GPU replay buffer);
#   2. the same learning curve: a short seeded Pendulum-v1 run eager vs the fastest path;
#   3. the gpu/tensorrt-marked tests;
#   4. --amp auto's choice on this GPU (train/precision.py): fp16 + scaler on 7.x, bf16 from 8.0, TF32 for
#      fp32 matmuls from 8.0, as the log line and config.json's choices state it.
# Writes $OUT/gpu_check.txt (tables) and $OUT/gpu_check.jsonl (one JSON line per part). Budget: < 8 minutes.
#
# The device image has torch but not gymnasium/mujoco/SB3: run scripts/gpu_wheels.sh here first, which
# fetches them into .whl/; then name .whl in the device call's carry and run `scripts/gpu_check.sh` there.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SITE=/tmp/sac_edge_site
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target "$SITE" . || exit 1
export PYTHONPATH="$SITE"
SRC=$(pwd)
cd /tmp  # import sac_edge from the install, not the source folders

{
    echo "# gpu_check $(date -u +%F) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} | tee "$OUT/gpu_check.txt"

timeout 240 python3 "$SRC/bench/train_speed.py" --device cuda --envs HalfCheetah-v5 --batch 256,1024 \
    --variants eager,manual,bf16,compile,graphs,compile+graphs,bf16+compile+graphs,deep,deep+ckpt --updates 300 --repeats 3 \
    2>&1 | tee -a "$OUT/gpu_check.txt" | tail -n 1 >> "$OUT/gpu_check.jsonl"

for variant in "eager:" "fast:--amp bf16 --compile --cuda-graphs"; do
    name=${variant%%:*}
    flags=${variant#*:}
    # shellcheck disable=SC2086
    timeout 100 python3 -m sac_edge.train.cli --env Pendulum-v1 --total-steps 12000 --learning-starts 2000 \
        --eval-every 2000 --eval-episodes 5 --seed 0 --device cuda $flags --out "/tmp/gpu_learn_$name" --force \
        --no-progress --json 2>>"$OUT/gpu_check.txt" | tail -n 1 | sed "s/^{/{\"curve\": \"$name\", /" >> "$OUT/gpu_check.jsonl"
    echo "learning curve ($name: $flags)" >> "$OUT/gpu_check.txt"
    cut -d, -f1,5,10 "/tmp/gpu_learn_$name/metrics.csv" >> "$OUT/gpu_check.txt" 2>/dev/null
done

(cd "$SRC" && timeout 60 python3 -m pytest -q -m "gpu or tensorrt" tests 2>&1 | tail -n 15) >> "$OUT/gpu_check.txt"

timeout 120 python3 -m sac_edge.train.cli --env Pendulum-v1 --total-steps 400 --learning-starts 200 --eval-every 0 \
    --device cuda --out /tmp/gpu_amp --force --no-progress --json 2>/tmp/gpu_amp.log >/dev/null
python3 - /tmp/gpu_amp.log /tmp/gpu_amp/config.json <<'PY' 2>&1 | tee -a "$OUT/gpu_check.txt" | tail -n 1 >> "$OUT/gpu_check.jsonl"
import json, sys
import torch
log, config = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
major, minor = torch.cuda.get_device_capability()
want = "bf16" if major >= 8 else "fp16" if major == 7 else "off"
line = next((l for l in log.splitlines() if "--amp auto ->" in l), "")
got = config["choices"]["precision"]
ok = got["amp"] == config["amp"] == want and got["tf32"] == (major >= 8) and torch.cuda.get_device_name() in line
print(line)
print(json.dumps({"check": "amp_auto", "device": torch.cuda.get_device_name(), "capability": f"{major}.{minor}",
                  "want": want, "got": got, "ok": ok}))
PY
cat "$OUT/gpu_check.txt"
