"""dfccl-perf's --json output (one JSON object per size), as the tables of
the perf scripts read it (vs_nccl.sh, latency.sh, compare_daemons.sh)."""
import json
import os


def runs(outdir, name):
    """The objects of run NAME in OUTDIR (NAME.json) by size: None where the
    file is missing, what could be read where it breaks off."""
    path = os.path.join(outdir, name + ".json")
    if not os.path.exists(path):
        return None
    rows = {}
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    d = json.loads(line)
                    rows[d["size"]] = d
    except (OSError, ValueError):
        pass
    return rows


def times(outdir, name):
    """The out-of-place time per collective (us) of run NAME by size (of an
    overlap run, dfccl-perf --overlap, the loop's step: the compute kernel
    and the collective), None for a size whose result was wrong; None where
    the file is missing."""
    r = runs(outdir, name)
    if r is None:
        return None
    out = {}
    for size, d in r.items():
        m = d.get("out_of_place") or {}
        out[size] = None if m.get("wrong") else m.get("time_us", m.get("total_us"))
    return out
