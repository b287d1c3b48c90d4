#!/usr/bin/env bash
# A one-host SLURM cluster on 127.0.0.1 for trying tfaccel (and for its tests), from Debian's own packages.
#
# Usage: bash scripts/local_slurm.sh up|down|status [DIR]
#   up      install Debian's slurmctld, slurmd, slurm-client and munge when missing (as root; `apt-get update`
#           first), write a munge key and slurm.conf in DIR, start munged, slurmctld and one slurmd per node,
#           wait until `sinfo` shows every node idle, and print the environment to use (SLURM_CONF=...).
#           Running `up` again on a running cluster only prints the environment.
#   down    stop each daemon by the PID in its pid file (slurmd, slurmctld, munged) and wait for it to end.
#   status  print `sinfo` of the cluster in DIR, or say it is not running (exit 1).
#   DIR     the cluster's own directory (config, key, state, logs, pid files). Defaults to
#           $TFACCEL_SLURM_DIR, else /tmp/tfaccel-slurm.
#
# The cluster: three nodes, all this host (NodeAddr 127.0.0.1), each with its own slurmd (Debian's build runs
# several slurmd on one host: `slurmd -N NAME`, one port per node). Partition `debug` (the default) is node
# `$(hostname -s)`, a name that resolves here, declared with 4 CPUs (SlurmdParameters=config_overrides lets a
# 2-core host register it), so a job step of up to 4 tasks (a chief, a ps and 2 workers) runs on it. Partition
# `multi` is node9 and node10 (2 CPUs each): a two-node allocation whose host list (`node[9-10]`), tasks per node
# and rank order are SLURM's own; their names do not resolve, so nothing listens there (tfaccel gives task k of a
# node port PORT + k, and two node names on one host would share the ports).
# Munge runs with the key and socket in DIR (slurm.conf's AuthInfo points SLURM at it), so nothing under
# /etc/munge or /etc/slurm is read or written.
# Environment: TFACCEL_SLURM_DIR, TFACCEL_SLURM_PORT_BASE (slurmctld's port; the slurmds take the next ones;
# default 16817), TFACCEL_SLURM_WAIT (seconds `up` waits for the nodes; default 60).
set -euo pipefail

usage() { sed -n '2,21p' "$0"; }
die() { echo "local_slurm: $*" >&2; exit 1; }

verb="${1:-}"
case "$verb" in
    up|down|status) ;;
    -h|--help) usage; exit 0 ;;
    "") usage >&2; exit 2 ;;
    *) echo "local_slurm: unknown command '$verb'; valid: up, down, status" >&2; exit 2 ;;
esac
[ $# -le 2 ] || { echo "local_slurm: too many arguments; usage: local_slurm.sh up|down|status [DIR]" >&2; exit 2; }
dir="${2:-${TFACCEL_SLURM_DIR:-/tmp/tfaccel-slurm}}"
case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
base_port="${TFACCEL_SLURM_PORT_BASE:-16817}"
wait_s="${TFACCEL_SLURM_WAIT:-60}"
host="$(hostname -s)"
nodes=("$host" node9 node10)
export PATH="/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}"
export SLURM_CONF="$dir/slurm.conf"

# stop_pids FILE...: ends the daemons whose PIDs are in the pid files, all at once (TERM, then KILL after 10 s),
# and removes the files.
stop_pids() {
    local file pid pids=() alive
    for file in "$@"; do
        [ -f "$file" ] || continue
        pid="$(cat "$file")"
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    for _ in $(seq 100); do
        alive=()
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
        [ ${#alive[@]} -eq 0 ] && break
        sleep 0.1
    done
    for pid in "${alive[@]}"; do
        echo "local_slurm: daemon pid $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)) did not stop in 10 s;" \
             "killing it" >&2
        kill -KILL "$pid" 2>/dev/null || true
    done
    rm -f "$@"
}

down() {
    local jobs
    if [ -f "$dir/run/slurmctld.pid" ] && kill -0 "$(cat "$dir/run/slurmctld.pid")" 2>/dev/null; then
        jobs="$(squeue -h -o %i 2>/dev/null || true)"
        if [ -n "$jobs" ]; then  # end the jobs first: their processes belong to slurmstepd, not to a pid file
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            for _ in $(seq 100); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
        fi
    fi
    # every slurmd started here (also of an older node list) and slurmctld, then munged, which they use to the end
    stop_pids "$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid"
    stop_pids "$dir/run/munged.pid"
    echo "local_slurm: stopped the cluster in $dir"
}

install_packages() {  # one install at a time on this machine (two test sessions may start a cluster at once)
    exec 9>/tmp/tfaccel-slurm-install.lock
    flock -w 600 9 || die "another local_slurm.sh has held /tmp/tfaccel-slurm-install.lock for 10 minutes"
    install_missing
    flock -u 9
    exec 9>&-
}

install_missing() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v srun >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "Debian's ${missing[*]} are not installed and this is not root; run" \
        "'sudo apt-get update && sudo apt-get install -y slurmctld slurmd slurm-client munge' first"
    command -v apt-get >/dev/null || die "${missing[*]} missing and no apt-get here (the script needs Debian/Ubuntu)"
    echo "local_slurm: installing ${missing[*]} (apt-get update, then apt-get install)"
    local start=$SECONDS
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$dir/log/apt.log" 2>&1 \
        || { cat "$dir/log/apt.log" >&2; die "apt-get update failed (log above)"; }
    local t_update=$((SECONDS - start))
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge \
        >>"$dir/log/apt.log" 2>&1 || { tail -20 "$dir/log/apt.log" >&2; die "apt-get install failed (log above)"; }
    echo "local_slurm: installed in $((SECONDS - start)) s (apt-get update $t_update s)"
}

write_config() {
    local n cpus port=$((base_port + 1))
    if [ ! -f "$dir/munge.key" ]; then
        head -c 1024 /dev/urandom >"$dir/munge.key"
    fi
    chmod 400 "$dir/munge.key"
    {
        echo "# written by scripts/local_slurm.sh: a one-host cluster on 127.0.0.1"
        echo "ClusterName=tfaccel"
        echo "SlurmctldHost=$host(127.0.0.1)"
        echo "SlurmctldPort=$base_port"
        echo "SlurmdPort=$((base_port + 1))"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        # cred_expire: also bounds how long a requeued job waits before it starts again (SLURM's default: 120 s;
        # with 5 s a requeued job restarted 30 s after its requeue here)
        echo "AuthInfo=socket=$dir/run/munge.socket,cred_expire=5"
        echo "StateSaveLocation=$dir/state"
        echo "SlurmdSpoolDir=$dir/spool/%n"
        echo "SlurmctldPidFile=$dir/run/slurmctld.pid"
        echo "SlurmdPidFile=$dir/run/slurmd-%n.pid"
        echo "SlurmctldLogFile=$dir/log/slurmctld.log"
        echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "JobCompType=jobcomp/none"
        echo "SchedulerType=sched/backfill"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_Core"
        echo "SlurmdParameters=config_overrides"
        echo "ReturnToService=2"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "MpiDefault=none"
        echo "KillWait=12"  # TERM to KILL: above tfaccel launch's --grace (10 s), so its tasks end first
        echo "MinJobAge=30"
        echo "JobRequeue=1"
        for n in "${nodes[@]}"; do
            cpus=2
            [ "$n" = "$host" ] && cpus=4
            echo "NodeName=$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$port CPUs=$cpus State=UNKNOWN"
            port=$((port + 1))
        done
        echo "PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
        echo "PartitionName=multi Nodes=node9,node10 MaxTime=INFINITE State=UP OverSubscribe=YES"
    } >"$dir/slurm.conf"
}

print_env() {
    echo "local_slurm: cluster up in $dir; to use it:"
    echo "export SLURM_CONF=$dir/slurm.conf"
}

nodes_idle() {  # true when sinfo lists every node idle (or mixed/allocated: the cluster is usable)
    local states
    [ -f "$SLURM_CONF" ] || return 1  # else sinfo retries for a minute
    states="$(sinfo -h -N -o '%N %t' 2>/dev/null)" || return 1
    [ "$(grep -cE ' (idle|mix|alloc)$' <<<"$states")" -eq "${#nodes[@]}" ]
}

up() {
    mkdir -p "$dir/state" "$dir/run" "$dir/log"
    local n
    for n in "${nodes[@]}"; do mkdir -p "$dir/spool/$n"; done
    if [ -f "$dir/run/slurmctld.pid" ] && kill -0 "$(cat "$dir/run/slurmctld.pid")" 2>/dev/null && nodes_idle; then
        print_env; return 0
    fi
    down >/dev/null  # a half-started cluster (a daemon died) starts afresh
    install_packages
    write_config
    munged --force --key-file="$dir/munge.key" --socket="$dir/run/munge.socket" --pid-file="$dir/run/munged.pid" \
        --log-file="$dir/log/munged.log" --seed-file="$dir/run/munged.seed" 2>>"$dir/log/munged.log" \
        || die "munged did not start; see $dir/log/munged.log"
    slurmctld -f "$SLURM_CONF" 2>>"$dir/log/slurmctld.log" || die "slurmctld did not start; see $dir/log/slurmctld.log"
    for n in "${nodes[@]}"; do
        slurmd -f "$SLURM_CONF" -N "$n" 2>>"$dir/log/slurmd-$n.log" || die "slurmd $n did not start; see $dir/log/slurmd-$n.log"
    done
    local deadline=$((SECONDS + wait_s))
    until nodes_idle; do
        if [ $SECONDS -ge $deadline ]; then
            sinfo -N >&2 || true
            tail -5 "$dir/log/slurmctld.log" >&2 || true
            die "the nodes were not idle after ${wait_s} s (sinfo and slurmctld's log above; logs in $dir/log)"
        fi
        sleep 0.5
    done
    print_env
}

case "$verb" in
    up) up ;;
    down) down ;;
    status) if nodes_idle; then sinfo -N; else echo "local_slurm: no running cluster in $dir" >&2; exit 1; fi ;;
esac
