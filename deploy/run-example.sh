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
# `dfccl-perf allreduce -b 8 -e 1M -f 4 --nranks 4`. A tool that
# exits 3 is not implemented in this release; the script says so and, if
# dfcclctl has a ping subcommand, pings every device through its worker
# instead.
# Environment: DFCCL_JOBS sets build parallelism (default 2).
set -euo pipefail

DFCCL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source-path=SCRIPTDIR
# shellcheck source=setup-lib.sh
. "$DFCCL_ROOT/deploy/setup-lib.sh"
cd "$DFCCL_ROOT"

NOT_IMPLEMENTED=3
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

# Runs one workload tool; returns 0 when it ran, 1 when this release does
# not implement it yet; any other failure ends the script.
run_tool() {
	local rc=0
	echo "\$ ${*/#"$bin/"/}"
	timeout 300 "$@" || rc=$?
	if [ "$rc" -eq "$NOT_IMPLEMENTED" ]; then
		echo "${1##*/}: not implemented in this release (exit $NOT_IMPLEMENTED)"
		return 1
	fi
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
if run_tool "$bin/dfccl-chaos" --nranks 4 --comms 8 --iters 50 &&
	run_tool "$bin/dfccl-perf" allreduce -b 8 -e 1M -f 4 --nranks 4; then
	:
elif "$bin/dfcclctl" --help 2>&1 | grep -Eq '^[[:space:]]+ping([[:space:]]|$)'; then
	# One ping per device: each goes through the supervisor to that
	# device's worker and back.
	ndev=4
	if command -v nvidia-smi >/dev/null 2>&1; then
		ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
		[ "$ngpu" -gt 0 ] && ndev=$ngpu
	fi
	for ((d = 0; d < ndev; d++)); do
		echo "\$ dfcclctl ping --device $d"
		ctl ping --device "$d" || {
			show_log
			die "dfcclctl ping --device $d failed"
		}
	done
else
	echo "dfcclctl has no ping subcommand in this release: the workload is 'dfcclctl status' below"
fi

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
