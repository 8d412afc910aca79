# shellcheck shell=bash
# What the GPU benchmark scripts of tests/perf share, sourced with the
# script's own arguments: BINDIR [OUTDIR] into `bin` (absolute) and
# `outdir` (empty: the script picks one), then tests/gpu/gpu_lib.sh.
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 BINDIR [OUTDIR]" >&2
	exit 2
fi
bin=$(cd "$1" && pwd) || exit 2
# shellcheck disable=SC2034 # used by the scripts that source this
outdir=${2:-}
# shellcheck source=../gpu/gpu_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../gpu/gpu_lib.sh"
perf_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# prims: dk_prims's table of what the daemon kernel's memory operations cost
# on GPU 0 (with GPU 1 as its peer where there are two) into
# $outdir/prims.txt, taken before any daemon or MPS runs; prims_print shows
# it. A dk_prims that is missing or fails is reported, and the script goes
# on.
prims() {
	local peer=()
	[ "$ngpu" -ge 2 ] && peer=(--peer 1)
	if [ ! -x "$bin/dk_prims" ]; then
		echo "== dk_prims is not in $bin: the table of the kernel's memory operations is left out"
		return 0
	fi
	echo "== dk_prims ${peer[*]}"
	timeout -k 5 120 "$bin/dk_prims" "${peer[@]}" >"$outdir/prims.txt" 2>&1 ||
		echo "   failed: $(tail -n 1 "$outdir/prims.txt")"
}
prims_print() {
	[ -f "$outdir/prims.txt" ] || return 0
	echo
	cat "$outdir/prims.txt"
}

# queue_floor GPU...: the daemon's queue alone on each GPU (dfccl-perf
# --queue-only: NOP entries submitted and waited for one at a time, the
# floor under every callback-form collective, and stream-ordered back to
# back, the floor under the stream form) against the running daemon, into
# $outdir/queue.txt; queue_print shows it. A failure is reported and the
# script goes on.
queue_floor() {
	local g mode log rc
	: >"$outdir/queue.txt"
	for g in "$@"; do
		for mode in callback stream; do
			log=$outdir/queue_${mode}_$g.log
			rc=0
			timeout -k 5 120 "$bin/dfccl-perf" --queue-only --mode "$mode" -n 2000 -w 100 --devices "$g" \
				--socket "$sock" >"$log" 2>&1 || rc=$?
			if [ "$rc" = 0 ]; then
				cat "$log" >>"$outdir/queue.txt"
			else
				echo "== dfccl-perf --queue-only --mode $mode on device $g failed (exit $rc): $(tail -n 1 "$log")"
			fi
		done
	done
}
queue_print() {
	[ -s "$outdir/queue.txt" ] || return 0
	echo
	cat "$outdir/queue.txt"
}

# apart KEEP CMD...: CMD (a function of the script that starts and stops
# a daemon) in a subshell of its own, so that gpu_lib's fail, which exits,
# ends only CMD; on the subshell's exit a daemon CMD left running is killed
# and the daemon's log is kept as KEEP. Returns CMD's status.
apart() {
	local keep=$1
	shift
	(
		trap '[ -n "$daemon_pid" ] && kill -KILL "$daemon_pid" 2>/dev/null; cp "$tmp/dfccld.log" "$keep" 2>/dev/null; rm -f "$tmp/dfccld.log"' EXIT
		"$@"
	)
}

# trace_of FILE G: where GPU G's worker writes the trace that
# DFCCL_DK_TRACE=FILE asks for: FILE for GPU 0, FILE.gpuG for the others
# (gpu/cuda/cuda_engine.cu).
trace_of() {
	if [ "$2" = 0 ]; then echo "$1"; else echo "$1.gpu$2"; fi
}

# traced_print: the summaries traced() wrote, each under a header.
traced_print() {
	local f
	for f in "$outdir"/trace_*_summary.txt; do
		[ -f "$f" ] || continue
		echo
		echo "# the daemon kernel's trace: $(basename "$f" _summary.txt) (4 KiB, block 0)"
		cat "$f"
	done
}

# traced NAME ARGS...: one run of 4 KiB through the script's own `perf`
# function (NAME ARGS...), on a daemon of its own started with
# DFCCL_DK_TRACE (trace_NAME.txt for GPU 0, trace_NAME.txt.gpuN for the
# others; with the script's daemon_args, where it has them); each GPU's
# trace is summarised by dk_trace_summary.py (block 0, then --turnaround,
# then the queue reader's passes, then every block's pace (--blocks), then
# the kernel's starts (--launches), then what paces its bursts of takes
# (--bursts 15: a batch's), then --stalls 50) into
# trace_NAME_gpuN_summary.txt in $outdir (an earlier run's of that NAME
# removed first). Returns perf's status; traced_apart (below) runs it
# apart, where a daemon that fails must not end the script.
traced() {
	local name=$1 g f sum rc=0
	shift
	rm -f "$outdir/trace_${name}_gpu"*_summary.txt
	# The daemon with the script's settings (daemon_args, where it has
	# them), traced.
	# shellcheck disable=SC2154 # daemon_args is the sourcing script's
	DFCCL_DK_TRACE=$outdir/trace_$name.txt start_daemon "${daemon_args[@]+"${daemon_args[@]}"}"
	perf "$name" "$@" -b 4K -e 4K || rc=$?
	stop_daemon
	for g in $(seq 0 $((ngpu - 1))); do
		f=$(trace_of "$outdir/trace_$name.txt" "$g")
		[ -f "$f" ] || continue
		sum=$outdir/trace_${name}_gpu${g}_summary.txt
		{ python3 "$perf_lib_dir/dk_trace_summary.py" "$f" &&
			python3 "$perf_lib_dir/dk_trace_summary.py" "$f" --turnaround &&
			python3 "$perf_lib_dir/dk_trace_summary.py" "$f" --block reader --top 12 &&
			python3 "$perf_lib_dir/dk_trace_summary.py" "$f" --blocks &&
			python3 "$perf_lib_dir/dk_trace_summary.py" "$f" --launches &&
			python3 "$perf_lib_dir/dk_trace_summary.py" "$f" --bursts 15 &&
			python3 "$perf_lib_dir/dk_trace_summary.py" "$f" --stalls 50; } >"$sum" 2>&1 ||
			echo "== the trace of $name on GPU $g could not be summarised: $(tail -n 1 "$sum")"
	done
	return "$rc"
}

# traced_apart NAME ARGS...: traced, run apart, the daemon's log kept as
# NAME_dfccld.log in $outdir; non-zero where the run failed (a failure
# counted inside it does not reach the caller's count).
traced_apart() {
	apart "$outdir/$1_dfccld.log" traced "$@"
}
