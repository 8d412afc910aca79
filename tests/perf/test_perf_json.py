"""perf_json against files written here with known contents."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import perf_json  # noqa: E402


def main():
    with tempfile.TemporaryDirectory() as out:
        with open(os.path.join(out, "ok.json"), "w") as f:
            f.write("# a comment line\n")
            f.write('{"size": 8, "out_of_place": {"time_us": 12.5, "wrong": 0}}\n')
            f.write('{"size": 4096, "out_of_place": {"time_us": 20.25, "wrong": 2}}\n')
        with open(os.path.join(out, "cut.json"), "w") as f:
            f.write('{"size": 8, "out_of_place": {"time_us": 3.0, "wrong": 0}}\n')
            f.write('{"size": 64, "out_of_pl')
        assert perf_json.runs(out, "missing") is None
        assert perf_json.times(out, "missing") is None
        r = perf_json.runs(out, "ok")
        assert sorted(r) == [8, 4096], r
        assert r[8]["out_of_place"]["time_us"] == 12.5
        t = perf_json.times(out, "ok")
        assert t == {8: 12.5, 4096: None}, t
        # A file that breaks off keeps what came before the break.
        assert perf_json.times(out, "cut") == {8: 3.0}
        # An overlap run (--overlap) has no time_us: its step, total_us.
        with open(os.path.join(out, "ov.json"), "w") as f:
            f.write('{"size": 8, "overlap_us": 500, "out_of_place": {"compute_us": 500.2, "total_us": 565.5, '
                    '"added_us": 65.3, "wrong": 0}}\n')
            f.write('{"size": 64, "overlap_us": 500, "out_of_place": {"compute_us": 500.1, "total_us": 566.0, '
                    '"added_us": 65.9, "wrong": 1}}\n')
        assert perf_json.times(out, "ov") == {8: 565.5, 64: None}, perf_json.times(out, "ov")
    print("OK: perf_json")


if __name__ == "__main__":
    main()
