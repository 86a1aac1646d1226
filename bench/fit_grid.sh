#!/usr/bin/env bash
# Wall time of fitting the whole grid (every target x regressor x split of config.yaml) on the existing
# dataset: reruns the split, fit, evaluate and report stages only.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
.venv/bin/snakemake --cores all --quiet rules --forcerun split ablation
end=$(date +%s)
n=$(ls results/fit/*/*/*.predictions.parquet | wc -l)
echo "fit grid: $((end - start)) s wall for ${n} (target, regressor, split) cells on $(nproc) cores"
