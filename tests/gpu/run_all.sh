#!/usr/bin/env bash
# Every GPU test of the project in one go, each script's whole output in a
# log file of its own, and a summary line per script: what one call on a
# GPU machine should run. Scripts that have no GPU to run on report
# SKIPPED (exit 77), as under ctest.
#
# Usage: run_all.sh BINDIR [LOGDIR] [SCRIPT...]
#        BINDIR: dfccld, the tools and the GPU test programs (a CUDA build's
#        bin/); LOGDIR: where the logs go (default: a new folder in /tmp);
#        SCRIPT: the scripts to run, by name (default: all of them, the
#        short ones first).
# Environment: DFCCL_GPU_QUICK=1 trims cuda_engine's sweeps and
#        cuda_fault_suite's trials; DFCCLD=PATH runs that dfccld instead of
#        BINDIR's (two builds of the daemon under the same tests); every
#        script runs with NCCL_NVLS_ENABLE=0. A script that fails has the
#        last RUN_ALL_TAIL lines of its log (default 40) printed after its
#        summary line.
set -uo pipefail
bin=${1:?usage: run_all.sh BINDIR [LOGDIR] [SCRIPT...]}
logdir=${2:-$(mktemp -d /tmp/dfccl-gpu-logs-XXXXXX)}
shift $(($# < 2 ? $# : 2))
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
scripts=("$@")
[ ${#scripts[@]} -gt 0 ] || scripts=(gpu_smoke topo_detect cuda_faults cuda_fault_suite cuda_engine)
export NCCL_NVLS_ENABLE=0
mkdir -p "$logdir"
failed=0
for s in "${scripts[@]}"; do
	[ -f "$here/$s.sh" ] || { echo "$s: no such GPU test script in $here"; failed=1; continue; }
	start=$(date +%s)
	rc=0
	bash "$here/$s.sh" "$bin" >"$logdir/$s.log" 2>&1 || rc=$?
	secs=$(($(date +%s) - start))
	case $rc in
	0) echo "$s: PASS (${secs} s)" ;;
	77) echo "$s: SKIPPED (${secs} s): $(grep -m1 SKIPPED "$logdir/$s.log")" ;;
	*)
		echo "$s: FAIL, exit $rc (${secs} s): $(grep -m1 'FAIL' "$logdir/$s.log")"
		# The log's end here too: a GPU machine may keep nothing else.
		tail -n "${RUN_ALL_TAIL:-40}" "$logdir/$s.log" | sed "s/^/   $s: /"
		failed=1
		;;
	esac
done
echo "logs: $logdir"
exit $failed
