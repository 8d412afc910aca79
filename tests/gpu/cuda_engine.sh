#!/usr/bin/env bash
# GPU test of dfccld's CUDA engine on GPU buffers. It starts
# `dfccld --engine cuda` on a private socket and runs against it:
#   - test_cuda_coll: every collective x data type x reduction x in place or
#     not x count on cudaMalloc buffers, checked element by element with
#     canaries: on 2 GPUs one rank each and with 2 ranks sharing GPU 0, and
#     quick (fewer counts) with 4 ranks sharing GPU 0, with one rank alone
#     (a communicator of one: a copy), and on every GPU when there are
#     more than 2; quick again over rings, trees and multi-trees
#     (DFCCL_ALGO), each of which must have run; quick again on the other
#     kinds of device buffer (--buffers): VMM allocations exported as file
#     descriptors, and dfcclMemAlloc's device memory, which the daemon owns;
#   - the same sweep stream-ordered (test_cuda_coll --stream: each call on a
#     CUDA stream between a kernel, the copy that writes its send data and a
#     copy of its output, both checked), and program A with one stream per
#     communicator in conflicting orders;
#   - the DFCCL deadlock programs A (8 communicators) and B (8 registered
#     collectives with host synchronizations between them), which must
#     complete with correct results and make the daemon preempt, on
#     cudaMalloc buffers and (fewer iterations) on the other two kinds;
#   - after the runs on VMM and dfcclMemAlloc buffers (dfccl-chaos on each
#     of them too), the supervisor holds no more file descriptors than
#     before them;
#   - dfccl-chaos on cudaMalloc buffers (--mem device): every collective in
#     conflicting orders on several communicators, 2 ranks per GPU, and
#     registered collectives with device synchronizations between them;
#     once more on dfcclMemAllocHost buffers (--mem host) through the CUDA
#     engine's workers;
#   - dfccl-perf on cudaMalloc buffers, a small all-reduce and all-gather
#     sweep with every size checked (time, algorithm and bus bandwidth per
#     size);
#   - first, after one all-reduce, each worker's GPU memory (nvidia-smi):
#     at most 1 GiB (worker_memory); then the completion count in a queue
#     pair's header, sampled while NOPs complete one by one
#     (completion_count);
#   - test_cuda_hostile: raw hostile submission entries, each rejected with
#     its status, canaries around a registered device buffer intact, and
#     registrations past the end of a cudaMalloc or VMM allocation refused;
# then prints the daemon's counters. A daemon with pushed all-reduces off
# and every collective starting on block 0 (--push-bytes 0 --spread-blocks
# 0) runs the quick sweep again on the direct paths they replace; daemons
# with nothing pushed and --oneshot-bytes 0 (two-rank all-reduces out of
# place in two shots) and 1G (four ranks' in one shot) the quick sweep and
# checked all-reduces up to 64 MiB each; and one whose collectives start on
# blocks chosen by
# their instance
# (--spread-blocks 1, the default) the quick sweep, both forms, the deadlock
# programs and chaos again, and batches of 150 small all-reduces checked
# (collectives side by side on several blocks); then one with 4 blocks and
# nothing pushed, whose tasks wrap past the last block, over the direct
# paths and rings. Then a daemon whose kernel has bulk blocks
# (--channels 8 --resident-blocks 2: 2 resident blocks and 8 bulk ones;
# --bulk-idle-us 0: each bulk block leaves as soon as its queue is empty,
# so they come and go all the time) with a
# channel per 16 KiB runs a batch of small all-reduces (which must spill
# onto the bulk blocks), the quick sweep, both forms, the deadlock
# programs, chaos and batches of middle sizes; resident and bulk blocks
# must both have completed collectives. A daemon that takes stream-ordered
# collectives before their arm (--early-take 1) runs the quick sweep, both
# forms, and stream-ordered batches, without MPS and under it; entries must
# have been taken early (and, without MPS, given back unarmed: the counters
# early_taken and early_given_back). After the daemon stops, nccl_deadlock
# replays the deadlock pattern on NCCL, where it is expected to hang (not a
# failure of this test). With nvidia-cuda-mps-control and root, the suite
# runs again, quick, under a private MPS daemon. Any failure prints the
# daemon's log. Where no GPU exists it says so and exits 77 (ctest:
# skipped).
#
# Usage: cuda_engine.sh BINDIR   (the folder holding dfccld, dfcclctl,
#        dfccl-chaos, dfccl-perf and the test programs)
# Environment: DFCCL_GPU_QUICK=1 trims every sweep; DFCCL_TEST_SEED=S
#        repeats a run's data and orders (the seed is printed);
#        CUDA_ENGINE_PARTS names the parts to run, of "main" (the suite
#        without MPS), "push" (pushed all-reduces off, no spread), "spread"
#        (--spread-blocks 1), "split" (resident and bulk blocks), "gate"
#        (launches behind a gate), "nccl" (the pattern on NCCL) and "mps"
#        (the suite under MPS), "early" (stream-ordered collectives taken
#        before their arm, --early-take 1), comma-separated
#        (default all), so that a long run can be split between calls;
#        CUDA_ENGINE_DAEMON_ARGS adds dfccld settings to every daemon the
#        suite starts (e.g. "--bulk-idle-us 0").
set -euo pipefail
bin=${1:?usage: cuda_engine.sh BINDIR}
seed=${DFCCL_TEST_SEED:-$(date +%s)}
# shellcheck source-path=SCRIPTDIR
# shellcheck source=gpu_lib.sh
. "$(dirname "$0")/gpu_lib.sh"

gpu_need_gpu cuda_engine
gpu_need_bins dfccld dfcclctl dfccl-chaos dfccl-perf test_cuda_coll test_cuda_hostile nccl_deadlock
gpu_setup dfccl-cuda

# The daemon kernel's polls of peers' words cross PCIe (about 1 us each)
# while its synchronisation words live in host memory: a head threshold of
# 2000 polls keeps a stuck collective from holding a channel for tens of
# milliseconds before it is preempted.
daemon_args=(--spin-head 2000)
if [ -n "${CUDA_ENGINE_DAEMON_ARGS:-}" ]; then
	read -ra extra_args <<<"$CUDA_ENGINE_DAEMON_ARGS"
	daemon_args+=("${extra_args[@]}")
	echo "== every daemon with ${CUDA_ENGINE_DAEMON_ARGS}"
fi

# Collectives started over algorithm $1 (a DFCCL_ALGO name), over every device.
started() {
	ctl --json stats | json "sum(x['by_algo'][['auto', 'direct', 'ring', 'tree', 'multitree'].index('$1')] for x in d['devices'])"
}

# Descriptors the supervisor holds.
supervisor_fds() { find "/proc/$daemon_pid/fd" -mindepth 1 -maxdepth 1 | wc -l; }

# Collectives the daemon preempted, over every device.
preemptions() { ctl --json stats | json "sum(x['preemptions'] for x in d['devices'])"; }

# The collective test against this daemon, with this run's seed.
coll=("$bin/test_cuda_coll" --socket "$sock" --seed "$seed")

# run_suite QUICK DEADLOCK_ITERS: every program against the running daemon.
# QUICK is --quick or empty.
run_suite() {
	local quick=$1 iters=$2 pair=0,0 all before after fds_before
	[ -n "${DFCCL_GPU_QUICK:-}" ] && quick=--quick
	if [ "$ngpu" -ge 2 ]; then
		pair=0,1
		step "collectives: 2 ranks on GPUs 0,1" 300 "${coll[@]}" ${quick:+"$quick"} --nranks 2 --gpus 0,1
	fi
	step "collectives: 2 ranks sharing GPU 0" 300 "${coll[@]}" ${quick:+"$quick"} --nranks 2 --gpus 0,0
	step "collectives: 4 ranks sharing GPU 0" 300 "${coll[@]}" --quick --nranks 4 --gpus 0,0,0,0
	# A communicator of one rank: every collective a copy (DK_SELF).
	step "collectives: 1 rank on GPU 0" 300 "${coll[@]}" --quick --nranks 1 --gpus 0

	# Stream-ordered calls between the ranks' own kernels and copies; one
	# stream per communicator in program A, issued in conflicting orders.
	step "stream-ordered collectives: 2 ranks on GPUs $pair" 300 "${coll[@]}" --stream --quick --nranks 2 \
		--gpus "$pair"
	step "stream-ordered collectives: 3 ranks sharing GPU 0" 300 "${coll[@]}" --stream --quick --nranks 3 \
		--gpus 0,0,0
	step "stream-ordered collectives: 1 rank on GPU 0" 300 "${coll[@]}" --stream --quick --nranks 1 --gpus 0
	step "stream-ordered deadlock program A: 8 communicators on 8 streams, 2 ranks on GPUs $pair" 300 \
		"${coll[@]}" --stream --deadlock A --comms 8 --iters 50 --nranks 2 --gpus "$pair"
	if [ "$ngpu" -gt 2 ]; then
		all=$(seq -s, 0 $((ngpu - 1)))
		step "collectives: $ngpu ranks on GPUs $all" 300 "${coll[@]}" --quick --nranks "$ngpu" --gpus "$all"
	fi

	# Rings and trees (DFCCL_ALGO asks every entry for one; collectives
	# it does not serve run direct): each must have run.
	for algo in ring tree multitree; do
		before=$(started "$algo")
		step "collectives over $algo: 2 ranks on GPUs $pair" 300 env DFCCL_ALGO=$algo "${coll[@]}" --quick --nranks 2 \
			--gpus "$pair"
		step "collectives over $algo: 3 ranks sharing GPU 0" 300 env DFCCL_ALGO=$algo "${coll[@]}" --quick --nranks 3 \
			--gpus 0,0,0
		[ "$algo" = ring ] && step "deadlock program A over rings: 8 communicators, 2 ranks on GPUs $pair" 300 \
			env DFCCL_ALGO=ring "${coll[@]}" --deadlock A --comms 8 --iters 50 --nranks 2 --gpus "$pair"
		after=$(started "$algo")
		echo "collectives started over $algo: $((after - before))"
		[ $((after - before)) -gt 0 ] || fail "no collective ran over $algo with DFCCL_ALGO=$algo"
	done
	# Reduce-scatter and reduce over rings stage partial sums in the ranks'
	# connectors, which on two GPUs each worker maps from the other: there
	# they must run over rings, none falling back to direct (dfccl-perf's
	# own barrier is an all-reduce, over rings too), results checked.
	if [ "$ngpu" -ge 2 ]; then
		for c in reducescatter reduce; do
			before=$(started ring) direct=$(started direct)
			step "$c over rings: 2 ranks on GPUs $pair, connectors across GPUs" 300 env DFCCL_ALGO=ring \
				"$bin/dfccl-perf" "$c" --socket "$sock" --nranks 2 --devices "$pair" --mem device -b 8 -e 1M -f 4 \
				-n 5 -w 1
			after=$(started ring)
			echo "$c: collectives started over rings: $((after - before)), direct: $(($(started direct) - direct))"
			[ $((after - before)) -gt 0 ] || fail "$c with DFCCL_ALGO=ring ran no collective over rings on GPUs $pair"
			[ "$(started direct)" = "$direct" ] || fail "$c with DFCCL_ALGO=ring ran direct on GPUs $pair"
		done
	fi

	# The other kinds of device buffer: each registered (VMM) or allocated
	# (dfcclMemAlloc) in its own way, freed after every case of its own.
	# Once their clients have exited, the supervisor must hold no more
	# descriptors than before (it keeps one per worker per registration).
	fds_before=$(supervisor_fds)
	for kind in vmm memalloc; do
		step "collectives on $kind buffers: 2 ranks on GPUs $pair" 300 "${coll[@]}" --buffers "$kind" --quick \
			--nranks 2 --gpus "$pair"
		for prog in A B; do
			step "deadlock program $prog on $kind buffers: 8 collectives, 2 ranks on GPUs $pair" 300 \
				"${coll[@]}" --buffers "$kind" --deadlock "$prog" --comms 8 --iters 50 --nranks 2 --gpus "$pair"
		done
		step "dfccl-chaos on $kind buffers, 2 ranks on GPUs $pair" 300 \
			"$bin/dfccl-chaos" --socket "$sock" --mem "$kind" --devices "$pair" --nranks 2 --comms 4 --iters 10 \
			--min-bytes 64 --max-bytes 256K --seed "$seed"
	done
	# Fewer is fine: a connection open at the first count may have closed.
	for _ in $(seq 1 50); do
		[ "$(supervisor_fds)" -le "$fds_before" ] && break
		sleep 0.1
	done
	[ "$(supervisor_fds)" -le "$fds_before" ] ||
		fail "dfccld holds $(supervisor_fds) descriptors after the runs on vmm and memalloc buffers, $fds_before before"

	before=$(preemptions)
	step "deadlock program A: 8 communicators, 2 ranks on GPUs $pair" 300 \
		"${coll[@]}" --deadlock A --comms 8 --iters "$iters" --nranks 2 --gpus "$pair"
	step "deadlock program B: 8 registered collectives, host synchronization, 2 ranks on GPUs $pair" 300 \
		"${coll[@]}" --deadlock B --comms 8 --iters "$iters" --nranks 2 --gpus "$pair"
	after=$(preemptions)
	echo "preemptions during the deadlock programs: $((after - before))"
	[ $((after - before)) -gt 0 ] || fail "the deadlock programs completed without a single preemption"

	step "dfccl-chaos on GPU buffers, 2 ranks per GPU" 300 \
		"$bin/dfccl-chaos" --socket "$sock" --mem device --nranks $((2 * ngpu)) --comms 4 --iters 20 \
		--min-bytes 64 --max-bytes 256K --seed "$seed"
	step "dfccl-chaos on GPU buffers: registered collectives, a device synchronization between them, GPUs $pair" \
		300 "$bin/dfccl-chaos" --socket "$sock" --mem device --devices "$pair" --nranks 2 --registered --sync \
		--comms 4 --iters 20 --min-bytes 64 --max-bytes 256K --seed "$seed"
	step "dfccl-chaos on host buffers through the CUDA engine's workers, 2 ranks per GPU" 300 \
		"$bin/dfccl-chaos" --socket "$sock" --mem host --nranks $((2 * ngpu)) --comms 4 --iters 10 \
		--min-bytes 64 --max-bytes 256K --seed "$seed"
	if [ "$ngpu" -ge 2 ]; then
		# Each communicator across GPUs holds about 100 MiB of connectors
		# and lines per rank on each GPU, freed in two steps once every worker let
		# go of it (WorkerCommDel, WorkerCommFree): 40 of them must not
		# stay behind.
		local used_before used_after
		used_before=$(gpu_mem_used_mib 0,1)
		for k in 1 2 3 4 5; do
			step "communicators across GPUs come and go ($k of 5): 8 of them, GPUs 0,1" 120 \
				"$bin/dfccl-chaos" --socket "$sock" --mem device --devices 0,1 --nranks 2 --comms 8 --iters 1 \
				--min-bytes 64 --max-bytes 4K --seed "$seed"
		done
		sleep 1
		used_after=$(gpu_mem_used_mib 0,1)
		echo "GPU memory used on GPUs 0,1: $used_before MiB before 40 communicators, $used_after MiB after"
		[ $((used_after - used_before)) -le 256 ] ||
			fail "40 communicators across GPUs 0,1 left $((used_after - used_before)) MiB behind on them"
	fi
	# A small sweep: the columns are the point here (the checks run
	# anyway); tests/perf holds the real measurements.
	step "dfccl-perf on GPU buffers: all-reduce, 2 ranks on GPUs $pair" 300 \
		"$bin/dfccl-perf" allreduce --socket "$sock" --mem device --devices "$pair" --nranks 2 \
		-b 8 -e 16M -f 8 -n 10 -w 3 -c 1
	step "dfccl-perf on GPU buffers: all-gather, 2 ranks on GPUs $pair" 300 \
		"$bin/dfccl-perf" allgather --socket "$sock" --mem device --devices "$pair" --nranks 2 \
		-b 1K -e 4M -f 64 -n 10 -w 3 -c 1
	step "hostile submission entries against GPU 0" 120 "$bin/test_cuda_hostile" --socket "$sock" --gpu 0

	echo "== dfcclctl stats"
	ctl stats
	ctl --json stats | json "'\n'.join('device %d: kernel launches %s, voluntary quits %s' % (x['device'],
		x.get('kernel_launches', 'n/a'), x.get('kernel_quits', 'n/a')) for x in d['devices'])"
}

# variant_suite NAME MAX_BYTES: against a daemon of other settings (NAME in
# the steps' titles), on GPUs $pair: the quick sweep with 2 ranks and with
# 4 sharing GPU 0, stream-ordered too, deadlock programs A (stream-ordered,
# 8 streams) and B, and chaos with collectives up to MAX_BYTES.
variant_suite() {
	local name=$1 max=$2
	step "$name: collectives, 2 ranks on GPUs $pair" 300 "${coll[@]}" --quick --nranks 2 --gpus "$pair"
	step "$name: collectives, 4 ranks sharing GPU 0" 300 "${coll[@]}" --quick --nranks 4 --gpus 0,0,0,0
	step "$name: stream-ordered collectives, 2 ranks on GPUs $pair" 300 "${coll[@]}" --stream --quick --nranks 2 \
		--gpus "$pair"
	step "$name: stream-ordered deadlock program A, 8 streams, 2 ranks on GPUs $pair" 300 \
		"${coll[@]}" --stream --deadlock A --comms 8 --iters 50 --nranks 2 --gpus "$pair"
	step "$name: deadlock program B, 2 ranks on GPUs $pair" 300 \
		"${coll[@]}" --deadlock B --comms 8 --iters 50 --nranks 2 --gpus "$pair"
	step "$name: dfccl-chaos on GPU buffers, 2 ranks per GPU" 300 \
		"$bin/dfccl-chaos" --socket "$sock" --mem device --nranks $((2 * ngpu)) --comms 4 --iters 20 \
		--min-bytes 64 --max-bytes "$max" --seed "$seed"
}

# worker_memory: each worker's GPU memory once its kernel has run and no
# communicator is left: its CUDA context, the kernel's state, and the
# stack the driver reserves at the kernel's deepest frame for every thread
# the GPU can hold (with dk_main's 8.9 KB stack the whole was 2562 MiB on
# one H200, with 872 bytes 538 MiB: tests/perf/RESULTS.md, twenty-sixth
# run). At most 1 GiB each; not checked where nvidia-smi lists none of the
# workers' processes (a PID namespace of its own).
worker_memory() {
	local m used pids
	pids=$(ctl --json status | json "' '.join(str(x.get('worker_pid', 0)) for x in d['devices'])")
	used=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
		awk -F', ' -v pids=" $pids " 'index(pids, " " $1 " ") {print $2}')
	if [ -z "$used" ]; then
		echo "   the workers' GPU memory: not checked (nvidia-smi lists none of the workers, $pids)"
		return
	fi
	echo "   the workers' GPU memory (MiB): $used"
	for m in $used; do
		[ "$m" -le 1024 ] || fail "a worker holds $m MiB of GPU memory with no communicator left (at most 1024)"
	done
}

# completion_count: the queue pair's count of completions in its header
# (`completed`, the futex its sleeping clients wait on, which the daemon
# kernel moves after each completion word: dkernel.cu, complete_count).
# NOPs go to GPU 0 one at a time (dfccl-perf --queue-only) while dfcclctl
# samples the pair: between two samples the count moves, and it trails the
# submitted count by at most 3 (the client waits for each NOP before the
# next; the two words are read apart) and leads it by at most 2 (read
# apart the other way).
queue_words() {
	ctl --json queues | json "' '.join('%d %d' % (x['sq_tail'], x['completed']) for x in d['queues'] if x['device'] == 0)"
}
completion_count() {
	local perf_pid line prev=-1 submitted counted
	"$bin/dfccl-perf" --queue-only -n 2000000 -w 0 --devices 0 --socket "$sock" >"$tmp/count.log" 2>&1 &
	perf_pid=$!
	# Until its queue pair is there (its CUDA set-up first), 10 s at most.
	for _ in $(seq 1 50); do
		[ -n "$(queue_words)" ] && break
		sleep 0.2
	done
	for _ in 1 2 3 4 5; do
		line=$(queue_words)
		read -r submitted counted <<<"$line"
		if [ -z "$counted" ] || [ -n "$(echo "$line" | cut -d' ' -f3)" ]; then
			kill "$perf_pid" 2>/dev/null
			fail "dfcclctl queues: expected the one queue pair of dfccl-perf on GPU 0, got '$line'"
		fi
		echo "   submitted $submitted, completed $counted"
		if [ $((submitted - counted)) -gt 3 ] || [ $((counted - submitted)) -gt 2 ] || [ "$counted" -le "$prev" ]; then
			kill "$perf_pid" 2>/dev/null
			fail "the queue pair's completion count: $counted with $submitted submitted (previous sample $prev)"
		fi
		prev=$counted
		sleep 0.3
	done
	kill "$perf_pid" 2>/dev/null
	wait "$perf_pid" 2>/dev/null || true
}

# small_batch NAME: 150 single-channel all-reduces (4 KiB) before each
# wait, callback form, not grouped, 2 ranks on GPUs $pair (NAME in the
# step's title).
small_batch() {
	step "$1: 150 all-reduces of 4 KiB per wait, 2 ranks on GPUs $pair" 300 \
		"$bin/dfccl-perf" allreduce --socket "$sock" --mem device --devices "$pair" --nranks 2 \
		--mode callback --batch 150 --group 0 -b 4K -e 4K -n 5 -w 2 -c 1
}

parts_from CUDA_ENGINE_PARTS main,push,spread,split,gate,early,nccl,mps main push spread split gate early nccl mps

echo "== $ngpu GPU(s); seed $seed; parts $parts"
if part_on main; then
	start_daemon "${daemon_args[@]}"
	ctl status
	[ "$(json "d['engine']" <"$tmp/status.json")" = "cuda" ] || fail "dfccld --engine cuda reports another engine"
	step "one all-reduce, 2 ranks on GPU 0" 60 "$bin/dfccl-perf" allreduce --socket "$sock" --mem device \
		--devices 0 --nranks 2 -b 8 -e 8 -n 2 -w 1 -c 1
	worker_memory
	echo "-- the completion count of a queue pair"
	completion_count
	run_suite "" 200
	stop_daemon
fi

# Small all-reduces are pushed by default (push-bytes); without it they run
# the direct one-shot and two-shot paths, which must stay right too.
if part_on push; then
	echo "== pushed all-reduces off, every collective from block 0 (--push-bytes 0 --spread-blocks 0)"
	start_daemon "${daemon_args[@]}" --push-bytes 0 --spread-blocks 0
	pair=0,0
	[ "$ngpu" -ge 2 ] && pair=0,1
	step "collectives without pushed all-reduces: 2 ranks on GPUs $pair" 300 "${coll[@]}" --quick --nranks 2 \
		--gpus "$pair"
	step "collectives without pushed all-reduces: 4 ranks sharing GPU 0" 300 "${coll[@]}" --quick --nranks 4 \
		--gpus 0,0,0,0
	stop_daemon
	# Two-rank all-reduces run in one shot at every size unless in place;
	# with --oneshot-bytes 0 out of place too runs two shots, and with 1G
	# four ranks run one shot, several channels each at the larger sizes
	# (dfccl-perf checks every result, in place and out of place). Nothing
	# pushed, so that the small ones take these paths too.
	echo "== all-reduces in two shots (--oneshot-bytes 0), then in one shot on 4 ranks (--oneshot-bytes 1G)"
	start_daemon "${daemon_args[@]}" --push-bytes 0 --oneshot-bytes 0
	step "two shots: collectives, 2 ranks on GPUs $pair" 300 "${coll[@]}" --quick --nranks 2 --gpus "$pair"
	step "two shots: all-reduces of 1 KiB-64 MiB, 2 ranks on GPUs $pair" 300 \
		"$bin/dfccl-perf" allreduce --socket "$sock" --mem device --devices "$pair" --nranks 2 \
		-b 1K -e 64M -f 4 -n 3 -w 1 -c 1
	stop_daemon
	start_daemon "${daemon_args[@]}" --push-bytes 0 --oneshot-bytes 1G
	step "one shot: collectives, 4 ranks sharing GPU 0" 300 "${coll[@]}" --quick --nranks 4 --gpus 0,0,0,0
	step "one shot: all-reduces of 1 KiB-64 MiB, 4 ranks sharing GPU 0" 300 \
		"$bin/dfccl-perf" allreduce --socket "$sock" --mem device --devices 0,0,0,0 --nranks 4 \
		-b 1K -e 64M -f 4 -n 3 -w 1 -c 1
	stop_daemon
fi

# Collectives on blocks chosen by their instance (spread-blocks): small
# ones then run side by side on different blocks of each GPU, so the
# protocol's channel words and connectors must not depend on the block.
if part_on spread; then
	echo "== collectives spread over the kernel's blocks (--spread-blocks 1)"
	start_daemon "${daemon_args[@]}" --spread-blocks 1
	pair=0,0
	[ "$ngpu" -ge 2 ] && pair=0,1
	# First, on the fresh daemon, single-channel collectives only: without
	# the spread every one of them completes on block 0.
	small_batch spread
	blocks=$(ctl --json stats | json "min([sum(1 for v in x.get('by_block', []) if v) for x in d['devices'] if x.get('completed', 0)] or [0])")
	echo "blocks that completed collectives, on the GPU that used fewest: $blocks"
	[ "$blocks" -ge 2 ] || fail "with --spread-blocks 1, single-channel collectives all completed on one block"
	variant_suite spread 256K
	for g in 1 0; do
		for mode in callback stream; do
			step "spread: 150 all-reduces of 4 KiB per wait ($mode, group $g), 2 ranks on GPUs $pair" 300 \
				"$bin/dfccl-perf" allreduce --socket "$sock" --mem device --devices "$pair" --nranks 2 \
				--mode "$mode" --batch 150 --group "$g" -b 4K -e 64K -f 16 -n 5 -w 2 -c 1
		done
	done
	stop_daemon
	# Few blocks and nothing pushed: tasks of several channels wrap past
	# the last block, and every step of the direct paths, rings and trees
	# (their parts by channel) runs on blocks other than the channel's.
	echo "== spread over 4 blocks, nothing pushed (--channels 4 --spread-blocks 1 --push-bytes 0)"
	start_daemon "${daemon_args[@]}" --channels 4 --spread-blocks 1 --push-bytes 0
	step "spread, 4 blocks: collectives, 2 ranks on GPUs $pair" 300 "${coll[@]}" --quick --nranks 2 --gpus "$pair"
	step "spread, 4 blocks: collectives over rings, 3 ranks sharing GPU 0" 300 env DFCCL_ALGO=ring "${coll[@]}" \
		--quick --nranks 3 --gpus 0,0,0
	step "spread, 4 blocks: deadlock program A, 2 ranks on GPUs $pair" 300 \
		"${coll[@]}" --deadlock A --comms 8 --iters 50 --nranks 2 --gpus "$pair"
	step "spread, 4 blocks: 150 all-reduces of 64-512 KiB per wait, 2 ranks on GPUs $pair" 300 \
		"$bin/dfccl-perf" allreduce --socket "$sock" --mem device --devices "$pair" --nranks 2 \
		--mode callback --batch 150 --group 0 -b 64K -e 512K -f 8 -n 3 -w 1 -c 1
	stop_daemon
fi

# The kernel as resident blocks (the queue reader's grid, single-channel
# collectives) and bulk blocks, each launched when a collective of more
# channels comes to it and leaving when it runs out of work. With
# --bulk-idle-us 0 a block leaves as soon as its queue is empty, so the
# reader hands tasks to blocks that are leaving or gone all the time (the
# handshake of bulk_ask, dkernel.cu): a task left behind hangs its step.
# A batch's single-channel collectives spill onto the bulk blocks.
if part_on split; then
	echo "== resident and bulk blocks (--channels 8 --resident-blocks 2 --bulk-idle-us 0 --chan-bytes 16K)"
	start_daemon "${daemon_args[@]}" --channels 8 --resident-blocks 2 --bulk-idle-us 0 --chan-bytes 16K
	pair=0,0
	[ "$ngpu" -ge 2 ] && pair=0,1
	# First, on the fresh daemon, single-channel collectives only, 150 in
	# flight: beyond 8 (4 per resident block) they spill onto the bulk
	# blocks, which must have completed some.
	small_batch "bulk blocks"
	spilled=$(ctl --json stats | json "min([sum(x.get('by_block', [])[2:]) for x in d['devices'] if x.get('completed', 0)] or [0])")
	echo "single-channel collectives completed on the bulk blocks, on the GPU with fewest: $spilled"
	[ "$spilled" -gt 0 ] || fail "bulk blocks: a batch of 150 single-channel all-reduces never spilled onto them"
	variant_suite "bulk blocks" 1M
	step "bulk blocks: collectives over rings, 3 ranks sharing GPU 0" 300 env DFCCL_ALGO=ring "${coll[@]}" \
		--quick --nranks 3 --gpus 0,0,0
	for mode in callback stream; do
		step "bulk blocks: 150 all-reduces of 4-256 KiB per wait ($mode), 2 ranks on GPUs $pair" 300 \
			"$bin/dfccl-perf" allreduce --socket "$sock" --mem device --devices "$pair" --nranks 2 \
			--mode "$mode" --batch 150 --group 0 -b 4K -e 256K -f 8 -n 3 -w 1 -c 1
	done
	# Completions by block, on each GPU that completed any: the resident
	# blocks (0, 1) and the bulk ones (2-9).
	by=$(ctl --json stats | json "' '.join('%d:%d' % (sum(x.get('by_block', [])[:2]), sum(x.get('by_block', [])[2:]))
		for x in d['devices'] if x.get('completed', 0))")
	echo "completions on the resident blocks : the bulk blocks, per GPU: $by"
	for g in $by; do
		if [ "${g%%:*}" -eq 0 ] || [ "${g##*:}" -eq 0 ]; then
			fail "bulk blocks: the resident or the bulk blocks of a GPU completed nothing ($by)"
		fi
	done
	ctl --json stats | json "'\n'.join('device %d: kernel launches %s' % (x['device'], x.get('kernel_launches',
		'n/a')) for x in d['devices'])"
	stop_daemon
fi

# Launches behind a gate (--launch-gate 1): with --kernel-idle-us 0 the
# kernel quits whenever it has nothing to do, so stream-ordered collectives
# start it through their arm words all the time, while the callback form,
# other streams' entries and parks open the gate from the worker: an entry
# taken twice or never shows as wrong data or a hang, a gate that never
# opens as a hang.
if part_on gate; then
	echo "== launches behind a gate (--launch-gate 1 --kernel-idle-us 0)"
	start_daemon "${daemon_args[@]}" --launch-gate 1 --kernel-idle-us 0
	pair=0,0
	[ "$ngpu" -ge 2 ] && pair=0,1
	variant_suite "gated" 1M
	step "gated: 150 all-reduces of 4-256 KiB per wait (stream), 2 ranks on GPUs $pair" 300 \
		"$bin/dfccl-perf" allreduce --socket "$sock" --mem device --devices "$pair" --nranks 2 \
		--mode stream --batch 150 --group 0 -b 4K -e 256K -f 8 -n 3 -w 1 -c 1
	# The kernel's counters carry over from launch to launch (dkernel.cu,
	# ctx_start): with a launch per collective here, a count that started
	# again at a launch would fall short of the collectives the step ran
	# (n + w per rank, each rank's GPU; its checks and sums add some).
	completed() { ctl --json stats | json "' '.join('%d:%d' % (x['device'], int(x.get('completed', 0)))
		for x in d['devices'])"; }
	before=$(completed)
	step "gated: 300 all-reduces of 8 B (stream), 2 ranks on GPUs $pair, counted" 120 \
		"$bin/dfccl-perf" allreduce --socket "$sock" --mem device --devices "$pair" --nranks 2 \
		--mode stream -b 8 -e 8 -n 300 -w 5 -c 1
	want=305
	[ "$pair" = 0,0 ] && want=610 # both ranks' entries on GPU 0
	for _ in $(seq 20); do
		after=$(completed)
		short=$(python3 -c "
b = dict(map(int, x.split(':')) for x in '$before'.split())
a = dict(map(int, x.split(':')) for x in '$after'.split())
print(' '.join('GPU %d: %d' % (g, a[g] - b.get(g, 0)) for g in sorted(a)
               if g in {int(x) for x in '$pair'.split(',')} and a[g] - b.get(g, 0) < $want))")
		[ -z "$short" ] && break
		sleep 0.1
	done
	[ -z "$short" ] || fail "gated: completions counted fell short of $want per GPU ($short): counters lost at a launch"
	echo "completions counted per GPU over the step: at least $want"
	gated=$(ctl --json stats | json "' '.join('%d:%d:%d' % (x['device'], int(x.get('kernel_launches', 0)),
		int(x.get('kernel_gated', 0))) for x in d['devices'] if int(x.get('completed', 0)))")
	echo "device:launches:gated launches, per GPU that completed collectives: $gated"
	for g in $gated; do
		[ "${g##*:}" -gt 0 ] || fail "gated: GPU ${g%%:*} launched its kernel behind no gate ($gated)"
	done
	stop_daemon
fi

# Stream-ordered collectives taken before their arm (--early-take 1). Each
# stream-ordered case of test_cuda_coll waits behind a 100 us kernel of its
# rank's: where the daemon kernel is still resident (the last case's, or
# another rank's), the queue reader takes the entry before the stream arms
# it, and with nothing else to do for 50 us the block gives it back to its
# queue, to be taken again once armed. A case read before its send data was
# written, or run twice, or never, shows as wrong data or a hang. Without
# MPS the kernel stays resident between cases (kernel-idle-us): both an
# early take and a give-back must have happened. Under MPS (as deployed,
# where usable) the launch gate restarts the kernel for each stream-armed
# entry, and early takes come from batches and ranks sharing a GPU: at least
# one must have happened.
early_counts() {
	ctl --json stats | json "'%d %d' % (sum(int(x.get('early_taken', 0)) for x in d['devices']),
		sum(int(x.get('early_given_back', 0)) for x in d['devices']))"
}
early_suite() {
	local name=$1 need_back=$2 g taken back
	start_daemon "${daemon_args[@]}" --early-take 1
	variant_suite "$name" 256K
	step "$name: stream-ordered collectives, 3 ranks sharing GPU 0" 300 "${coll[@]}" --stream --quick --nranks 3 \
		--gpus 0,0,0
	for g in 0 1; do
		step "$name: 150 stream-ordered all-reduces of 4-64 KiB per wait (group $g), 2 ranks on GPUs $pair" 300 \
			"$bin/dfccl-perf" allreduce --socket "$sock" --mem device --devices "$pair" --nranks 2 \
			--mode stream --batch 150 --group "$g" -b 4K -e 64K -f 16 -n 5 -w 2 -c 1
	done
	read -r taken back <<<"$(early_counts)"
	echo "$name: entries taken before their arm: $taken, given back unarmed: $back"
	[ "$taken" -gt 0 ] || fail "$name: with --early-take 1 no entry was taken before its arm"
	[ "$need_back" = 0 ] || [ "$back" -gt 0 ] ||
		fail "$name: entries were taken before their arm ($taken) but none was given back while its stream ran"
	stop_daemon
}
if part_on early; then
	echo "== stream-ordered collectives taken before their arm (--early-take 1)"
	pair=0,0
	[ "$ngpu" -ge 2 ] && pair=0,1
	early_suite early 1
	if mps_usable; then
		mps_start
		early_suite "early, MPS" 0
		mps_stop
	else
		echo "== early take under MPS skipped (needs nvidia-cuda-mps-control and root)"
	fi
fi

if ! part_on nccl; then
	:
elif [ "$ngpu" -ge 2 ]; then
	# NCCL runs a rank's collectives in its issue order: the permuted
	# pattern is expected to hang there. Informational only.
	"${coll[@]}" --deadlock A --comms 8 --iters 200 --nranks 2 --gpus 0,1 --print-pattern >"$tmp/pattern"
	echo "== the same deadlock pattern on NCCL (expected to hang; not a failure)"
	rc=0
	timeout -k 10 60 "$bin/nccl_deadlock" --pattern "$tmp/pattern" --timeout 20 || rc=$?
	case $rc in
	0) echo "NCCL completed the permuted pattern" ;;
	3 | 124 | 137) echo "NCCL hung on the permuted pattern (expected)" ;;
	77) echo "nccl_deadlock skipped (see above)" ;;
	*) echo "nccl_deadlock ended with status $rc (see above)" ;;
	esac
else
	echo "== NCCL comparison skipped (NCCL needs 2 GPUs)"
fi

if ! part_on mps; then
	:
elif mps_usable; then
	echo "== under MPS"
	mps_start
	start_daemon "${daemon_args[@]}"
	[ "$(json "d['mps_active']" <"$tmp/status.json")" = "True" ] || fail "MPS is running but dfccld does not see it"
	run_suite --quick 50
	stop_daemon
	mps_stop
else
	echo "== MPS part skipped (needs nvidia-cuda-mps-control and root)"
fi
echo "PASS: cuda_engine on $ngpu GPU(s) (parts $parts)"
