#!/bin/sh
# One visit to the GPU machine (issue 50's measurements), as one prepared script: run it in the
# last call after ../shared/gpu's install.sh, from the project's root there, with $OUT set:
#   sh .gpu/3/install.sh && . /tmp/gpu/env.sh && sh loadtests/gpu_visit.sh 2048x16
# then, on the same warm machine, a second call: . /tmp/gpu/env.sh && sh loadtests/gpu_visit.sh 512x30
# and, time left, a third for issue 54's K/V precision: . /tmp/gpu/env.sh && KV=1 sh loadtests/gpu_visit.sh 2048x16
# (one shape a call: each part has its own timeout, and a shape's parts fit the device's 600 s a call)
# It builds the shape's random llama in bfloat16 (the 1B-shaped 2048 x 16 or the SmolLM2-shaped
# 512 x 30), then, each part under its own timeout and its output kept in $OUT:
#   1. bench_kernels: primitives a decode step and tokens/s, the engine's generator against
#      mlx-lm's BatchGenerator, same model, rows and prompts (1, 32, 64 rows);
#   2. bench_host: the engine in-process at 1, 32, 64 users, --step-tokens 256 (the default,
#      set on a 2-core CPU) and 2048 (mlx-lm's prefill step; vLLM and SGLang budget 2048-8192);
#   3. bench_vs_mlxlm: radixchat serve against mlx_lm.server over HTTP, 32 and 64 users;
# With KV=1, instead: bench_kv_attention (decode attention over quantized K/V against the
# model's dtype) and bench_host at 32 users with --kv-bits 16, 8 with the batch holding values,
# and 8 and 4 with it holding codes (--kv-batch; issue 54's goal: >= 0.9x of 16 bits).
# QUICK=1 shrinks every part to check the script itself on a CPU in a minute or two.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
PY=${PY:-python3}
QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then
  SHAPES=${1:-"64x2 64x4"}; ROWS=1,4; USERS=2; TOK=8; T=100
else
  SHAPES=${1:-2048x16}; ROWS=1,32,64; USERS=32,64; TOK=128; T=90
fi
run() {  # run NAME SECONDS CMD...: output to $OUT/NAME.txt, a line on stdout
  name=$1; secs=$2; shift 2
  start=$(date +%s)
  timeout "$secs" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name: rc $? in $(( $(date +%s) - start )) s"
}
$PY -c 'import mlx.core as mx; print(mx.default_device(), mx.device_info())' > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
for shape in $SHAPES; do
  dim=${shape%x*}; layers=${shape#*x}
  folder=/tmp/gpu-models/llama-$shape-bf16
  [ -f "$folder/model.safetensors" ] || $PY - "$folder" "$dim" "$layers" <<'EOF'
import sys
from pathlib import Path

import mlx.core as mx

from tests.support.randmodel import build_random_model

out, dim, layers = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
build_random_model(out, dim=dim, layers=layers, context=4096, vocab_size=2048)
weights = mx.load(str(out / "model.safetensors"))
mx.save_safetensors(str(out / "model.safetensors"), {k: v.astype(mx.bfloat16) for k, v in weights.items()})
EOF
  if [ "${KV:-0}" = 1 ]; then  # issue 54's figures, then the next shape
    run kv-attention "$T" $PY -m loadtests.bench_kv_attention --rows "$ROWS"
    for kv in 16-values 8-values 8-codes 4-codes; do
      run "host-$shape-kv$kv" "$T" $PY -m loadtests.bench_host --model "$folder" --users "${USERS%%,*}" --turns 1 \
        --max-tokens "$TOK" --ignore-eos --set "kv_bits=${kv%-*}" --set "kv_batch=${kv#*-}"
    done
    continue
  fi
  run "kernels-$shape" "$T" $PY -m loadtests.bench_kernels --model "$folder" --rows "$ROWS" --speed --steps 64 --tokens "$TOK"
  for budget in 256 2048; do
    run "host-$shape-step$budget" "$T" $PY -m loadtests.bench_host --model "$folder" --users "$ROWS" --turns 1 \
      --max-tokens "$TOK" --ignore-eos --set "step_tokens=$budget"
  done
  run "http-$shape" 180 $PY -m loadtests.bench_vs_mlxlm --model "$folder" --users "$USERS" --convs 1 \
    --configs defaults --out "$OUT/http-$shape"
done
grep -h "^|" "$OUT"/kernels-*.txt "$OUT"/kv-attention.txt 2>/dev/null | head -40
