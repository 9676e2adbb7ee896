#!/usr/bin/env bash
# A one-machine Slurm cluster for tests, from Debian's packages (munge,
# slurmctld, slurmd, slurm-client): munged, slurmctld and slurmd on
# 127.0.0.1 with a generated slurm.conf, everything under one directory.
# Sourced by a test that has set -euo pipefail and defines log and fail.
#
#   slurm_cluster_start DIR CPUS   starts the daemons; exports SLURM_CONF
#   slurm_cluster_stop             cancels the jobs left, stops the daemons by PID
#
# slurmd starts job steps as the submitting user, so it must run as root;
# the cluster needs no systemd and no cgroups (proctrack/linuxproc,
# task/none). The node is named "localhost" (slurmd -N), so job steps reach
# the coordinator at localhost.

SLURM_PIDS=()
SLURM_DIR=""

# free_ports N: N TCP ports that were free on 127.0.0.1 a moment ago.
free_ports() {
  /usr/bin/python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

slurm_cluster_start() {
  SLURM_DIR=$1
  local cpus=$2 host
  host=$(hostname -s)
  ((EUID == 0)) || fail "slurmd must run as root to start job steps (this test runs as uid $EUID)"
  mkdir -p "$SLURM_DIR"/{munge,ctld,spool,log}
  chmod 700 "$SLURM_DIR/munge"
  head -c 1024 /dev/urandom >"$SLURM_DIR/munge/munge.key"
  chmod 400 "$SLURM_DIR/munge/munge.key"
  local ctld_port slurmd_port
  read -r ctld_port slurmd_port < <(free_ports 2)
  cat >"$SLURM_DIR/slurm.conf" <<EOF
ClusterName=tandemtest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$SLURM_DIR/munge/munge.socket.2
CredType=cred/munge
StateSaveLocation=$SLURM_DIR/ctld
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The node may declare more CPUs than the machine has (3 tasks on 2 cores).
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=10
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$SLURM_DIR/slurm.conf"
  setsid munged --foreground --force --key-file="$SLURM_DIR/munge/munge.key" \
    --socket="$SLURM_DIR/munge/munge.socket.2" --pid-file="$SLURM_DIR/munge/munged.pid" \
    --seed-file="$SLURM_DIR/munge/munged.seed" --log-file="$SLURM_DIR/log/munged.log" \
    >"$SLURM_DIR/log/munged.out" 2>&1 &
  SLURM_PIDS+=($!)
  local i
  for i in $(seq 1 50); do
    [[ -S "$SLURM_DIR/munge/munge.socket.2" ]] && break
    sleep 0.1
    ((i < 50)) || slurm_fail "munged did not create its socket in 5 s"
  done
  setsid slurmctld -D -i -f "$SLURM_CONF" >"$SLURM_DIR/log/slurmctld.out" 2>&1 &
  SLURM_PIDS+=($!)
  setsid slurmd -D -N localhost -f "$SLURM_CONF" >"$SLURM_DIR/log/slurmd.out" 2>&1 &
  SLURM_PIDS+=($!)
  for i in $(seq 1 60); do
    [[ $(sinfo -h -N -o %t 2>/dev/null) == idle ]] && break
    for pid in "${SLURM_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || slurm_fail "a Slurm daemon exited"; done
    sleep 0.5
    ((i < 60)) || slurm_fail "the node is not idle after 30 s: $(sinfo -N 2>&1)"
  done
  log "slurm cluster up: slurmctld :$ctld_port, slurmd :$slurmd_port, $cpus CPUs, $SLURM_DIR"
}

slurm_fail() {
  local f
  for f in "$SLURM_DIR"/log/*; do
    echo "--- $f (tail)" >&2
    tail -n 20 "$f" >&2
  done
  fail "$*"
}

slurm_cluster_stop() {
  set +e
  if [[ -n "${SLURM_CONF:-}" ]] && ((${#SLURM_PIDS[@]} == 3)) && kill -0 "${SLURM_PIDS[1]}" 2>/dev/null; then
    scancel --user=root --full 2>/dev/null
    local i
    for i in $(seq 1 40); do
      [[ -z $(squeue -h 2>/dev/null) ]] && break
      sleep 0.5
    done
  fi
  # slurmd first, then slurmctld, then munged (the reverse of their start).
  local idx pid
  for ((idx = ${#SLURM_PIDS[@]} - 1; idx >= 0; idx--)); do
    pid=${SLURM_PIDS[idx]}
    kill -TERM "$pid" 2>/dev/null || continue
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  SLURM_PIDS=()
}
