#!/usr/bin/env bash
# Wall time of the default workflow from scratch (results/ removed first), on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf results logs benchmarks
start=$(date +%s)
.venv/bin/snakemake --cores all --quiet rules
end=$(date +%s)
configs=$(.venv/bin/python -c "import pandas as pd; print(len(pd.read_parquet('results/zoo/manifest.parquet')))")
echo "default run: $((end - start)) s wall for ${configs} configs on $(nproc) cores"
echo "per rule (s, from benchmarks/):"
for f in $(find benchmarks -name '*.tsv' | sort); do
  printf '  %-45s %s\n' "${f#benchmarks/}" "$(tail -n 1 "$f" | cut -f1)"
done
