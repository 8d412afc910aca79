#!/usr/bin/env bash
# GPU test of dfccld's device handling: on a machine with NVIDIA GPUs, the
# daemon probes the GPUs without touching them itself, runs one worker per
# GPU that owns its CUDA context, reports each GPU's PCI bus id and the MPS
# state, serves every GPU's queue pair, and replaces a worker SIGKILLed
# while the other GPUs' workers keep serving (and, where the CUDA test
# programs are built, one killed while a stream waits on its collective:
# the stream goes on with the failure reported), and runs host-buffer
# collectives through those workers. As root with MPS available it also
# shows the workers following the jobs' uids under MPS (worker-user auto):
# a job of uid 65534 gets workers of that uid, root is refused meanwhile
# with a message naming it, and is served once that job has ended. Where no
# GPU exists it says so and exits 77 (ctest: skipped).
#
# Usage: gpu_smoke.sh BINDIR   (the folder holding dfccld and dfcclctl)
set -euo pipefail
bin=${1:?usage: gpu_smoke.sh BINDIR}
dfccld_bin=${DFCCLD:-$bin/dfccld} # as in gpu_lib.sh
export NCCL_NVLS_ENABLE=0

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	echo "SKIPPED: no NVIDIA GPU on this machine (gpu_smoke runs on GPU machines)"
	exit 77
fi

ngpu=$(nvidia-smi -L | wc -l)
tmp=$(mktemp -d /tmp/dfccl-gpu-XXXXXX)
sock=$tmp/dfccld.sock
daemon_pid=
mps_dir=
cleanup() {
	[ -n "$daemon_pid" ] && kill -TERM "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true
	if [ -n "$mps_dir" ]; then
		echo quit | CUDA_MPS_PIPE_DIRECTORY=$mps_dir nvidia-cuda-mps-control 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*"
	[ -f "$tmp/dfccld.log" ] && { echo "---- dfccld log ----"; cat "$tmp/dfccld.log"; }
	exit 1
}
ctl() { "$bin/dfcclctl" --socket "$sock" "$@"; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

echo "== probe: $ngpu GPU(s) per nvidia-smi"
probe=$("$dfccld_bin" --probe-devices)
echo "$probe"
[ "$(echo "$probe" | head -1 | awk '{print $2}')" = "$ngpu" ] || fail "the probe found a different number of GPUs"

start_daemon() {
	"$dfccld_bin" --socket "$sock" --engine auto --config /dev/null --log-target stderr \
		--log-level info 2>"$tmp/dfccld.log" &
	daemon_pid=$!
	for _ in $(seq 1 300); do
		if ctl --json status >"$tmp/status.json" 2>/dev/null &&
			[ "$(json "sum(1 for x in d['devices'] if x['worker_up'])" <"$tmp/status.json")" = "$ngpu" ]; then
			return 0
		fi
		sleep 0.1
	done
	fail "dfccld did not bring up $ngpu GPU workers in 30 s"
}

stop_daemon() {
	kill -TERM "$daemon_pid"
	local rc=0
	wait "$daemon_pid" || rc=$?
	daemon_pid=
	[ "$rc" = 0 ] || fail "dfccld exited with $rc on SIGTERM"
}

echo "== start: engine auto"
start_daemon
ctl status
[ "$(json "d['engine']" <"$tmp/status.json")" = "cuda" ] || fail "engine auto did not pick cuda"
[ "$(json "d['mps_active']" <"$tmp/status.json")" = "False" ] || fail "MPS reported active without an MPS daemon"
[ "$(json "d['worker_user'] == 'daemon' and all(x['worker_uid'] == $(id -u) and not x['worker_parked'] \
	for x in d['devices'])" <"$tmp/status.json")" = "True" ] ||
	fail "without MPS every worker must run as dfccld's uid with its GPU open"
# Every GPU's PCI bus id as nvidia-smi knows it (compared without the PCI domain, which nvidia-smi pads to 8 digits).
smi_ids=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | tr 'A-Z' 'a-z' | sed 's/^[0-9a-f]*://' | sort)
our_ids=$(json "'\n'.join(x['pci_bus_id'] for x in d['devices'])" <"$tmp/status.json" | tr 'A-Z' 'a-z' | sed 's/^[0-9a-f]*://' | sort)
echo "nvidia-smi: $(echo $smi_ids)  dfccld: $(echo $our_ids)"
[ "$smi_ids" = "$our_ids" ] || fail "PCI bus ids differ from nvidia-smi"
# The supervisor holds no GPU: only the workers appear as compute processes
# once they made their contexts.
if nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qx "$daemon_pid"; then
	fail "the supervisor opened a GPU"
fi

echo "== every GPU's queue pair serves NOP round trips"
for d in $(seq 0 $((ngpu - 1))); do
	ctl ping --device "$d" --count 200 | tail -1 || fail "ping on GPU $d"
done

# Waits up to 10 s for GPU 0's worker to be up after its $1-th restart
# ($tmp/status.json: the last status).
wait_restarts() {
	for _ in $(seq 1 100); do
		ctl --json status >"$tmp/status.json"
		[ "$(json "d['devices'][0]['worker_up'] and d['devices'][0]['worker_restarts'] == $1" <"$tmp/status.json")" = "True" ] &&
			return 0
		sleep 0.1
	done
	fail "worker of GPU 0 was not restarted (restart $1)"
}

echo "== SIGKILL the worker of GPU 0; the others keep serving"
ctl --json status >"$tmp/status.json"
victim=$(json "d['devices'][0]['worker_pid']" <"$tmp/status.json")
others=$(json "' '.join(str(x['worker_pid']) for x in d['devices'][1:])" <"$tmp/status.json")
kill -9 "$victim"
if [ "$ngpu" -gt 1 ]; then
	for d in $(seq 1 $((ngpu - 1))); do ctl ping --device "$d" --count 50 | tail -1 || fail "ping on GPU $d after the kill"; done
fi
wait_restarts 1
[ "$(json "' '.join(str(x['worker_pid']) for x in d['devices'][1:])" <"$tmp/status.json")" = "$others" ] ||
	fail "the workers of other GPUs changed"
ctl ping --device 0 --count 50 | tail -1 || fail "ping on GPU 0 after its restart"

if [ -x "$bin/test_cuda_stream_death" ]; then
	restarts=1
	for wait in device host; do
		echo "== a stream waiting on a collective of GPU 0 ($wait completion words) goes on when that GPU's worker dies"
		ctl --json status >"$tmp/status.json"
		victim=$(json "d['devices'][0]['worker_pid']" <"$tmp/status.json")
		timeout -k 10 120 "$bin/test_cuda_stream_death" --socket "$sock" --kill-pid "$victim" --max-latency 5 \
			--wait "$wait" || fail "test_cuda_stream_death --wait $wait"
		restarts=$((restarts + 1))
		wait_restarts "$restarts"
		ctl ping --device 0 --count 50 | tail -1 || fail "ping on GPU 0 after restart $restarts"
	done
fi

if [ -x "$bin/dfccl-chaos" ]; then
	echo "== collectives on host buffers through the GPUs' workers (2 ranks per GPU)"
	"$bin/dfccl-chaos" --socket "$sock" --nranks $((2 * ngpu)) --comms 4 --iters 20 --min-bytes 64 \
		--max-bytes 256K --seed 11 | tail -3 || fail "dfccl-chaos on the GPU workers"
fi
stop_daemon

# Waits until device $1's worker is up as uid $2, parked ($3: True/False);
# prints its pid.
wait_worker() {
	local cond="x['worker_up'] and x['worker_uid'] == $2 and x['worker_parked'] == $3"
	for _ in $(seq 1 600); do
		ctl --json status >"$tmp/status.json"
		if [ "$(json "(lambda x: $cond)(d['devices'][$1])" <"$tmp/status.json")" = "True" ]; then
			json "d['devices'][$1]['worker_pid']" <"$tmp/status.json"
			return 0
		fi
		sleep 0.1
	done
	ctl status
	fail "device $1: no worker of uid $2 (parked $3) within 60 s"
}

# Under MPS, as root: one user's job at a time, each served by workers of
# its own uid (MPS serves one uid at a time; a client of another waits in
# CUDA initialisation, so dfccld refuses it instead).
mps_two_users() {
	local nobody=65534
	local as_nobody="setpriv --reuid=$nobody --regid=$nobody --clear-groups"
	if ! $as_nobody test -x "$bin/dfccl-chaos"; then
		echo "== under MPS, two users: SKIPPED ($bin/dfccl-chaos is not reachable by uid $nobody; build in a folder others can read)"
		return 0
	fi
	echo "== under MPS, two users: a job of uid $nobody gets workers of its uid"
	wait_worker 0 0 True >/dev/null
	# In a process group of its own, to stop the job and its ranks at once.
	$as_nobody setsid "$bin/dfccl-chaos" --socket "$sock" --nranks 2 --comms 2 --iters 100000000 --min-bytes 64 \
		--max-bytes 4K --seed 5 >"$tmp/chaos.log" 2>&1 &
	local chaos=$!
	local pid
	pid=$(wait_worker 0 $nobody False)
	grep -E '^(Uid|Gid|Groups):' "/proc/$pid/status"
	[ "$(awk '/^Uid:/ {print $2, $3, $4, $5}' "/proc/$pid/status")" = "$nobody $nobody $nobody $nobody" ] ||
		fail "worker $pid does not run as uid $nobody"
	ctl status | tail -n +10
	echo "== under MPS, two users: root is refused at once, naming uid $nobody"
	local out rc=0
	out=$(timeout 20 "$bin/dfcclctl" --socket "$sock" ping --device 0 --count 5 2>&1) || rc=$?
	echo "$out"
	[ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "root's ping was not refused (status $rc)"
	echo "$out" | grep -q "uid $nobody (nobody)" || fail "the refusal does not name the holder"
	kill -0 "$chaos" 2>/dev/null || { cat "$tmp/chaos.log"; fail "uid $nobody's job ended early"; }
	kill -TERM -- "-$chaos"
	wait "$chaos" || true
	echo "== under MPS, two users: once it has left, the GPU goes back to dfccld's uid and root is served"
	wait_worker 0 0 True >/dev/null
	ctl ping --device 0 --count 50 | tail -1 || fail "ping as root after uid $nobody's job"
}

if command -v nvidia-cuda-mps-control >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
	echo "== under MPS: status says so"
	chmod 755 "$tmp" # uid 65534's workers reach the MPS pipes below it
	mps_dir=$tmp/mps
	mkdir -p "$mps_dir" "$tmp/mps-log"
	CUDA_MPS_PIPE_DIRECTORY=$mps_dir CUDA_MPS_LOG_DIRECTORY=$tmp/mps-log nvidia-cuda-mps-control -d
	export CUDA_MPS_PIPE_DIRECTORY=$mps_dir
	start_daemon
	[ "$(json "d['mps_active']" <"$tmp/status.json")" = "True" ] || fail "MPS is running but not reported"
	ctl status | grep -i -e mps -e 'worker uids'
	[ "$(json "d['worker_user']" <"$tmp/status.json")" = "job" ] || fail "under MPS workers must follow the jobs' uids"
	ctl ping --device 0 --count 50 | tail -1 || fail "ping under MPS"
	mps_two_users
	stop_daemon
	echo quit | nvidia-cuda-mps-control
	mps_dir=
	unset CUDA_MPS_PIPE_DIRECTORY
else
	echo "== MPS part skipped (needs nvidia-cuda-mps-control and root)"
fi
echo "PASS: gpu_smoke on $ngpu GPU(s)"
