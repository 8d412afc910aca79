/*
 * The scheduling policy (gpu/scheduler.h) and the queue/communicator ABI
 * headers are written once for both engines. This test compiles them as
 * CUDA device code and checks on a GPU that the device's decisions equal
 * the host's for the same inputs: queue order under FIFO and priority,
 * thresholds by queue position, stickiness after progress, admission with
 * its limits per queue pair and per uid, and the completion-word encoding a
 * GPU stream will wait on.
 * Exits 77 (skipped) where no GPU can be used.
 */
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <cuda_runtime.h>

#include "dfccl_comm.h"
#include "dfccl_queue.h"
#include "scheduler.h"

#define NTASKS 64
#define NADMIT 4
#define ADMIT_OUT (NTASKS + NTASKS + 8) /* where the admission decisions start */
#define NOUT (ADMIT_OUT + 3 * NADMIT + 2)

/* Runs the same sequence of policy decisions on host or device. */
__host__ __device__ static void policy_run(uint32_t order, const int32_t *prio, uint32_t *out)
{
	struct sched_params p = {SCHED_DEFAULT_SPIN_HEAD, SCHED_DEFAULT_SPIN_OTHER, SCHED_DEFAULT_STICK_MULT,
	                         SCHED_DEFAULT_SPIN_MAX, order};
	struct sched_state st[NTASKS];
	struct sched_queue q;
	q.n = 0;
	for (uint32_t t = 0; t < NTASKS; t++) {
		st[t].arrival = t;
		st[t].priority = prio[t];
		st[t].boost = 1;
		sched_insert(&p, &q, st, t);
	}
	/* Progress on every third task, preemption on every fifth. */
	for (uint32_t t = 0; t < NTASKS; t += 3)
		sched_on_progress(&p, &st[t]);
	for (uint32_t t = 0; t < NTASKS; t += 5)
		sched_on_preempt(&st[t]);
	for (uint32_t i = 0; i < NTASKS; i++)
		out[i] = q.idx[i];
	for (uint32_t i = 0; i < NTASKS; i++)
		out[NTASKS + i] = sched_threshold(&p, i, &st[q.idx[i]]);
	/* Remove from the middle and the head, then report the new head. */
	sched_remove_at(&q, NTASKS / 2);
	sched_remove_at(&q, 0);
	out[2 * NTASKS] = q.n;
	out[2 * NTASKS + 1] = q.idx[0];
	uint64_t w = DFCCL_CW_MAKE(0xabcdef123456ull, DFCCL_CQ_PEER_LOST);
	out[2 * NTASKS + 2] = (uint32_t)DFCCL_CW_SEQ(w);
	out[2 * NTASKS + 3] = DFCCL_CW_STATUS(w);
	out[2 * NTASKS + 4] = DFCCL_QP_SLOT(1025, 1024);
	out[2 * NTASKS + 5] = (uint32_t)(DFCCL_COMM_REGION_SIZE(8) >> 12);
	out[2 * NTASKS + 6] = (uint32_t)sizeof(struct dfccl_sqe);
	out[2 * NTASKS + 7] = (uint32_t)sizeof(struct dfccl_rank_post);
	/* Admission: a fresh queue pair, one its uid's limit holds back, one at
	 * its uid's limit, one beyond the shared part's room. */
	struct sched_limits l = {100, 300};
	const uint32_t loads[NADMIT][4] = {{0, 0, 0, 0}, {4, 290, 0, 0}, {50, 300, 0, 0}, {10, 200, 0, SCHED_SHARED}};
	for (uint32_t k = 0; k < NADMIT; k++) {
		struct sched_load n = {loads[k][0], loads[k][1], loads[k][2], loads[k][3]};
		struct sched_admission a = sched_admit(&l, &n);
		out[ADMIT_OUT + 3 * k] = a.refuse;
		out[ADMIT_OUT + 3 * k + 1] = a.room;
		out[ADMIT_OUT + 3 * k + 2] = a.beyond;
	}
	out[ADMIT_OUT + 3 * NADMIT] = (uint32_t)sched_look_start(41, 5, 40);
	out[ADMIT_OUT + 3 * NADMIT + 1] = sched_max_inflight_uid(0);
}

__global__ void policy_kernel(uint32_t order, const int32_t *prio, uint32_t *out)
{
	if (threadIdx.x == 0 && blockIdx.x == 0)
		policy_run(order, prio, out);
}

int main()
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("SKIPPED: no usable GPU (test_sched_device runs on GPU machines)\n");
		return 77;
	}
	int32_t prio[NTASKS];
	for (int t = 0; t < NTASKS; t++)
		prio[t] = (t * 37) % 5 - 2;
	int32_t *dprio;
	uint32_t *dout;
	if (cudaMalloc(&dprio, sizeof(prio)) != cudaSuccess || cudaMalloc(&dout, NOUT * sizeof(uint32_t)) != cudaSuccess) {
		fprintf(stderr, "cudaMalloc failed\n");
		return 1;
	}
	cudaMemcpy(dprio, prio, sizeof(prio), cudaMemcpyHostToDevice);
	int failures = 0;
	for (uint32_t order = SCHED_ORDER_FIFO; order <= SCHED_ORDER_PRIORITY; order++) {
		uint32_t host[NOUT], dev[NOUT];
		policy_run(order, prio, host);
		policy_kernel<<<1, 32>>>(order, dprio, dout);
		cudaError_t e = cudaDeviceSynchronize();
		if (e != cudaSuccess) {
			fprintf(stderr, "kernel failed: %s\n", cudaGetErrorString(e));
			return 1;
		}
		cudaMemcpy(dev, dout, sizeof(dev), cudaMemcpyDeviceToHost);
		for (int i = 0; i < NOUT; i++) {
			if (host[i] != dev[i]) {
				fprintf(stderr, "order %u: output %d differs: host %u, device %u\n", order, i, host[i], dev[i]);
				failures++;
			}
		}
		/* The host answers themselves are right: FIFO keeps arrival order,
		 * priority puts the largest priority first. */
		if (order == SCHED_ORDER_FIFO && (host[0] != 0 || host[NTASKS - 1] != NTASKS - 1))
			failures++;
		if (order == SCHED_ORDER_PRIORITY && prio[host[0]] != 2)
			failures++;
		/* ... and so are the admission decisions (tests/unit/test_sched.c). */
		static const uint32_t admit_want[3 * NADMIT + 2] = {
		    DFCCL_CQ_OK, SCHED_QP_GUARANTEE, 0, DFCCL_CQ_OK, 10, 0, DFCCL_CQ_LIMIT_UID, 0, 0, DFCCL_CQ_OK, 0, 90, 5,
		    SCHED_DEFAULT_INFLIGHT_UID};
		if (memcmp(host + ADMIT_OUT, admit_want, sizeof(admit_want)) != 0) {
			fprintf(stderr, "the host's admission decisions are not the expected ones\n");
			failures++;
		}
		printf("order %s: head task %u (priority %d), head threshold %u, tail threshold %u\n",
		       order ? "priority" : "fifo", host[0], prio[host[0]], host[NTASKS], host[2 * NTASKS - 1]);
	}
	cudaFree(dprio);
	cudaFree(dout);
	if (failures) {
		printf("FAIL: %d differences\n", failures);
		return 1;
	}
	printf("PASS: the scheduling policy decides the same on the GPU as on the host\n");
	return 0;
}
