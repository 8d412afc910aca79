#!/usr/bin/env bash
# GPU test of topology detection: `dfccld --probe-topology` describes every
# GPU nvidia-smi lists, with the same PCI bus ids in CUDA order, a link for
# every pair, NVLink pairs where nvidia-smi shows NV# and, on an NVSwitch
# node, every pair on NVLink; the daemon started on the GPUs shows the
# same model in `dfcclctl topo --dump`, and that dump loads back with
# --topology. The plan built from the detected model drives the engines:
# dfccl-chaos (every collective, conflicting orders, results checked) runs
# with each algorithm forced and with the plan's own choice, and the
# workers count their collectives under the forced algorithm. Where no GPU
# exists it says so and exits 77 (ctest: skipped).
#
# Usage: topo_detect.sh BINDIR   (the folder holding dfccld and dfcclctl)
set -euo pipefail
bin=${1:?usage: topo_detect.sh BINDIR}
dfccld_bin=${DFCCLD:-$bin/dfccld} # as in gpu_lib.sh

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	echo "SKIPPED: no NVIDIA GPU on this machine (topo_detect runs on GPU machines)"
	exit 77
fi

ngpu=$(nvidia-smi -L | wc -l)
tmp=$(mktemp -d /tmp/dfccl-topo-XXXXXX)
daemon_pid=
cleanup() {
	[ -n "$daemon_pid" ] && kill -TERM "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
	echo "FAIL: $*"
	[ -f "$tmp/dfccld.log" ] && { echo "---- dfccld log ----"; cat "$tmp/dfccld.log"; }
	exit 1
}

echo "== dfccld --probe-topology ($ngpu GPU(s) per nvidia-smi)"
"$dfccld_bin" --probe-topology >"$tmp/model.json" || fail "detection failed: $(cat "$tmp/model.json")"
nvidia-smi topo -m | tee "$tmp/smi.txt"
python3 - "$tmp/model.json" "$tmp/smi.txt" "$ngpu" <<'PY' || fail "the detected model does not match nvidia-smi"
import json, re, subprocess, sys
model = json.load(open(sys.argv[1]))
ngpu = int(sys.argv[3])
devs, links = model["devices"], model["links"]
print("model:", model["name"], len(devs), "devices,", len(links), "links")
assert len(devs) == ngpu, f"{len(devs)} devices, nvidia-smi lists {ngpu}"
pairs = {(l["a"], l["b"]) for l in links}
assert len(pairs) == ngpu * (ngpu - 1) // 2 == len(links), "not one link per pair"
# The same PCI bus ids as nvidia-smi, compared without the domain padding.
smi_ids = sorted(x.strip().lower().split(":", 1)[1] for x in subprocess.check_output(
    ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"], text=True).splitlines())
ids = sorted(d["pci_bus_id"].lower().split(":", 1)[1] for d in devs)
assert ids == smi_ids, f"PCI bus ids {ids} differ from nvidia-smi's {smi_ids}"
# nvidia-smi's matrix, in nvidia-smi's order (by PCI bus id), against the
# model's links mapped to the same ids.
rows = [l.split() for l in open(sys.argv[2]) if re.match(r"^GPU\d+\s", l)]  # not the indented header
smi_order = sorted(devs, key=lambda d: d["pci_bus_id"].lower())
by_id = {d["pci_bus_id"].lower(): d["index"] for d in devs}
kind = {(l["a"], l["b"]): l for l in links}
kind.update({(l["b"], l["a"]): l for l in links})
nvlink_pairs = 0
for i, row in enumerate(rows[:ngpu]):
    for j in range(ngpu):
        if i == j:
            continue
        cell = row[1 + j]
        a, b = by_id[smi_order[i]["pci_bus_id"].lower()], by_id[smi_order[j]["pci_bus_id"].lower()]
        t = kind[(a, b)]["type"]
        if cell.startswith("NV"):
            nvlink_pairs += 1
            assert t in ("nvlink", "nvswitch"), f"GPU{i}-GPU{j}: nvidia-smi says {cell}, model says {t}"
        else:
            assert t not in ("nvlink", "nvswitch"), f"GPU{i}-GPU{j}: nvidia-smi says {cell}, model says {t}"
print("NVLink pairs:", nvlink_pairs // 2)
# On an NVSwitch node (every pair NV#), every pair must be NVLink.
if ngpu > 1 and nvlink_pairs == ngpu * (ngpu - 1):
    assert all(l["type"] in ("nvlink", "nvswitch") for l in links)
    print("NVSwitch node: every pair on NVLink")
PY

echo "== the daemon on the GPUs shows the detected model"
"$dfccld_bin" --socket "$tmp/dfccld.sock" --engine cuda --config /dev/null --log-target stderr \
	--log-level info 2>"$tmp/dfccld.log" &
daemon_pid=$!
for _ in $(seq 1 300); do
	"$bin/dfcclctl" --socket "$tmp/dfccld.sock" topo --dump >"$tmp/dump.json" 2>/dev/null && break
	sleep 0.1
done
[ -s "$tmp/dump.json" ] || fail "dfcclctl topo --dump printed nothing"
cmp -s "$tmp/dump.json" "$tmp/model.json" || fail "the daemon's model differs from the probe's: $(diff "$tmp/model.json" "$tmp/dump.json" | head -20)"
"$bin/dfcclctl" --socket "$tmp/dfccld.sock" topo

if [ -x "$bin/dfccl-chaos" ]; then
	echo "== the plan from the detected model: every algorithm through the GPUs' workers"
	# collectives started per algorithm (auto, direct, ring, tree, multitree), all devices
	counts() {
		"$bin/dfcclctl" --socket "$tmp/dfccld.sock" --json stats |
			python3 -c "import json,sys; d=json.load(sys.stdin); print(' '.join(str(sum(x['by_algo'][a] for x in d['devices'])) for a in range(5)))"
	}
	for algo in ring tree multitree direct auto; do
		before=$(counts)
		DFCCL_ALGO=$algo "$bin/dfccl-chaos" --socket "$tmp/dfccld.sock" --nranks $((2 * ngpu)) --comms 3 \
			--iters 10 --min-bytes 64 --max-bytes 1M --seed 5 | tail -2 || fail "dfccl-chaos with DFCCL_ALGO=$algo"
		after=$(counts)
		echo "$algo: by algorithm (auto direct ring tree multitree) before [$before] after [$after]"
		python3 - "$algo" "$before" "$after" <<'PY' || fail "the workers did not run $algo"
import sys
names = ["auto", "direct", "ring", "tree", "multitree"]
algo, b, a = sys.argv[1], list(map(int, sys.argv[2].split())), list(map(int, sys.argv[3].split()))
d = [y - x for x, y in zip(b, a)]
assert d[0] == 0, "a collective ran under 'auto'"
if algo == "auto":
    assert sum(d) > 0
else:
    assert d[names.index(algo)] > 0, f"no collective ran as {algo}"
PY
	done
fi
kill -TERM "$daemon_pid"
wait "$daemon_pid" || fail "dfccld exited non-zero on SIGTERM"
daemon_pid=

echo "== the dump loads back with --topology"
"$dfccld_bin" --socket "$tmp/dfccld.sock" --engine cuda --topology "$tmp/dump.json" --config /dev/null \
	--log-target stderr --log-level info 2>"$tmp/dfccld.log" &
daemon_pid=$!
for _ in $(seq 1 300); do
	"$bin/dfcclctl" --socket "$tmp/dfccld.sock" topo --dump >"$tmp/dump2.json" 2>/dev/null && break
	sleep 0.1
done
cmp -s "$tmp/dump.json" "$tmp/dump2.json" || fail "the reloaded model differs"
grep -q "topology: .* from $tmp/dump.json" "$tmp/dfccld.log" || fail "dfccld did not say it loaded the file"
echo "PASS: topo_detect on $ngpu GPU(s)"
