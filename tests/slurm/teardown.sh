#!/usr/bin/env bash
# Stop the daemons started by tests/slurm/setup.sh, by their recorded PIDs
# (slurmd, slurmctld, munged; a munged that setup.sh found already running is
# not touched). Leaves the state dir (config, logs, saved state) in place;
# remove it with `rm -rf "${PERFZOO_SLURM_DIR:-/tmp/perfzoo-slurm}"` for a clean start.
set -uo pipefail

STATE="${PERFZOO_SLURM_DIR:-/tmp/perfzoo-slurm}"
say() { echo "[slurm-teardown] $*"; }

# Is PID alive and really the expected program? (guards against PID reuse)
is_ours() { kill -0 "$1" 2>/dev/null && [[ "$(cat "/proc/$1/comm" 2>/dev/null)" == "$2" ]]; }

stop() {  # stop <name>
  local name=$1 pidfile="$STATE/$1.pid" pid
  if [[ ! -s "$pidfile" ]]; then
    say "$name: no pid file, nothing to stop"
    return
  fi
  pid=$(cat "$pidfile")
  if ! is_ours "$pid" "$name"; then
    say "$name: pid $pid not running"
    rm -f "$pidfile"
    return
  fi
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 100); do is_ours "$pid" "$name" || break; sleep 0.1; done  # <= 10 s
  if is_ours "$pid" "$name"; then
    say "$name: pid $pid ignored SIGTERM for 10 s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null
    for _ in $(seq 50); do is_ours "$pid" "$name" || break; sleep 0.1; done
  fi
  if is_ours "$pid" "$name"; then
    say "$name: pid $pid still running!"
    return 1
  fi
  rm -f "$pidfile"
  say "$name: stopped (pid $pid)"
}

rc=0
# Cancel jobs still queued/running on our controller so their slurmstepd exit too.
if [[ -s "$STATE/slurmctld.pid" ]] && is_ours "$(cat "$STATE/slurmctld.pid")" slurmctld; then
  jobs=$(SLURM_CONF="$STATE/slurm.conf" squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [[ -n "${jobs// /}" ]]; then
    say "scancel $jobs"
    # shellcheck disable=SC2086
    SLURM_CONF="$STATE/slurm.conf" scancel $jobs 2>/dev/null
    for _ in $(seq 100); do pgrep -x slurmstepd >/dev/null || break; sleep 0.1; done
  fi
fi
# Reverse start order: slurmd first (it kills its job steps), then controller, then munge.
stop slurmd || rc=1
stop slurmctld || rc=1
stop munged || rc=1
# slurmstepd processes of jobs that were still running belong to slurmd's jobs
for _ in $(seq 50); do pgrep -x slurmstepd >/dev/null || break; sleep 0.1; done
if pgrep -x slurmstepd >/dev/null; then
  say "WARNING: leftover slurmstepd processes: $(pgrep -x slurmstepd | tr '\n' ' ')"
  rc=1
fi

# A job's process that outlived its slurmstepd (proctrack/linuxproc follows the process tree only) is no longer
# tracked by any daemon: find it by the job environment this cluster gave it (ClusterName=perfzoo, this node).
job_leftovers() {
  local environ pid vars node
  node=$(hostname -s)
  for environ in /proc/[0-9]*/environ; do
    pid=${environ#/proc/}; pid=${pid%/environ}
    vars=$( { tr '\0' '\n' <"$environ"; } 2>/dev/null ) || continue  # gone, or not ours to read
    grep -qx "SLURM_CLUSTER_NAME=perfzoo" <<<"$vars" && grep -qx "SLURMD_NODENAME=$node" <<<"$vars" \
      && grep -q "^SLURM_JOB_ID=" <<<"$vars" && echo "$pid"
  done
}
leftovers=$(job_leftovers | tr '\n' ' ')
if [[ -n "${leftovers// /}" ]]; then
  say "job processes left running without their job: $leftovers(SIGTERM, then SIGKILL after 5 s)"
  # shellcheck disable=SC2086
  kill -TERM $leftovers 2>/dev/null
  for _ in $(seq 50); do [[ -z "$(job_leftovers)" ]] && break; sleep 0.1; done
  leftovers=$(job_leftovers | tr '\n' ' ')
  # shellcheck disable=SC2086
  [[ -n "${leftovers// /}" ]] && kill -KILL $leftovers 2>/dev/null
fi
exit $rc
