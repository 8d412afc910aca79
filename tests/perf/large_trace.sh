#!/usr/bin/env bash
# Where a large collective's time goes: each collective at one size, on a
# daemon of its own per block count, traced (DFCCL_DK_TRACE), with the time
# per collective beside what every GPU's blocks spent moving data
# (dk_trace_summary.py --data: the pieces' share of the blocks' busy time, and
# the rate within the pieces) and their pace (--blocks). A low share says
# the steps around the data bound the collective; a low rate, the blocks'
# moving of data; a rate that falls with fewer blocks, what a block keeps
# in flight.
#
# A block's ring keeps its last 65536 events (DK_TRACE_EVENTS). While one
# rank's dfccl-perf checks a large result, the other rank may already be in
# its next run (the in-place one), and its GPU's blocks, waiting for the
# peer, record a turn about every microsecond: that GPU's rings then hold
# mostly the wait, and its table shows few blocks with pieces, or none, or
# counts the wait as busy. The rates per block hold in a table that lists
# every block; the pieces' share of busy time only where it is high.
#
# Usage: large_trace.sh BINDIR [OUTDIR]
#   BINDIR  the folder of dfccld, dfcclctl and dfccl-perf (a CUDA build)
#   OUTDIR  where the traces, their summaries, the JSON and logs of every
#           run and the table go (default: a new folder under /tmp, which
#           keeps the summaries but not the traces themselves)
# Environment: LT_COLLS the collectives (default "allreduce allgather
#   reducescatter broadcast"), LT_SIZE their size (default 256M), LT_BLOCKS
#   the daemon's block counts (--channels; default "16 32": the count under
#   MPS and without it), LT_ITERS timed calls (default 5, after 2 untimed),
#   LT_MODE the form (callback or stream; default callback), LT_ARGS more
#   dfccl-perf options (e.g. "--batch 150 --group 1": a batch's figure is
#   per collective), LT_MPS=1 runs under a private MPS daemon (root and
#   nvidia-cuda-mps-control, else SKIPPED), the block counts then given as
#   --channels-mps. 2 ranks on GPUs 0,1 (both on GPU 0 where there is
#   one), without MPS unless asked, every result checked. Without a GPU it says SKIPPED and exits 77; a run that fails
#   (its daemon too) is reported with the daemon's log kept in OUTDIR, the
#   others still run, and the script exits 1 at the end.
set -u

# shellcheck source=perf_lib.sh
. "$(dirname "$0")/perf_lib.sh" "$@"
export NCCL_NVLS_ENABLE=0

gpu_need_gpu large_trace.sh
gpu_need_bins dfccld dfcclctl dfccl-perf
gpu_setup large-trace
keep_traces=1
[ -n "$outdir" ] || { outdir=$(mktemp -d /tmp/large-trace-XXXXXX); keep_traces=; }
mkdir -p "$outdir" || exit 1
read -ra colls <<<"${LT_COLLS:-allreduce allgather reducescatter broadcast}"
read -ra block_counts <<<"${LT_BLOCKS:-16 32}"
size=${LT_SIZE:-256M}
iters=${LT_ITERS:-5}
mode=${LT_MODE:-callback}
extra=()
[ -z "${LT_ARGS:-}" ] || read -ra extra <<<"$LT_ARGS"
chan_opt=--channels
if [ -n "${LT_MPS:-}" ]; then
	if ! mps_usable; then
		echo "SKIPPED: LT_MPS asks for MPS, which needs root and nvidia-cuda-mps-control"
		exit 77
	fi
	chan_opt=--channels-mps
fi
case $mode in
callback | stream) ;;
*) fail "LT_MODE: '$mode' is not callback or stream" ;;
esac
for c in "${block_counts[@]}"; do
	case $c in
	'' | *[!0-9]*) fail "LT_BLOCKS: '$c' is not a block count (1 to 32)" ;;
	esac
	if [ "$c" -lt 1 ] || [ "$c" -gt 32 ]; then
		fail "LT_BLOCKS: $c is not a block count (1 to 32)"
	fi
done
if [ ${#colls[@]} -eq 0 ] || [ ${#block_counts[@]} -eq 0 ]; then
	fail "LT_COLLS and LT_BLOCKS name nothing to run"
fi
if [ "$ngpu" -ge 2 ]; then devices=0,1; gpus=(0 1); else devices=0,0; gpus=(0); fi

# run_one NAME COLL BLOCKS: one traced run and its summaries; non-zero where
# it failed. Run apart (perf_lib.sh): gpu_lib's fail exits, and must end
# only this run.
run_one() {
	local name=$1 coll=$2 c=$3 rc=0 g f
	echo "== $name: dfccl-perf $coll -b $size -e $size --mode $mode ${extra[*]}, dfccld $chan_opt $c, traced"
	DFCCL_DK_TRACE=$outdir/trace_$name.txt start_daemon "$chan_opt" "$c"
	timeout -k 10 600 "$bin/dfccl-perf" "$coll" --socket "$sock" --nranks 2 --devices "$devices" --mem device \
		--mode "$mode" -b "$size" -e "$size" -n "$iters" -w 2 "${extra[@]+"${extra[@]}"}" --json \
		>"$outdir/$name.json" 2>"$outdir/$name.log" || rc=$?
	stop_daemon
	[ "$rc" = 0 ] || echo "   failed (exit $rc): $(tail -n 2 "$outdir/$name.log")"
	# The trace of each GPU the ranks ran on.
	for g in "${gpus[@]}"; do
		f=$(trace_of "$outdir/trace_$name.txt" "$g")
		[ -f "$f" ] || continue
		{ python3 "$perf_lib_dir/dk_trace_summary.py" "$f" --data &&
			python3 "$perf_lib_dir/dk_trace_summary.py" "$f" --blocks; } >"$outdir/${name}_gpu${g}_data.txt" 2>&1 ||
			echo "   the trace of GPU $g could not be summarised: $(tail -n 1 "$outdir/${name}_gpu${g}_data.txt")"
		[ -n "$keep_traces" ] || rm -f "$f"
	done
	return "$rc"
}
failed=0
names=()
[ -z "${LT_MPS:-}" ] || mps_start
for coll in "${colls[@]}"; do
	for c in "${block_counts[@]}"; do
		names+=("${coll}_b$c")
		apart "$outdir/${coll}_b${c}_dfccld.log" run_one "${coll}_b$c" "$coll" "$c" || failed=$((failed + 1))
	done
done
[ -z "${LT_MPS:-}" ] || mps_stop

{
	echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n), GPUs $devices of $ngpu:" \
		"$(nvidia-smi --query-gpu=name --format=csv,noheader | sort -u | paste -sd/), $size, $mode form," \
		"-n $iters -w 2${LT_ARGS:+, $LT_ARGS}${LT_MPS:+, under MPS}, out of place, traced (the trace's own cost included)"
	for name in "${names[@]}"; do
		echo
		t=$(PYTHONPATH=$perf_lib_dir python3 -c '
import sys, perf_json
t = perf_json.times(sys.argv[1], sys.argv[2]) or {}
print(" ".join("%.1f us" % v if v is not None else "wrong" for v in t.values()) or "failed")' "$outdir" "$name")
		echo "## $name: $t per collective"
		for f in "$outdir/${name}"_gpu*_data.txt; do
			[ -f "$f" ] || continue
			echo "# $(basename "$f" _data.txt | sed 's/.*_gpu/GPU /')"
			cat "$f"
		done
	done
} | tee "$outdir/table.txt"
echo "The traces, their summaries, the runs' JSON and logs, and the table (table.txt), are in $outdir"
if [ "$failed" != 0 ]; then
	echo "FAIL: $failed run(s) failed"
	exit 1
fi
