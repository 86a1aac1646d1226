#!/usr/bin/env bash
# The test suite (`make test`): the SLURM cluster's tests in a pytest process of their own, beside the other tests in
# one pytest-xdist worker per core. The SLURM tests spend most of their time waiting for sbatch jobs and for the
# executor plugin's next status check (an interval that grows by 10 s while no job finishes); on an xdist worker of
# their own they held that worker, and so a core, mostly idle for about ten minutes (bench/RESULTS.md, "The SLURM
# tests beside the others"). Their output is printed after the others'; the suite fails if either part fails.
# Arguments go to both pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
log=$(mktemp "${TMPDIR:-/tmp}/perfzoo-slurm-tests.XXXXXX")
"$PY" -m pytest -q -m slurm "$@" >"$log" 2>&1 &
slurm=$!
trap 'kill -TERM "$slurm" 2>/dev/null' INT TERM  # a background job ignores the terminal's SIGINT
"$PY" -m pytest -q -n auto --dist loadfile --no-loadscope-reorder -m "not slurm" "$@"
rest=$?
wait "$slurm"
slurm_rc=$?
echo "======================== the SLURM tests, run beside the others ========================"
cat "$log"
rm -f "$log"
# pytest's exit code 5 (no test selected) fails neither part alone: arguments may select tests of one part only
ok() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }
ok "$rest" && ok "$slurm_rc" && ! [ "$rest" -eq 5 -a "$slurm_rc" -eq 5 ]
