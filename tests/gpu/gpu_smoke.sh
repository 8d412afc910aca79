#!/usr/bin/env bash
# GPU test of dfccld's device handling: on a machine with NVIDIA GPUs, the
# daemon probes the GPUs without touching them itself, runs one worker per
# GPU that owns its CUDA context, reports each GPU's PCI bus id and the MPS
# state, serves every GPU's queue pair, and replaces a worker SIGKILLed
# while the other GPUs' workers keep serving, and runs host-buffer
# collectives through those workers. Where no GPU exists it says so
# and exits 77 (ctest: skipped).
#
# Usage: gpu_smoke.sh BINDIR   (the folder holding dfccld and dfcclctl)
set -euo pipefail
bin=${1:?usage: gpu_smoke.sh BINDIR}
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
probe=$("$bin/dfccld" --probe-devices)
echo "$probe"
[ "$(echo "$probe" | head -1 | awk '{print $2}')" = "$ngpu" ] || fail "the probe found a different number of GPUs"

start_daemon() {
	"$bin/dfccld" --socket "$sock" --engine auto --config /dev/null --log-target stderr \
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

echo "== SIGKILL the worker of GPU 0; the others keep serving"
ctl --json status >"$tmp/status.json"
victim=$(json "d['devices'][0]['worker_pid']" <"$tmp/status.json")
others=$(json "' '.join(str(x['worker_pid']) for x in d['devices'][1:])" <"$tmp/status.json")
kill -9 "$victim"
if [ "$ngpu" -gt 1 ]; then
	for d in $(seq 1 $((ngpu - 1))); do ctl ping --device "$d" --count 50 | tail -1 || fail "ping on GPU $d after the kill"; done
fi
for _ in $(seq 1 100); do
	ctl --json status >"$tmp/status.json"
	[ "$(json "d['devices'][0]['worker_up'] and d['devices'][0]['worker_restarts'] == 1" <"$tmp/status.json")" = "True" ] && break
	sleep 0.1
done
[ "$(json "d['devices'][0]['worker_restarts']" <"$tmp/status.json")" = "1" ] || fail "worker of GPU 0 was not restarted"
[ "$(json "' '.join(str(x['worker_pid']) for x in d['devices'][1:])" <"$tmp/status.json")" = "$others" ] ||
	fail "the workers of other GPUs changed"
ctl ping --device 0 --count 50 | tail -1 || fail "ping on GPU 0 after its restart"

if [ -x "$bin/dfccl-chaos" ]; then
	echo "== collectives on host buffers through the GPUs' workers (2 ranks per GPU)"
	"$bin/dfccl-chaos" --socket "$sock" --nranks $((2 * ngpu)) --comms 4 --iters 20 --min-bytes 64 \
		--max-bytes 256K --seed 11 | tail -3 || fail "dfccl-chaos on the GPU workers"
fi
stop_daemon

if command -v nvidia-cuda-mps-control >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
	echo "== under MPS: status says so"
	mps_dir=$tmp/mps
	mkdir -p "$mps_dir" "$tmp/mps-log"
	CUDA_MPS_PIPE_DIRECTORY=$mps_dir CUDA_MPS_LOG_DIRECTORY=$tmp/mps-log nvidia-cuda-mps-control -d
	export CUDA_MPS_PIPE_DIRECTORY=$mps_dir
	start_daemon
	[ "$(json "d['mps_active']" <"$tmp/status.json")" = "True" ] || fail "MPS is running but not reported"
	ctl status | grep -i mps
	ctl ping --device 0 --count 50 | tail -1 || fail "ping under MPS"
	stop_daemon
	echo quit | nvidia-cuda-mps-control
	mps_dir=
	unset CUDA_MPS_PIPE_DIRECTORY
else
	echo "== MPS part skipped (needs nvidia-cuda-mps-control and root)"
fi
echo "PASS: gpu_smoke on $ngpu GPU(s)"
