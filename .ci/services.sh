#!/usr/bin/env bash
# Start the services the scale-out tests run against, on this machine, idempotently:
#   slurm     munge + slurmctld + slurmd, one CPU node named after this host (Debian's slurm-wlm)
#   postgres  a PostgreSQL cluster on 127.0.0.1:5432 with role/database gc25d (Debian's postgresql)
#   browser   headless Chromium and its WebDriver for the browser tests (tests/ui, tests/deploy: Debian's
#             chromium, chromium-driver)
# Needs root (apt-get, daemons). Run by .ci/run and by the tests' fixtures (tests/services.py);
# a second call finds them running and only checks them.
#   bash .ci/services.sh [slurm] [postgres] [browser]     (default: all three)
set -euo pipefail
want=("$@"); [ ${#want[@]} -eq 0 ] && want=(slurm postgres browser)
STATE=/var/lib/gc25d-ci
mkdir -p "$STATE"

apt_install() {  # install the packages whose command is missing
  local missing=()
  for pair in "$@"; do cmd=${pair%%:*}; pkg=${pair#*:}; command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  # one apt-get update per machine boot is enough; lists older than a day are refreshed
  if [ ! -f "$STATE/apt-updated" ] || [ -n "$(find "$STATE/apt-updated" -mmin +1440)" ]; then
    apt-get update -q && touch "$STATE/apt-updated"
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

wait_for() {  # wait_for SECONDS CMD...: retry CMD until it succeeds
  local t=$1; shift
  for _ in $(seq "$((t * 2))"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  "$@"
}

start_slurm() {
  apt_install slurmctld:slurmctld slurmd:slurmd munged:munge sbatch:slurm-client
  local host; host=$(hostname -s)
  local cpus; cpus=$(nproc)
  local mem; mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
  # proctrack/linuxproc and task/none: containers here have no writable cgroup tree for slurmd
  cat > "$STATE/slurm.conf.new" <<CONF
# written by gc25d .ci/services.sh: one CPU node for the SlurmLauncher tests
ClusterName=gc25d-ci
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# finished jobs stay visible to scontrol for 10 min (the launcher reads their end state there)
MinJobAge=600
KillWait=10
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  if ! cmp -s "$STATE/slurm.conf.new" /etc/slurm/slurm.conf 2>/dev/null; then
    mv "$STATE/slurm.conf.new" /etc/slurm/slurm.conf
    pkill_pidfile /run/slurmctld.pid; pkill_pidfile /run/slurmd.pid
  fi
  [ -s /etc/munge/munge.key ] || { mkdir -p /etc/munge; dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
  munge -n </dev/null >/dev/null 2>&1 || { runuser -u munge -- /usr/sbin/munged --force; wait_for 10 sh -c 'munge -n </dev/null | unmunge'; }
  alive /run/slurmctld.pid || slurmctld
  wait_for 30 scontrol ping
  alive /run/slurmd.pid || slurmd
  wait_for 30 sh -c "sinfo -h -N -o '%t' | grep -qE '^(idle|mix|alloc)'" || {
    scontrol update nodename="$host" state=resume || true
    wait_for 30 sh -c "sinfo -h -N -o '%t' | grep -qE '^(idle|mix|alloc)'"
  }
  echo "slurm: $(sinfo -h -N -o '%N %t %c CPUs')"
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
pkill_pidfile() { if alive "$1"; then kill "$(cat "$1")"; sleep 1; fi; }

start_postgres() {
  apt_install pg_ctlcluster:postgresql
  local ver; ver=$(ls /usr/lib/postgresql | sort -n | tail -1)
  [ -d "/etc/postgresql/$ver/main" ] || pg_createcluster "$ver" main
  pg_ctlcluster "$ver" main status >/dev/null 2>&1 || pg_ctlcluster "$ver" main start
  wait_for 30 runuser -u postgres -- psql -qtAc "select 1"
  runuser -u postgres -- psql -qtAc "select 1 from pg_roles where rolname='gc25d'" | grep -q 1 ||
    runuser -u postgres -- psql -qc "create role gc25d login password 'gc25d' createdb"
  runuser -u postgres -- psql -qtAc "select 1 from pg_database where datname='gc25d'" | grep -q 1 ||
    runuser -u postgres -- createdb -O gc25d gc25d
  wait_for 30 env PGPASSWORD=gc25d psql -h 127.0.0.1 -U gc25d -d gc25d -qtAc "select 1"
  echo "postgres: $ver on 127.0.0.1:5432, role and database gc25d"
}

start_browser() {  # nothing to start: tests/ui/test_browser.py runs chromium through chromedriver
  apt_install chromium:chromium chromedriver:chromium-driver
  echo "browser: $(chromium --version 2>/dev/null | head -1); $(chromedriver --version | head -1)"
}

for s in "${want[@]}"; do
  case "$s" in
    slurm) start_slurm ;;
    postgres) start_postgres ;;
    browser) start_browser ;;
    *) echo "unknown service $s (slurm | postgres | browser)" >&2; exit 2 ;;
  esac
done
