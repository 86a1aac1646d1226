#!/usr/bin/env bash
# A family added to the default zoo, side by side with the same run without it (same labels for every other config).
#
#   bash bench/extra_family.sh FAMILY.yaml CLONE     # e.g. bench/narrow_mlp.yaml /tmp/fresh-NA
#
# B: a clone of this checkout whose config.yaml has FAMILY.yaml's family appended to zoo.families, run with
#    `make run` (every rule: profile, features, fit, evaluate, report).
# A: a copy of B's folder (CLONE-A) whose results/dataset/dataset.parquet has that family's rows removed, the
#    workflow rerun from the split rule on (Snakemake reruns what the changed dataset feeds), so both fits rest on
#    the same measurements of every other config. (What A does not undo: the layer timings' sample of the
#    manifest and the noise floor's pairs include the family's configs.)
# Then, in each, the README's two user-model commands (each measures the user's model anew).
set -euo pipefail
family_yaml=$(realpath "$1")
clone=$2
family=$(basename "$family_yaml" .yaml)
git clone -q "$(dirname "$0")/.." "$clone"
cd "$clone"
python3 - "$family_yaml" <<'PY'
import sys
from pathlib import Path
text = Path("config.yaml").read_text()
anchor = "\nshards:"
if anchor not in text:
    sys.exit(f"config.yaml: no top-level 'shards:' key after zoo.families to insert {sys.argv[1]} before")
block = "".join("    " + line if line.strip() else line for line in Path(sys.argv[1]).read_text().splitlines(True))
Path("config.yaml").write_text(text.replace(anchor, "\n" + block.rstrip("\n") + "\n" + anchor, 1))
PY
make run
user_models() {
  .venv/bin/python bench/user_model.py --results results --config config.yaml --out "$1-gru.csv"
  .venv/bin/python bench/user_model.py --results results --config config.yaml --model examples/keyword_lstm.py:build \
    --input 98,40 --out "$1-lstm.csv"
}
user_models user_model-B
rm -rf "$clone-A" && cp -a "$clone" "$clone-A" && cd "$clone-A"
"$clone/.venv/bin/python" - "$family" <<'PY'
import sys
import pyarrow as pa
import pyarrow.parquet as pq
table = pq.read_table("results/dataset/dataset.parquet")
data = table.to_pandas()
kept = data[data["family"] != sys.argv[1]].reset_index(drop=True)
if len(kept) == len(data):
    sys.exit(f"results/dataset/dataset.parquet: no row of family {sys.argv[1]!r} to remove")
print(f"dataset: {len(data)} rows, {len(kept)} without family {sys.argv[1]}")
out = pa.Table.from_pandas(kept, preserve_index=False).replace_schema_metadata(table.schema.metadata)
pq.write_table(out, "results/dataset/dataset.parquet")
PY
"$clone/.venv/bin/snakemake" --cores all
user_models user_model-A
