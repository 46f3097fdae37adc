#!/usr/bin/env bash
# A real single-node Slurm on localhost (munged + slurmctld + slurmd, Debian 12's Slurm 22.05),
# for tests and for trying the sbatch templates without a cluster. Run as root.
#
#   scripts/slurm/local_slurm.sh up      install (if missing) and start; prints the SLURM_CONF line
#   scripts/slurm/local_slurm.sh down    stop what `up` started (by PID)
#   scripts/slurm/local_slurm.sh status  sinfo
#
# Everything lives in $LOOM_SLURM_DIR (default /tmp/loom-slurm): slurm.conf, state, logs. The
# system's /etc/slurm is not touched: clients find the config through SLURM_CONF, e.g.
#   eval "$(scripts/slurm/local_slurm.sh up)"; sbatch scripts/slurm/batch.sbatch hostname
# Two partitions: `interactive` (MaxTime 30 min) and `batch` (default, no limit). The node
# declares at least 4 CPUs so 4-rank jobs fit on a 2-core machine. slurmctld and slurmd listen
# on the first free pair of ports from $LOOM_SLURM_PORT (default 6817). Exit 77: Slurm's
# packages are missing and could not be installed.
set -euo pipefail
W=${LOOM_SLURM_DIR:-/tmp/loom-slurm}
CONF=$W/slurm.conf
log() { echo "local_slurm: $*" >&2; }

install_packages() {
  local missing=() p
  for p in slurmctld slurmd slurm-client munge; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] || { log "Slurm is not installed (${missing[*]}) and we are not root"; return 77; }
  log "installing ${missing[*]}"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}"; } >"$W/apt.log" 2>&1 || {
    tail -n 5 "$W/apt.log" >&2; log "could not install ${missing[*]}"; return 77; }
}

# A port something listens on (bash's /dev/tcp: no tools needed).
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The first pair of free ports (slurmctld, slurmd) from $LOOM_SLURM_PORT (default 6817, Slurm's
# own) upward, so two local clusters (two test runs on one machine) do not meet.
pick_ports() {
  local p=${LOOM_SLURM_PORT:-6817}
  while port_busy "$p" || port_busy $((p + 1)); do
    p=$((p + 2))
    (( p < 65000 )) || { log "no free port pair from ${LOOM_SLURM_PORT:-6817} up"; return 1; }
  done
  echo "$p"
}

stop_pidfile() {  # kill the process named by a pid file, wait for it (<= 5 s)
  local f=$1 p
  [ -s "$f" ] || return 0
  p=$(<"$f")
  if kill "$p" 2>/dev/null; then
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$f"
}

down() {
  stop_pidfile "$W/state/slurmd.pid"
  stop_pidfile "$W/state/slurmctld.pid"
  [ -s "$W/munged.pid" ] && stop_pidfile "$W/munged.pid"  # only a munged we started
  log "stopped"
}

up() {
  mkdir -p "$W"
  install_packages || return $?
  down 2>/dev/null || true
  rm -rf "$W/state" "$W/log"
  mkdir -p "$W/state/ctld" "$W/state/d" "$W/log"
  # munge: /run/munge is made by systemd-tmpfiles, which is absent here; munged refuses root.
  if ! { munge -n | unmunge; } >/dev/null 2>&1; then
    [ -s /etc/munge/munge.key ] || { mungekey -c && chown munge:munge /etc/munge/munge.key; }
    install -d -o munge -g munge -m 755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 1 50); do [ -s /run/munge/munged.pid ] && break; sleep 0.1; done
    cp /run/munge/munged.pid "$W/munged.pid"
    { munge -n | unmunge; } >/dev/null || { log "munge does not work"; return 1; }
  fi
  local h ncpu port
  h=$(hostname -s)
  port=$(pick_ports) || return 1
  ncpu=$(nproc); (( ncpu < 4 )) && ncpu=4
  cat >"$CONF" <<CONF
ClusterName=loomci
SlurmctldHost=${h}(127.0.0.1)
SlurmctldPort=${port}
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$W/state/ctld
SlurmdSpoolDir=$W/state/d
SlurmctldPidFile=$W/state/slurmctld.pid
SlurmdPidFile=$W/state/slurmd.pid
SlurmctldLogFile=$W/log/slurmctld.log
SlurmdLogFile=$W/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
ReturnToService=2
MailProg=/bin/true
InactiveLimit=0
MinJobAge=300
KillWait=5
NodeName=${h} NodeAddr=127.0.0.1 CPUs=${ncpu} Sockets=1 CoresPerSocket=${ncpu} ThreadsPerCore=1 State=UNKNOWN
PartitionName=interactive Nodes=ALL Default=NO  MaxTime=00:30:00 State=UP OverSubscribe=FORCE:2
PartitionName=batch       Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2
CONF
  export SLURM_CONF=$CONF
  slurmctld -f "$CONF"
  slurmd -f "$CONF"
  local st=""
  for _ in $(seq 1 150); do  # <= ~30 s
    st=$(sinfo -h -N -o %T 2>/dev/null | sort -u || true)
    [ "$st" = idle ] && break
    sleep 0.2
  done
  if [ "$st" != idle ]; then
    log "node not idle (state '$st')"; sinfo -N -o '%N %T %E' >&2 || true
    tail -n 20 "$W"/log/*.log >&2 || true
    return 1
  fi
  log "up: $(sinfo -h -o '%P/%a' | tr '\n' ' ')(SLURM_CONF=$CONF)"
  echo "export SLURM_CONF=$CONF"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) SLURM_CONF=$CONF sinfo ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
