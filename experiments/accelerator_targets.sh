#!/usr/bin/env bash
# The default paths' targets (DESIGN §7, docs/performance.md) measured on one accelerator in one
# run, most wanted first, each measurement under its own time limit so one slow compile cannot
# take the rest: the scanned ~365M training step (the default), alone and with each of two
# XLA:GPU flags (dynamic-slice fusion; the compiler unrolling the loop), beside the unrolled step;
# batch-1 to batch-64 decode of a ~1.5B bf16 model and the engine beside it; the scanned and
# unrolled ~1.5B steps; `jaxscale train` as documented. About 9 minutes on an H100 by the compile
# and step times docs/hardware.md records (not yet run on a GPU); the figures go there.
#
#   bash experiments/accelerator_targets.sh [OUT_DIR]     # default: $OUT, else results/accelerator
#   TINY=1 bash experiments/accelerator_targets.sh /tmp/t  # tiny sizes, any backend, ~1 minute
#
# Each measurement's output goes to OUT_DIR/<name>.txt; this script prints its exit status, its
# time and its last lines. PYTHON picks the interpreter (default: python3); jaxscale is imported
# from this checkout, installed or not (an accelerator image may have no package index).
set -uo pipefail
out=${1:-${OUT:-results/accelerator}}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH="$(dirname "$here")${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out"

if [[ ${TINY:-0} == 1 ]]; then  # the same commands at sizes any backend runs in seconds
  m365=(--d-model 64 --layers 2 --heads 4 --d-ff 128)
  m1500=(--d-model 96 --layers 3 --heads 4 --d-ff 192)
  train=(--seq-len 64 --compute-dtype float32 --attention jaxscale --steps 3)
  big=8 small=4 limit=300
  serve=(--max-seq 128 --dtype float32 --prompts 16 --batches 1,4 --live 16 --slots 32,128)
  cli=("${m365[@]}" --max-seq 64 --seq-len 64 --global-batch 8 --steps 4)
else
  m365=(--d-model 1024 --layers 24 --heads 16 --d-ff 3584)  # 365.5M, docs/hardware.md
  m1500=(--d-model 2048 --layers 24 --heads 16 --d-ff 7168)  # 1.46B
  train=(--seq-len 1024 --compute-dtype bfloat16 --attention cudnn --steps 10)
  big=32 small=16 limit=240
  serve=(--max-seq 1024 --dtype bfloat16 --prompts 128 --batches 1,16,64 --live 128
    --slots 256,1024)
  cli=("${m365[@]}" --max-seq 1024 --seq-len 1024 --compute-dtype bfloat16
    --attention cudnn --global-batch 32 --steps 30)
fi
# dp over every device: one on a single accelerator, the simulated eight on a CPU
cli+=(--mesh dp=-1 --log-every 5 --eval-every 0 --sample-tokens 0 --out "$out/train_run")
# XLA:GPU's two remedies for the scan's slot copies (docs/performance.md): matmuls that read and
# write stack slots in place, and the compiler unrolling the layer loop after jax scanned it
dsf=--xla_gpu_enable_dynamic_slice_fusion=true
full_unroll=--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_FULL_UNROLL

run() {  # run NAME [ENV=VALUE...] COMMAND...: one measurement, its output in OUT_DIR/NAME.txt
  local name=$1 start rc
  shift
  echo "== $name: $*"
  start=$(date +%s)
  timeout -k 10 "$limit" env "$@" > "$out/$name.txt" 2>&1
  rc=$?  # 124: over its limit
  echo "   exit $rc after $(($(date +%s) - start)) s"
  tail -n 4 "$out/$name.txt" | sed 's/^/   /'
}

{ "$py" -c "import jax; print('jax', jax.__version__, jax.devices())"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader; date -u +%Y-%m-%d; } 2>&1 | tee "$out/device.txt"

step="$here/15_step_roofline.py"
run train365_scanned "$py" "$step" "${m365[@]}" "${train[@]}" --batch "$big" \
  --hlo-out "$out/train365_scanned.hlo"
run train365_scanned_dsf XLA_FLAGS="${XLA_FLAGS:-} $dsf" "$py" "$step" "${m365[@]}" \
  "${train[@]}" --batch "$big" --hlo-out "$out/train365_scanned_dsf.hlo"
run train365_scanned_full_unroll XLA_FLAGS="${XLA_FLAGS:-} $full_unroll" "$py" "$step" \
  "${m365[@]}" "${train[@]}" --batch "$big" --hlo-out "$out/train365_scanned_full_unroll.hlo"
run train365_unrolled "$py" "$step" "${m365[@]}" "${train[@]}" --batch "$big" --unroll-layers
run decode1500 "$py" "$here/08_inference_roofline.py" "${m1500[@]}" "${serve[@]}"
sed -n '/decode batch/,/^$/p;/engine batch/,/^$/p;/cache slots/,/^$/p' "$out/decode1500.txt"
run train1500_scanned "$py" "$step" "${m1500[@]}" "${train[@]}" --batch "$small"
run train1500_unrolled "$py" "$step" "${m1500[@]}" "${train[@]}" --batch "$small" --unroll-layers
run train365_cli "$py" -m jaxscale train "${cli[@]}"
echo "outputs in $out"
