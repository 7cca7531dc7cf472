#!/usr/bin/env bash
# A small, real SLURM cluster on this one machine, from Debian's packages (slurm-wlm 22.05, munge).
#
#   scripts/slurm_cluster.sh start N [--rate-mbit R] [--cpus C] [--dir DIR] [--install] [--no-netns]
#   scripts/slurm_cluster.sh stop [--dir DIR] [--clean]
#   scripts/slurm_cluster.sh status [--dir DIR]
#   scripts/slurm_cluster.sh env [--dir DIR]     # prints: export SLURM_CONF=DIR/slurm.conf
#
# Then: eval "$(scripts/slurm_cluster.sh env)"; sbatch -N 3 job.sh; srun -N 3 -n 3 hostname
#
# Design (the hosts follow benchmarks/common/netns.py):
# - node I (node0 .. node{N-1}) is a network namespace jaxsync-slurm-nI with one veth at
#   10.99.0.(I+1)/24, on a Linux bridge that lives in one more namespace (jaxsync-slurm-br). Its slurmd
#   runs there in a mount and a UTS namespace of its own: the hostname is the node's name (which is how
#   slurmd finds its NodeName; `hostname` in a job prints it) and /etc/hosts is DIR/hosts, mapping every
#   nodeJ to 10.99.0.(J+1), so a node's name resolves to its address on every node (JAX's SLURM
#   detection dials the first node of SLURM_STEP_NODELIST by name). The root /etc/hosts is untouched.
# - the root namespace gets 10.99.0.254/24 on the same bridge (veth jxslurm0): slurmctld and munged run
#   there, so sbatch / srun / sinfo work from the root namespace as from inside jobs (a slurmd connects
#   back to the address an srun's request came from, 10.99.0.254 for an srun in the root namespace).
# - each slurmd has its own spool dir, pid file and log through %n in slurm.conf.
# - --rate-mbit shapes each node's link in both directions with a tc token bucket, as netns.py does.
# - where network namespaces cannot be made (or with --no-netns) it falls back to ONE node, this
#   machine's hostname at 127.0.0.1, with N x C CPUs, and says so.
# - all state (slurm.conf, hosts, munge key and socket, spool, logs, pid files) lives under DIR
#   (default /tmp/jaxsync-slurm); /run/jaxsync-slurm.dir names the DIR of the cluster running now.
#   `stop` kills the daemons and whatever still runs on the nodes and deletes the namespaces; it keeps
#   DIR (the logs) unless --clean. `start` is idempotent: a cluster already running with the same
#   settings is kept, anything else is stopped first.
# Exit codes: 0 done, 1 failed (the logs' tails are printed), 2 usage, 3 unavailable here (missing
# packages, not root, another DIR's cluster running).
set -euo pipefail

PREFIX=jaxsync-slurm
SUBNET=10.99.0
ROOT_LINK=jxslurm0
OWNER=/run/$PREFIX.dir
INSTALL_CMD="apt-get install -y --no-install-recommends slurm-wlm munge"

usage() {
  sed -n '4,7p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

die() {
  echo "slurm_cluster: $*" >&2
  exit 1
}

unavailable() {
  echo "slurm_cluster: $*" >&2
  exit 3
}

cmd=${1:-}
[[ -n $cmd ]] || usage
shift
N=
RATE=
CPUS=
DIR=/tmp/jaxsync-slurm
INSTALL=0
CLEAN=0
NETNS=1
if [[ $cmd == start ]]; then
  [[ ${1:-} =~ ^[1-9][0-9]*$ ]] || usage
  N=$1
  shift
  ((N <= 200)) || die "N=$N: at most 200 nodes (addresses $SUBNET.1 .. $SUBNET.200)"
fi
while (($#)); do
  case $1 in
    --rate-mbit) RATE=${2:?--rate-mbit needs a value}; shift 2 ;;
    --rate-mbit=*) RATE=${1#*=}; shift ;;
    --cpus) CPUS=${2:?--cpus needs a value}; shift 2 ;;
    --cpus=*) CPUS=${1#*=}; shift ;;
    --dir) DIR=${2:?--dir needs a value}; shift 2 ;;
    --dir=*) DIR=${1#*=}; shift ;;
    --install) INSTALL=1; shift ;;
    --clean) CLEAN=1; shift ;;
    --no-netns) NETNS=0; shift ;;
    *) usage ;;
  esac
done
[[ -z $RATE || $RATE =~ ^[0-9]*\.?[0-9]+$ ]] || die "--rate-mbit=$RATE: give a positive number of Mbit/s"
[[ -z $CPUS || $CPUS =~ ^[1-9][0-9]*$ ]] || die "--cpus=$CPUS: give a positive integer"
[[ $DIR == /* ]] || DIR=$PWD/$DIR
CONF=$DIR/slurm.conf
LOGS=$DIR/log
export SLURM_CONF=$CONF

ns_name() { echo "$PREFIX-n$1"; }

# $2's pid from pid file $1 (nothing when the file is gone or the pid is now another program's).
pid_of() {
  local file=$1 comm=$2 pid
  [[ -f $file ]] || return 0
  pid=$(tr -dc 0-9 <"$file")
  if [[ -n $pid && -r /proc/$pid/comm && $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]]; then
    echo "$pid"
  fi
}

# Sends TERM to the pids, waits up to $1 s for them to end, then KILLs the rest.
end_pids() {
  local wait=$1 pid left t
  shift
  (($#)) || return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((t = 0; t < wait * 10; t++)); do
    left=0
    for pid in "$@"; do [[ -d /proc/$pid ]] && left=1; done
    ((left)) || return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null || true
}

our_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-" || true; }

stop_cluster() {
  local ns d f t pids=()
  if [[ -f $OWNER ]] && d=$(cat "$OWNER") && [[ $d != "$DIR" ]]; then
    if [[ -n $(pid_of "$d/run/slurmctld.pid" slurmctld) ]]; then
      echo "slurm_cluster: the cluster running is $d's, not $DIR's: left alone (stop it with --dir $d)" >&2
      LEFT_ALONE=1
      return 0
    fi
    # What is left of a cluster started under another DIR (its controller gone): found from there.
    [[ ! -d $d ]] || "$0" stop --dir "$d" >/dev/null || true
  fi
  if [[ -f $DIR/cluster.env ]] && grep -q 'MODE=single' "$DIR/cluster.env" \
    && [[ -n $(pid_of "$DIR/run/slurmctld.pid" slurmctld) ]]; then
    # One node in the root namespace: its jobs' processes are found through Slurm itself.
    scancel --full --signal=KILL --quiet --user=root 2>/dev/null || true
    for ((t = 0; t < 50; t++)); do
      [[ -z $(squeue -h -t running,completing 2>/dev/null) ]] && break
      sleep 0.1
    done
  fi
  # Everything at once (each daemon takes a second or two to wind down): the nodes' slurmds,
  # slurmstepds and job processes, which all live in the namespaces, and slurmctld; munged last.
  for ns in $(our_namespaces); do
    # shellcheck disable=SC2207
    pids+=($(ip netns pids "$ns" 2>/dev/null || true))
  done
  for f in "$DIR"/run/slurmd-*.pid; do
    # shellcheck disable=SC2207
    [[ -f $f ]] && pids+=($(pid_of "$f" slurmd))
  done
  # shellcheck disable=SC2207
  pids+=($(pid_of "$DIR/run/slurmctld.pid" slurmctld))
  end_pids 5 ${pids[@]+"${pids[@]}"}
  # shellcheck disable=SC2046
  end_pids 3 $(pid_of "$DIR/munge/munged.pid" munged)
  for ns in $(our_namespaces); do
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$ROOT_LINK" 2>/dev/null || true # normally gone with its peer in the bridge namespace
  [[ -z $(our_namespaces) ]] || die "namespaces left behind: $(our_namespaces | tr '\n' ' ')"
  if [[ -f $OWNER && $(cat "$OWNER") == "$DIR" ]]; then rm -f "$OWNER"; fi
  if ((CLEAN)); then rm -rf "$DIR"; fi
  return 0
}

logs_hint() {
  echo "slurm_cluster: logs are in $LOGS (slurmctld.log, slurmd-NODE.log, munged.log)" >&2
  local f
  for f in "$LOGS"/*.log "$LOGS"/*.out; do
    [[ -s $f ]] || continue
    echo "--- tail of $f:" >&2
    grep -v 'pmix\|MPI: Cannot' "$f" | tail -n 6 >&2
  done
}

fail() {
  echo "slurm_cluster: $*" >&2
  logs_hint
  stop_cluster || true
  exit 1
}

# Runs a command; on failure stops what was started and names the command.
x() {
  "$@" || fail "\`$*\` failed (exit code $?)"
}

check_tools() {
  local missing=() t
  (($(id -u) == 0)) || unavailable "needs root (slurmd, network namespaces)"
  for t in slurmctld slurmd munged munge sinfo sbatch srun scontrol; do
    command -v "$t" >/dev/null || missing+=("$t")
  done
  if ((${#missing[@]})); then
    if ((INSTALL)); then
      echo "slurm_cluster: installing: $INSTALL_CMD" >&2
      DEBIAN_FRONTEND=noninteractive $INSTALL_CMD >/dev/null || die "'$INSTALL_CMD' failed"
    else
      unavailable "${missing[*]} not found; run: $INSTALL_CMD (or pass --install)"
    fi
  fi
  if ((NETNS)); then
    local why=
    for t in ip nsenter unshare; do command -v "$t" >/dev/null || why="$t not found"; done
    [[ -n $why || -z $RATE ]] || command -v tc >/dev/null || why="tc not found"
    if [[ -z $why ]]; then
      # A throwaway namespace tells whether they can be made here at all.
      if ! why=$(ip netns add "$PREFIX-probe" 2>&1); then
        why="\`ip netns add\` failed: $why"
      else
        why=
        ip netns del "$PREFIX-probe"
      fi
    fi
    if [[ -n $why ]]; then
      echo "slurm_cluster: network namespaces unavailable ($why): falling back to ONE node" >&2
      NETNS=0
    fi
  fi
}

token_bucket() { # tc arguments shaping $1's egress to $2 Mbit/s, as netns.py's _token_bucket
  local burst
  burst=$(awk -v r="$2" 'BEGIN { b = int(r * 1e6 / 8 * 0.01); print (b > 65536 ? b : 65536) }')
  echo "qdisc add dev $1 root tbf rate ${2}mbit burst $burst latency 100ms"
}

make_network() {
  local br=$PREFIX-br i ns
  if ip -4 -br addr | grep -q " $SUBNET\."; then
    fail "the root namespace already has an address in $SUBNET.0/24: $(ip -4 -br addr | grep " $SUBNET\.")"
  fi
  x ip netns add "$br"
  x ip -n "$br" link add br0 type bridge
  x ip -n "$br" link set br0 up
  # The root namespace's port: the controller's and the clients' address.
  x ip link add "$ROOT_LINK" type veth peer name ctl netns "$br"
  x ip -n "$br" link set ctl master br0
  x ip -n "$br" link set ctl up
  x ip addr add "$CTL_ADDR/24" dev "$ROOT_LINK"
  x ip link set "$ROOT_LINK" up
  for ((i = 0; i < N; i++)); do
    ns=$(ns_name "$i")
    x ip netns add "$ns"
    # Both ends are made inside their namespaces, as in netns.py.
    x ip link add eth0 netns "$ns" type veth peer name "h$i" netns "$br"
    x ip -n "$br" link set "h$i" master br0
    x ip -n "$br" link set "h$i" up
    x ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
    x ip -n "$ns" link set eth0 up
    x ip -n "$ns" link set lo up
    if [[ -n $RATE ]]; then
      # shellcheck disable=SC2046
      x tc -n "$ns" $(token_bucket eth0 "$RATE")
      # shellcheck disable=SC2046
      x tc -n "$br" $(token_bucket "h$i" "$RATE")
    fi
  done
  # The nodes' /etc/hosts (bind-mounted in their own mount namespaces; see start_cluster).
  {
    echo "127.0.0.1 localhost"
    echo "$CTL_ADDR $CTL_HOST slurmctld"
    for ((i = 0; i < N; i++)); do echo "$SUBNET.$((i + 1)) node$i"; done
  } >"$DIR/hosts"
}

write_conf() {
  local i
  cat >"$CONF" <<EOF
# Written by scripts/slurm_cluster.sh.
ClusterName=jaxsync
SlurmctldHost=$CTL_HOST($CTL_ADDR)
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
# cred_expire: also how long a requeued job waits before it may start again (default 120 s).
AuthInfo=socket=$DIR/munge/munge.socket.2,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# A submitted batch job is scheduled at once (not up to 3 s later), one that becomes eligible later (a
# requeued one) at the periodic pass: every 2 s, not 60.
SchedulerParameters=sched_interval=2,batch_sched_delay=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
PropagateResourceLimits=NONE
SlurmdParameters=config_overrides
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=300
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=60
Waittime=0
JobRequeue=1
MailProg=/bin/true
EOF
  if ((NETNS)); then
    for ((i = 0; i < N; i++)); do
      echo "NodeName=node$i NodeAddr=$SUBNET.$((i + 1)) CPUs=$CPUS State=UNKNOWN" >>"$CONF"
    done
  else
    echo "NodeName=$CTL_HOST NodeAddr=127.0.0.1 CPUs=$((N * CPUS)) State=UNKNOWN" >>"$CONF"
  fi
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
}

start_munge() {
  local m=$DIR/munge t
  mkdir -p "$m"
  chmod 0755 "$m" # munged wants its socket's folder searchable by all; the key itself is 0600
  (umask 077 && dd if=/dev/urandom of="$m/munge.key" bs=1024 count=1 status=none)
  munged --key-file="$m/munge.key" --socket="$m/munge.socket.2" --pid-file="$m/munged.pid" \
    --log-file="$LOGS/munged.log" --seed-file="$m/munged.seed" --num-threads=2 --force \
    >>"$LOGS/munged.out" 2>&1 || fail "munged failed to start"
  for ((t = 0; t < 50; t++)); do
    if munge -n -S "$m/munge.socket.2" 2>/dev/null | unmunge -S "$m/munge.socket.2" >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.1
  done
  fail "munged does not answer on $m/munge.socket.2"
}

idle_nodes() { sinfo -h -o '%D %T' -t idle 2>/dev/null | awk '{s += $1} END {print s + 0}'; }

start_cluster() {
  local t0 i ns up want nodes d
  t0=$(date +%s.%N)
  check_tools
  CPUS=${CPUS:-$(nproc)}
  CTL_HOST=$(hostname -s)
  want="N=$N RATE=$RATE CPUS=$CPUS MODE=$( ((NETNS)) && echo netns || echo single)"
  want="$want SCRIPT=$(md5sum <"$0" | cut -c1-12)"
  nodes=$( ((NETNS)) && echo "$N" || echo 1)
  if [[ -f $DIR/cluster.env && $(cat "$DIR/cluster.env") == "$want" ]] \
    && [[ -n $(pid_of "$DIR/run/slurmctld.pid" slurmctld) && $(idle_nodes) == "$nodes" ]]; then
    echo "slurm_cluster: already running ($want) under $DIR"
    echo "slurm_cluster: export SLURM_CONF=$CONF   # logs: $LOGS"
    return 0
  fi
  if [[ -f $OWNER ]] && d=$(cat "$OWNER") && [[ $d != "$DIR" && -n $(pid_of "$d/run/slurmctld.pid" slurmctld) ]]; then
    unavailable "a cluster from $d is running; stop it first: $0 stop --dir $d"
  fi
  stop_cluster
  mkdir -p "$DIR"
  rm -rf "$DIR/ctld" "$DIR/spool" "$DIR/run" "$LOGS" "$DIR/munge" "$CONF" "$DIR/cluster.env" "$DIR/hosts"
  mkdir -p "$DIR/ctld" "$DIR/spool" "$DIR/run" "$LOGS"
  chmod 0755 "$DIR"
  echo "$DIR" >"$OWNER"
  if ((NETNS)); then
    CTL_ADDR=$SUBNET.254
    make_network
  else
    CTL_ADDR=127.0.0.1
  fi
  write_conf
  start_munge
  slurmctld -f "$CONF" -i >>"$LOGS/slurmctld.out" 2>&1 || fail "slurmctld failed to start"
  if ((NETNS)); then
    for ((i = 0; i < N; i++)); do
      ns=$(ns_name "$i")
      mkdir -p "$DIR/spool/node$i" # slurmd makes it, but only after it has looked for its socket there
      # nsenter --net, not `ip netns exec`: that one mounts a fresh /sys, which hides /sys/fs/cgroup,
      # without which slurmd 22.05 does not start (it initializes its cgroup plugin whatever the
      # ProctrackType). The mount namespace gets the nodes' /etc/hosts; the UTS namespace the node's name.
      nsenter --net="/run/netns/$ns" unshare --mount --uts --propagation private \
        sh -c "mount --bind '$DIR/hosts' /etc/hosts && hostname node$i && exec slurmd -f '$CONF'" \
        >>"$LOGS/slurmd-node$i.out" 2>&1 || fail "slurmd on node$i failed to start"
    done
  else
    mkdir -p "$DIR/spool/$CTL_HOST"
    slurmd -f "$CONF" >>"$LOGS/slurmd-$CTL_HOST.out" 2>&1 || fail "slurmd failed to start"
  fi
  echo "$want" >"$DIR/cluster.env"
  for ((i = 0; i < 300; i++)); do
    up=$(idle_nodes)
    [[ $up == "$nodes" ]] && break
    sleep 0.1
  done
  [[ $up == "$nodes" ]] || fail "$up of $nodes node(s) idle after 30 s: $(sinfo -h -N -o '%N %T %E' 2>&1 | tr '\n' ';')"
  local took
  took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  if ((NETNS)); then
    echo "slurm_cluster: $N node(s) up in $took s: node0..node$((N - 1)) at $SUBNET.1..$SUBNET.$N" \
      "${RATE:+($RATE Mbit/s each) }controller $CTL_HOST at $CTL_ADDR"
  else
    echo "slurm_cluster: FALLBACK: one node ($CTL_HOST at 127.0.0.1, $((N * CPUS)) CPUs) up in $took s;" \
      "run N tasks on it (srun -n $N), not N nodes"
  fi
  echo "slurm_cluster: export SLURM_CONF=$CONF   # logs: $LOGS"
}

case $cmd in
  start) start_cluster ;;
  stop)
    LEFT_ALONE=0
    stop_cluster
    if ((LEFT_ALONE)); then
      :
    elif ((CLEAN)); then
      echo "slurm_cluster: stopped; removed $DIR"
    else
      echo "slurm_cluster: stopped; logs kept in $LOGS"
    fi
    ;;
  status)
    [[ -f $CONF ]] || die "no cluster under $DIR (no $CONF)"
    sinfo -N -o '%N %T %C %E'
    squeue
    ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) usage ;;
esac
