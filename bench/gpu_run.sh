#!/usr/bin/env bash
# The real-GPU run: on a machine with an NVIDIA GPU, in the repository root, with perfzoo's dependencies
# importable (missing wheels in .whl/ are installed into /tmp/site first). Writes everything under $OUT:
#   env.txt          nvidia-smi, driver, the Python packages used
#   snakemake.log    the workflow measuring $CONFIG's cuda device $DEVICE (default config/gpu-local.yaml and
#                    h100): zoo, hardware_$DEVICE, trace_$DEVICE, energy_$DEVICE
#   checks/*.json    bench/gpu_checks.py: env, sampler overhead, event vs wall clock, per-op kernel times vs
#                    torch.profiler, a power-limit sweep, interference from a second process on the GPU
#   results.tgz      results/, logs/, benchmarks/ and Snakemake's metadata, to finish the workflow elsewhere
#   timm.csv         with TIMM_BUDGET_S=N (seconds; default 0: skipped), first: bench/timm_gpu.py measures the
#                    models of bench/timm_gpu_models.csv from TIMM_FROM (default 1; the H200 fixture holds the first
#                    40) in timm's protocol, into a timm benchmark CSV (bench/device_transfer.py reads it)
# Each stage has its own time limit, so one that hangs loses nothing measured by the others.
set -u
OUT=${OUT:-/tmp/perfzoo-gpu}
export PERFZOO_GPU_CONFIG=${CONFIG:-config/gpu-local.yaml} PERFZOO_GPU_DEVICE=${DEVICE:-h100}
mkdir -p "$OUT/checks"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
{
  nvidia-smi
  nvidia-smi -q -d POWER,CLOCK,PERFORMANCE,MEMORY
  python3 -m pip list 2>/dev/null | grep -i -E "^(torch|torchvision|timm|numpy|pandas|pyarrow|scikit-learn|scipy|nvidia-ml-py|snakemake|matplotlib|jsonschema|pyyaml|psutil) "
  nproc; free -g
} >"$OUT/env.txt" 2>&1

if [ "${TIMM_BUDGET_S:-0}" -gt 0 ]; then
  date -u +"%F %T timm start" | tee -a "$OUT/stages.txt"
  (head -1 bench/timm_gpu_models.csv; tail -n +"$((${TIMM_FROM:-1} + 1))" bench/timm_gpu_models.csv) >/tmp/timm_models.csv
  timeout "$((TIMM_BUDGET_S + 90))" python3 bench/timm_gpu.py measure /tmp/timm_models.csv "$OUT/timm.csv" \
    --budget-s "$TIMM_BUDGET_S" >"$OUT/timm.log" 2>&1
  echo "timm rc $?" | tee -a "$OUT/stages.txt"
fi

date -u +"%F %T workflow start" | tee -a "$OUT/stages.txt"
timeout "${WORKFLOW_TIMEOUT:-330}" python3 -m snakemake --configfile "$PERFZOO_GPU_CONFIG" --replace-workflow-config \
  --cores all "profile_$PERFZOO_GPU_DEVICE" "energy_$PERFZOO_GPU_DEVICE" >"$OUT/snakemake.log" 2>&1
echo "workflow rc $?" | tee -a "$OUT/stages.txt"

date -u +"%F %T checks start" | tee -a "$OUT/stages.txt"
timeout "${CHECKS_TIMEOUT:-150}" python3 bench/gpu_checks.py "$OUT/checks" ${CHECKS:-env overhead optimer kernels powerlimit} \
  >"$OUT/checks.log" 2>&1
echo "checks rc $?" | tee -a "$OUT/stages.txt"
if [ -f "results/hardware/$PERFZOO_GPU_DEVICE.json" ]; then
  timeout "${INTERFERENCE_TIMEOUT:-70}" python3 bench/gpu_checks.py "$OUT/checks" interference results \
    >>"$OUT/checks.log" 2>&1
  echo "interference rc $?" | tee -a "$OUT/stages.txt"
fi
date -u +"%F %T done" | tee -a "$OUT/stages.txt"
tar czf "$OUT/results.tgz" results logs benchmarks .snakemake/metadata .snakemake/log 2>/dev/null
tar czf "$OUT/checks.tgz" -C "$OUT" checks && rm -rf "$OUT/checks"
tail -c 3000 "$OUT/snakemake.log"
