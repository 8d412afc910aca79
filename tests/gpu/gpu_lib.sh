# shellcheck shell=bash
# What the GPU test scripts share; sourced, after the script has set `bin`
# (the folder of dfccld, dfcclctl, the tools and the test programs) and,
# where it has one, `seed`:
#   gpu_need_gpu NAME      exit 77 (ctest: skipped) with a message where no
#                          NVIDIA GPU is
#   gpu_need_bins PROG...  fail where a binary is missing
#   gpu_setup PREFIX       ngpu, a private folder $tmp and socket $sock; at
#                          exit the daemon, background jobs (bg_pids) and
#                          the MPS daemon are stopped and $tmp removed
#   fail MSG               print MSG, the daemon's log (and the MPS logs),
#                          exit 1
#   ctl ARGS / json EXPR   dfcclctl on $sock; a Python expression over the
#                          JSON document d on stdin
#   step NAME LIMIT CMD... run CMD for at most LIMIT seconds; anything but
#                          success fails
#   start_daemon [ARGS]    dfccld --engine cuda on $sock with ARGS, waiting
#                          until every GPU's worker is up ($tmp/status.json)
#   stop_daemon            SIGTERM, and it must exit 0 within 60 s
#   mps_usable / mps_start / mps_stop
#                          a private MPS control daemon (root and
#                          nvidia-cuda-mps-control needed); what starts
#                          after mps_start uses it, through the exported
#                          CUDA_MPS_PIPE_DIRECTORY
#   parts_from VAR DEFAULT KNOWN...
#                          the parts the environment variable VAR names
#                          (comma- or space-separated; DEFAULT where it is
#                          unset), each one of KNOWN, into $parts (comma-
#                          separated); part_on NAME: whether NAME is one
# DFCCLD=PATH in the environment makes the scripts start that dfccld instead
# of $bin/dfccld (`dfccld_bin`), so that two builds of the daemon can be
# compared under the same tests and tools.
# NVLink multicast must stay off on shared GPU machines, in everything
# started here.
export NCCL_NVLS_ENABLE=0
dfccld_bin=${DFCCLD:-${bin:?}/dfccld}

gpu_need_gpu() {
	if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
		echo "SKIPPED: no NVIDIA GPU on this machine ($1 runs on GPU machines)"
		exit 77
	fi
}

gpu_need_bins() {
	local p
	for p in "$@"; do
		[ -x "${bin:?}/$p" ] || { echo "FAIL: $bin/$p is missing (built without a CUDA toolkit?)"; exit 1; }
	done
}

gpu_setup() {
	ngpu=$(nvidia-smi -L | wc -l)
	tmp=$(mktemp -d "/tmp/$1-XXXXXX")
	sock=$tmp/dfccld.sock
	daemon_pid=
	mps_dir=
	bg_pids=()
	trap gpu_cleanup EXIT
}

gpu_cleanup() {
	local p
	for p in "${bg_pids[@]}"; do
		kill -KILL "$p" 2>/dev/null || true
	done
	[ -n "$daemon_pid" ] && kill -TERM "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true
	if [ -n "$mps_dir" ]; then
		echo quit | CUDA_MPS_PIPE_DIRECTORY=$mps_dir timeout 30 nvidia-cuda-mps-control 2>/dev/null || true
	fi
	rm -rf "$tmp"
}

fail() {
	echo "FAIL: $*${seed:+ (seed $seed)}"
	[ -f "$tmp/dfccld.log" ] && { echo "---- dfccld log ----"; cat "$tmp/dfccld.log"; }
	local f
	for f in "$tmp"/mps-log/*.log; do
		[ -f "$f" ] && { echo "---- $(basename "$f") (MPS) ----"; tail -50 "$f"; }
	done
	exit 1
}

ctl() { timeout 30 "$bin/dfcclctl" --socket "$sock" "$@"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

# gpu_mem_used_mib LIST: the memory in use on the GPUs of the comma-separated
# list of indices, summed, in MiB (nvidia-smi's count: every process's).
gpu_mem_used_mib() {
	nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$1" | awk '{s += $1} END {print s}'
}

step() {
	local name=$1 limit=$2 rc=0 start=$SECONDS
	shift 2
	echo "== $name"
	timeout -k 10 "$limit" "$@" || rc=$?
	[ "$rc" = 124 ] || [ "$rc" = 137 ] && fail "$name: still running after $limit s"
	[ "$rc" = 0 ] || fail "$name: exit status $rc"
	echo "   ($((SECONDS - start)) s)"
}

start_daemon() {
	"$dfccld_bin" --socket "$sock" --engine cuda --config /dev/null --log-target stderr --log-level info \
		"$@" 2>>"$tmp/dfccld.log" &
	daemon_pid=$!
	local _
	for _ in $(seq 1 300); do
		if ctl --json status >"$tmp/status.json" 2>/dev/null &&
			[ "$(json "sum(1 for x in d['devices'] if x['worker_up'])" <"$tmp/status.json")" = "$ngpu" ]; then
			return 0
		fi
		kill -0 "$daemon_pid" 2>/dev/null || fail "dfccld --engine cuda exited at start"
		sleep 0.1
	done
	fail "dfccld did not bring up $ngpu GPU workers in 30 s"
}

stop_daemon() {
	local rc=0
	kill -TERM "$daemon_pid"
	timeout 60 tail --pid="$daemon_pid" -f /dev/null || fail "dfccld did not stop within 60 s of SIGTERM"
	wait "$daemon_pid" || rc=$?
	daemon_pid=
	[ "$rc" = 0 ] || fail "dfccld exited with $rc on SIGTERM"
}

parts_from() {
	local var=$1 dflt=$2 p list
	shift 2
	local known="$*"
	IFS=', ' read -ra list <<<"${!var:-$dflt}"
	[ ${#list[@]} -gt 0 ] || fail "$var names no part (${known// /, })"
	for p in "${list[@]}"; do
		[[ " $known " == *" $p "* ]] || fail "$var: unknown part '$p' (${known// /, })"
	done
	parts=$(IFS=,; echo "${list[*]}")
}
part_on() { [[ ",$parts," == *",$1,"* ]]; }

mps_usable() {
	command -v nvidia-cuda-mps-control >/dev/null 2>&1 && [ "$(id -u)" = 0 ]
}

mps_start() {
	mps_dir=$tmp/mps
	mkdir -p "$mps_dir" "$tmp/mps-log"
	export CUDA_MPS_PIPE_DIRECTORY=$mps_dir CUDA_MPS_LOG_DIRECTORY=$tmp/mps-log
	timeout 30 nvidia-cuda-mps-control -d || fail "cannot start the MPS control daemon"
}

mps_stop() {
	echo quit | timeout 30 nvidia-cuda-mps-control || fail "the MPS control daemon did not quit"
	mps_dir=
	unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
