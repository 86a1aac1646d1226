#!/usr/bin/env bash
# Start a real single-node SLURM cluster on localhost (for tests / CI).
#
#   sudo tests/slurm/setup.sh            # state dir: ${PERFZOO_SLURM_DIR:-/tmp/perfzoo-slurm}
#   tests/slurm/teardown.sh              # stops exactly what this script started
#
# Needs root and Debian/Ubuntu (apt). Idempotent: daemons that are already
# running (PID recorded in the state dir and alive) are left alone.
# Partitions: cpu (default) and gpu; the node has one fake GPU (gres gpu:1).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${PERFZOO_SLURM_DIR:-/tmp/perfzoo-slurm}"
WAIT_S="${PERFZOO_SLURM_WAIT:-60}"
T0=$(date +%s)

say() { echo "[slurm-setup +$(( $(date +%s) - T0 ))s] $*"; }
die() { echo "[slurm-setup] ERROR: $*" >&2; exit 1; }
alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

[[ $(id -u) -eq 0 ]] || die "must run as root (munged/slurmd need it)"

# 1. packages -----------------------------------------------------------------
if command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
   && command -v sbatch >/dev/null && command -v munged >/dev/null; then
  say "packages: slurmctld slurmd slurm-client munge already installed"
else
  say "packages: installing slurmctld slurmd slurm-client munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  mkdir -p "$STATE/log"
  { apt-get update -qq && apt-get install -y -q --no-install-recommends \
      slurmctld slurmd slurm-client munge; } >"$STATE/log/apt.log" 2>&1 \
    || { tail -n 30 "$STATE/log/apt.log" >&2; die "apt-get failed (see $STATE/log/apt.log)"; }
fi

# 2. config -------------------------------------------------------------------
HOST="$(hostname -s)"
# Topology as slurmd sees it (avoids "mismatch" drains); fall back to nproc.
read -r CPUS SOCKETS CORES THREADS < <(
  slurmd -C 2>/dev/null | awk '{for(i=1;i<=NF;i++){split($i,a,"=");v[a[1]]=a[2]}}
    /^NodeName/ {print v["CPUs"], v["Boards"]*v["SocketsPerBoard"], v["CoresPerSocket"], v["ThreadsPerCore"]}')
if [[ -z "${CPUS:-}" ]]; then
  CPUS=$(nproc); SOCKETS=1; CORES=$CPUS; THREADS=1
fi
MEM_TOTAL_MB=$(( $(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024 ))
MEM_MB=$(( MEM_TOTAL_MB * 95 / 100 ))  # a bit below physical, else slurmd drains the node

mkdir -p "$STATE"/{ctld,d,log}
sed -e "s|@HOST@|$HOST|g" -e "s|@CPUS@|$CPUS|g" -e "s|@SOCKETS@|$SOCKETS|g" \
    -e "s|@CORES@|$CORES|g" -e "s|@THREADS@|$THREADS|g" -e "s|@MEM_MB@|$MEM_MB|g" \
    -e "s|@STATE@|$STATE|g" "$HERE/slurm.conf.in" > "$STATE/slurm.conf.new"
cp "$HERE/gres.conf" "$STATE/gres.conf"
conf_changed=0
if [[ -f "$STATE/slurm.conf" ]] && cmp -s "$STATE/slurm.conf" "$STATE/slurm.conf.new"; then
  rm "$STATE/slurm.conf.new"
else
  mv "$STATE/slurm.conf.new" "$STATE/slurm.conf"
  conf_changed=1
fi
export SLURM_CONF="$STATE/slurm.conf"
say "config: $SLURM_CONF (node $HOST CPUs=$CPUS RealMemory=${MEM_MB}MB gpu:1; partitions cpu*, gpu)"

# Clients (sbatch/squeue/... also when called by snakemake) read
# /etc/slurm/slurm.conf unless SLURM_CONF is set: point it at our config,
# but never replace a real, pre-existing config.
mkdir -p /etc/slurm
for f in slurm.conf gres.conf; do
  if [[ ! -e /etc/slurm/$f || -L /etc/slurm/$f ]]; then
    ln -sfn "$STATE/$f" "/etc/slurm/$f"
  else
    say "WARNING: /etc/slurm/$f exists and is not ours; use: export SLURM_CONF=$SLURM_CONF"
  fi
done
say "config: /etc/slurm/slurm.conf -> $(readlink -f /etc/slurm/slurm.conf)"

# 3. munge --------------------------------------------------------------------
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge /etc/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
  say "munge: created /etc/munge/munge.key"
fi
if alive "$STATE/munged.pid"; then
  say "munge: munged already running (pid $(cat "$STATE/munged.pid"))"
elif munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "munge: a munged not started by us is already serving; using it"
else
  rm -f /run/munge/munged.pid
  runuser -u munge -- munged   # forks into the background itself
  for _ in $(seq 50); do [[ -s /run/munge/munged.pid ]] && break; sleep 0.1; done
  cp /run/munge/munged.pid "$STATE/munged.pid"
  say "munge: started munged (pid $(cat "$STATE/munged.pid"))"
fi
munge -n | unmunge >/dev/null || die "munge self-test failed"

# 4. slurmctld / slurmd -------------------------------------------------------
# Both daemonize and write their PID to $STATE/<daemon>.pid (see slurm.conf).
if alive "$STATE/slurmctld.pid"; then
  say "slurmctld: already running (pid $(cat "$STATE/slurmctld.pid"))"
  if (( conf_changed )); then
    scontrol reconfigure && say "slurmctld: config changed, ran scontrol reconfigure"
  fi
else
  slurmctld -f "$SLURM_CONF"
  for _ in $(seq 100); do alive "$STATE/slurmctld.pid" && break; sleep 0.1; done
  alive "$STATE/slurmctld.pid" || die "slurmctld did not start, see $STATE/log/slurmctld.log"
  say "slurmctld: started (pid $(cat "$STATE/slurmctld.pid"))"
fi
if alive "$STATE/slurmd.pid"; then
  say "slurmd: already running (pid $(cat "$STATE/slurmd.pid"))"
else
  slurmd -f "$SLURM_CONF"
  for _ in $(seq 100); do alive "$STATE/slurmd.pid" && break; sleep 0.1; done
  alive "$STATE/slurmd.pid" || die "slurmd did not start, see $STATE/log/slurmd.log"
  say "slurmd: started (pid $(cat "$STATE/slurmd.pid"))"
fi

# 5. wait for the node --------------------------------------------------------
resumed=0
state=""
for _ in $(seq "$WAIT_S"); do
  state=$(sinfo -h -N -n "$HOST" -o '%t' 2>/dev/null | head -n1 || true)
  case "$state" in
    idle|mix|alloc) break ;;
    drain*|drng*|down*|inval*|fail*)
      if (( resumed == 0 )); then
        say "node: $HOST is '$state' (saved state), resuming"
        scontrol update NodeName="$HOST" State=RESUME || true
        resumed=1
      fi ;;
  esac
  sleep 1
done
case "$state" in
  idle|mix|alloc) ;;
  *) sinfo -N -l >&2 || true
     die "node $HOST not idle after ${WAIT_S}s (state '$state'); see $STATE/log/" ;;
esac
say "node: $HOST is $state"
sinfo
say "ready in $(( $(date +%s) - T0 ))s (state dir $STATE)"
