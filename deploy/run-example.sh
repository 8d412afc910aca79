#!/usr/bin/env bash
# Builds dfccl, starts the daemon on a private socket, runs the example
# workload against it, shows what the daemon saw, and stops it.
#
# For a fresh Debian 12 machine, run from the repository root as root (or
# with sudo available for the package stage). With GPUs the daemon's cuda
# engine serves them; without, the host engine emulates 4 devices.
#
# The workload: `dfccl-chaos --nranks 4 --comms 8 --iters 50` (4 client
# processes on 8 communicators, collectives in conflicting orders) and
# `dfccl-perf allreduce -b 8 -e 1M -f 4 --nranks 4`, then a NOP round
# trip through every device's queue pair; `dfcclctl stats` at the end shows
# the preemptions that let the disordered collectives complete.
# Environment: DFCCL_JOBS sets build parallelism (default 2).
set -euo pipefail

DFCCL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source-path=SCRIPTDIR
# shellcheck source=setup-lib.sh
. "$DFCCL_ROOT/deploy/setup-lib.sh"
cd "$DFCCL_ROOT"

bin=$DFCCL_ROOT/build/bin
tmp=$(mktemp -d)
sock=$tmp/dfccld.sock
log=$tmp/dfccld.log
daemon_pid=

# True while process $1 exists and has not exited (a child that exited but
# was not waited for yet still answers kill -0).
running() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) }
	[ "${stat%% *}" != Z ]
}

# On any exit: a daemon still running (the script failed) is killed with
# its process group, which holds its workers.
cleanup() {
	if [ -n "$daemon_pid" ] && running "$daemon_pid"; then
		kill -KILL -- "-$daemon_pid" 2>/dev/null || kill -KILL "$daemon_pid" 2>/dev/null || true
		wait "$daemon_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

show_log() {
	banner "dfccld log"
	cat "$log" 2>/dev/null || true
}

ctl() {
	"$bin/dfcclctl" --socket "$sock" "$@"
}

# Runs one workload tool; any failure ends the script.
run_tool() {
	local rc=0
	echo "\$ ${*/#"$bin/"/}"
	timeout 300 "$@" || rc=$?
	if [ "$rc" -ne 0 ]; then
		show_log
		die "${1##*/} failed (exit $rc)"
	fi
}

banner "packages"
ensure_packages

banner "build (build/, Release)"
build_tree build -DCMAKE_BUILD_TYPE=Release -DDFCCL_BUILD_TESTS=OFF
for t in dfccld dfcclctl dfccl-perf dfccl-chaos; do
	[ -x "$bin/$t" ] || die "the build did not produce $bin/$t"
done

banner "start dfccld"
# --config /dev/null: the example does not depend on this machine's
# /etc/dfccl/dfccld.conf. --host-devices applies only when the engine falls
# back to the host engine (no GPU). setsid gives the daemon and its workers
# a process group of their own.
export DFCCL_SOCKET=$sock
setsid "$bin/dfccld" --config /dev/null --socket "$sock" --engine auto --host-devices 4 \
	--log-target stderr >"$log" 2>&1 &
daemon_pid=$!
echo "dfccld pid $daemon_pid, socket $sock"
ready=0
for _ in $(seq 1 600); do
	if ! running "$daemon_pid"; then
		show_log
		die "dfccld exited during startup"
	fi
	if [ -S "$sock" ] && ctl status >/dev/null 2>&1; then
		ready=1
		break
	fi
	sleep 0.1
done
if [ "$ready" -ne 1 ]; then
	show_log
	die "dfccld did not answer 'dfcclctl status' within 60 s"
fi
echo "dfccld is ready"

banner "workload"
# Deadlock stress: 4 ranks, 8 communicators, every rank issuing its
# collectives in its own random order; then a bandwidth sweep; then one NOP
# round trip through each device's queue pair.
run_tool "$bin/dfccl-chaos" --nranks 4 --comms 8 --iters 50
run_tool "$bin/dfccl-perf" allreduce -b 8 -e 1M -f 4 --nranks 4
ndev=$(ctl --json status | sed -n 's/.*"index": \([0-9]*\).*/\1/p' | wc -l)
for ((d = 0; d < ndev; d++)); do
	run_tool "$bin/dfcclctl" --socket "$sock" ping --device "$d" --count 100
done

banner "dfcclctl status"
ctl status
banner "dfcclctl stats"
ctl stats

banner "stop dfccld"
kill -TERM "$daemon_pid"
rc=0
for _ in $(seq 1 300); do
	running "$daemon_pid" || break
	sleep 0.1
done
if running "$daemon_pid"; then
	show_log
	die "dfccld did not exit within 30 s of SIGTERM"
fi
wait "$daemon_pid" || rc=$?
daemon_pid=
show_log
[ "$rc" -eq 0 ] || die "dfccld exited with status $rc after SIGTERM"
banner "done: dfccld stopped cleanly"
