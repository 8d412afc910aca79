#!/usr/bin/env bash
# GPU test of client death on dfccld's CUDA engine: a client SIGKILLed in
# the middle of a collective while a kernel of its own runs on the GPU
# (test_cuda_kill), without MPS and, with nvidia-cuda-mps-control and root,
# under a private MPS daemon, where such a death poisons every CUDA context
# on that GPU, the daemon's worker's included (DESIGN.md, "Processes").
#
# Each fault case:
#   - where a GPU is left over, a bystander pair on it runs checked
#     all-reduces through the whole case (test_cuda_kill --loop) and no
#     iteration may take more than 2 s: the other GPUs keep serving;
#   - test_cuda_kill: the victim's kernel runs when it is killed; its peer,
#     waiting in an all-reduce with it, must get peer-lost within 1 s
#     without MPS, peer-lost or device-lost within 2 s under MPS (there the
#     poisoned worker must exit and be reaped before the supervisor fails
#     its entries with device-lost);
#   - without MPS no worker may change (the kill leaves the daemon's kernel
#     unharmed, as measured); under MPS the worker of every GPU whose
#     contexts were poisoned (the survivor's probe of its own context says
#     so) must have been restarted, RESTARTS in dfcclctl status grown, and
#     device-lost means some worker of the pair's GPUs was; the workers of
#     the other GPUs keep their pids;
#   - afterwards a new pair of clients runs every collective correctly on
#     GPU buffers on the same GPUs (dfccl-chaos --mem device), every GPU
#     answers dfcclctl ping, and the daemon still runs.
# Cases: the pair sharing GPU 0; with 2+ GPUs also the survivor on GPU 1 and
# the victim on GPU 0. Finally the daemon must stop cleanly. Any failure
# prints the daemon's log (and the MPS logs). Where no GPU exists it says so
# and exits 77 (ctest: skipped).
#
# Usage: cuda_faults.sh BINDIR   (the folder holding dfccld, dfcclctl,
#        dfccl-chaos and test_cuda_kill)
# Environment: DFCCL_TEST_SEED=S repeats a run's data (the seed is printed);
#        FAULTS_CLIENTS_SEE=own starts the victim's pair and the bystander
#        with CUDA_VISIBLE_DEVICES naming only the GPUs each uses (default
#        all: they see every GPU), to tell whether what a killed client
#        poisons under MPS depends on the GPUs its process sees;
#        CUDA_FAULTS_DAEMON_ARGS adds dfccld settings to every daemon the
#        script starts (e.g. "--launch-gate 1 --kernel-idle-us 0").
set -euo pipefail
bin=${1:?usage: cuda_faults.sh BINDIR}
seed=${DFCCL_TEST_SEED:-$(date +%s)}
# shellcheck source-path=SCRIPTDIR
# shellcheck source=gpu_lib.sh
. "$(dirname "$0")/gpu_lib.sh"

gpu_need_gpu cuda_faults
gpu_need_bins dfccld dfcclctl dfccl-chaos test_cuda_kill
gpu_setup dfccl-faults

# The bound on the survivor's wait after the kill, in seconds.
latency_plain=1
latency_mps=2
# A dead worker is restarted this long after its death (the default, named
# here because the waits below count on it).
daemon_args=(--worker-restart-delay-ms 100)
if [ -n "${CUDA_FAULTS_DAEMON_ARGS:-}" ]; then
	read -ra more_args <<<"$CUDA_FAULTS_DAEMON_ARGS"
	daemon_args+=("${more_args[@]}")
fi

# workers_settled BEFORE MUST ANYOF MAY: whether the workers, against the
# status in file BEFORE, are all up and restarted as required: every GPU of
# the comma-separated list MUST restarted, at least one of ANYOF (when
# given), none outside MAY changed its pid. Prints what it finds.
workers_settled() {
	ctl --json status >"$tmp/after.json" || return 1
	python3 - "$1" "$tmp/after.json" "$2" "$3" "$4" <<'PY'
import json, sys
before = json.load(open(sys.argv[1]))["devices"]
after = json.load(open(sys.argv[2]))["devices"]
gpus = lambda s: {int(x) for x in s.split(",") if x}
must, anyof, may = gpus(sys.argv[3]), gpus(sys.argv[4]), gpus(sys.argv[5])
restarted = {i for i, (b, a) in enumerate(zip(before, after))
             if a.get("worker_restarts", 0) > b.get("worker_restarts", 0)}
changed = {i for i, (b, a) in enumerate(zip(before, after)) if a.get("worker_pid") != b.get("worker_pid")}
down = {i for i, a in enumerate(after) if not a.get("worker_up")}
print("workers restarted: %s; pid changed: %s; down: %s" % (sorted(restarted), sorted(changed), sorted(down)))
if changed - may:
    print("FAIL: the worker of GPU(s) %s changed; only %s may" % (sorted(changed - may), sorted(may) or "none"))
    sys.exit(2)
ok = not down and must <= restarted and (not anyof or anyof & restarted)
sys.exit(0 if ok else 1)
PY
}

see=${FAULTS_CLIENTS_SEE:-all}
case $see in all | own) ;; *) fail "FAULTS_CLIENTS_SEE=$see: use all or own" ;; esac

# client_env A,B: for a client process whose two ranks use GPUs A and B,
# its environment (`cenv`, for env) and its --gpus list (`cgpus`): with
# FAULTS_CLIENTS_SEE=own only those GPUs are visible, and the list names
# them by their ordinals among them.
client_env() {
	local a=${1%%,*} b=${1#*,}
	cenv=() cgpus=$1
	[ "$see" = own ] || return 0
	if [ "$a" = "$b" ]; then
		cenv=("CUDA_VISIBLE_DEVICES=$a") cgpus=0,0
	else
		cenv=("CUDA_VISIBLE_DEVICES=$a,$b") cgpus=0,1
	fi
}

# bystander_start GPU: the loop on GPU, until it has completed its first
# iteration.
bystander_start() {
	local g=$1 _
	client_env "$g,$g"
	env "${cenv[@]}" "$bin/test_cuda_kill" --socket "$sock" --loop 25 --gpus "$cgpus" --max-wait 2 --count 65536 \
		--seed "$seed" >"$tmp/bystander.out" 2>&1 &
	bystander_pid=$!
	bg_pids+=("$bystander_pid")
	for _ in $(seq 1 600); do
		grep -q looping "$tmp/bystander.out" && return 0
		kill -0 "$bystander_pid" 2>/dev/null || { cat "$tmp/bystander.out"; fail "the bystander on GPU $g ended at start"; }
		sleep 0.1
	done
	fail "the bystander on GPU $g did not start looping within 60 s"
}

bystander_finish() {
	local rc=0
	timeout 120 tail --pid="$bystander_pid" -f /dev/null || fail "the bystander did not end within 120 s"
	wait "$bystander_pid" || rc=$?
	sed 's/^/  bystander: /' "$tmp/bystander.out"
	[ "$rc" = 0 ] || fail "the bystander (the other GPU) failed during the fault: exit status $rc"
}

# fault_case NAME SURVIVOR_GPU VICTIM_GPU MPS(0|1)
fault_case() {
	local name=$1 sg=$2 vg=$3 mps=$4 spare='' g rc=0 result status ctx must='' anyof='' may='' expect latency settled
	echo "== fault: $name"
	ctl --json status >"$tmp/before.json"
	for g in $(seq 0 $((ngpu - 1))); do
		[ "$g" != "$sg" ] && [ "$g" != "$vg" ] && { spare=$g; break; }
	done
	if [ -n "$spare" ]; then
		echo "   bystander pair on GPU $spare"
		bystander_start "$spare"
	fi
	if [ "$mps" = 1 ]; then
		expect=peer-lost,device-lost latency=$latency_mps
	else
		expect=peer-lost latency=$latency_plain
	fi
	client_env "$sg,$vg"
	[ "$see" = own ] && echo "   the pair sees only ${cenv[0]}"
	timeout -k 10 180 env "${cenv[@]}" "$bin/test_cuda_kill" --socket "$sock" --gpus "$cgpus" --expect "$expect" \
		--max-latency "$latency" --seed "$seed" 2>&1 | tee "$tmp/kill.out" || rc=$?
	[ "$rc" = 0 ] || fail "$name: test_cuda_kill failed (exit status $rc)"
	result=$(grep '^RESULT ' "$tmp/kill.out") || fail "$name: test_cuda_kill printed no RESULT line"
	status=$(sed -n 's/.* status=\([^ ]*\).*/\1/p' <<<"$result")
	ctx=$(sed -n 's/.*survivor_context=\([^ ]*\).*/\1/p' <<<"$result")

	# Which workers must have been restarted, and which may have.
	if [ "$mps" = 1 ]; then
		[ "$ctx" = poisoned ] && must=$sg
		[ "$status" = device-lost ] && anyof=$sg,$vg
		may=$sg,$vg
		if [ "$ctx" = ok ] && [ "$sg" = "$vg" ] && [ "$status" = peer-lost ]; then
			echo "   NOTE: under MPS the victim's death did not poison the survivor's context on GPU $sg this time"
		fi
	else
		[ "$ctx" = ok ] || fail "$name: without MPS the survivor's CUDA context was $ctx after the kill"
	fi
	settled=1
	for _ in $(seq 1 300); do
		rc=0
		workers_settled "$tmp/before.json" "$must" "$anyof" "$may" >"$tmp/settled.out" || rc=$?
		[ "$rc" = 2 ] && { cat "$tmp/settled.out"; fail "$name: a worker changed that should not have"; }
		[ "$rc" = 0 ] && { settled=0; break; }
		sleep 0.1
	done
	sed 's/^/   /' "$tmp/settled.out"
	[ "$settled" = 0 ] || fail "$name: the workers were not up and restarted as required 30 s after the fault" \
		"(must restart: ${must:-none}; one of: ${anyof:-none})"
	ctl status

	[ -n "$spare" ] && bystander_finish
	kill -0 "$daemon_pid" 2>/dev/null || fail "$name: dfccld is gone"
	step "after '$name': a new pair on GPUs $sg,$vg, every collective on GPU buffers" 300 \
		"$bin/dfccl-chaos" --socket "$sock" --mem device --devices "$sg,$vg" --nranks 2 --comms 3 --iters 10 \
		--min-bytes 64 --max-bytes 1M --seed "$seed"
	for g in $(seq 0 $((ngpu - 1))); do
		ctl ping --device "$g" --count 50 | tail -1 || fail "$name: GPU $g does not answer a ping afterwards"
	done
}

# run_cases MPS: every case against the running daemon.
run_cases() {
	fault_case "survivor and victim share GPU 0" 0 0 "$1"
	if [ "$ngpu" -ge 2 ]; then
		fault_case "survivor on GPU 1, victim on GPU 0" 1 0 "$1"
	fi
}

echo "== $ngpu GPU(s); seed $seed"
start_daemon "${daemon_args[@]}"
ctl status
[ "$(json "d['mps_active']" <"$tmp/status.json")" = "False" ] || fail "MPS reported active without an MPS daemon"
run_cases 0
stop_daemon

if mps_usable; then
	echo "== under MPS"
	mps_start
	# Every client here runs as root, dfccld's own uid: workers of the
	# daemon's uid serve them, and no worker is replaced but by a fault
	# (worker-user auto would park idle workers, changing the pids that
	# workers_settled holds against the faults).
	start_daemon "${daemon_args[@]}" --worker-user daemon
	[ "$(json "d['mps_active']" <"$tmp/status.json")" = "True" ] || fail "MPS is running but dfccld does not see it"
	run_cases 1
	stop_daemon
	mps_stop
else
	echo "== MPS part skipped (needs nvidia-cuda-mps-control and root)"
fi
echo "PASS: cuda_faults on $ngpu GPU(s)"
