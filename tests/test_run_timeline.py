"""``cli timeline`` (what ``make run`` prints last): the runs since a moment, oldest first, with
their status, wall time and each step's, read from the instance's own records."""

import time

import dagster as dg

from gc25d_pipeline import cli
from gc25d_pipeline.lib.timeline import clock, timeline


def test_clock_reads_minutes_and_seconds_to_a_tenth():
    assert [clock(s) for s in (0.0, 0.04, 9.96, 75.44, 600.0)] == [
        "0:00.0",
        "0:00.0",
        "0:10.0",
        "1:15.4",
        "10:00.0",
    ]


def test_the_timeline_lists_each_run_since_the_start_with_its_steps(monkeypatch, tmp_path):
    @dg.asset
    def slow() -> int:
        time.sleep(0.5)
        return 1

    @dg.asset(deps=[slow])
    def after() -> int:
        return 2

    @dg.asset
    def broken() -> int:
        raise RuntimeError("broken on purpose")

    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        dg.materialize([slow], instance=instance)  # before the start: not listed
        since = time.time()
        dg.materialize([slow, after], instance=instance)
        dg.materialize([broken], instance=instance, raise_on_error=False)
        text = timeline(instance, since, now=since + 65.0)
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
        # the CLI reads the same instance (DAGSTER_HOME) and prints the same runs
        printed = []
        monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))
        assert cli.main(["timeline", "--since", str(since)]) == 0
    lines = text.splitlines()
    assert lines[0].endswith("1:05.0 of wall time, 2 runs")
    runs = [ln for ln in lines if ln.startswith("  ") and not ln.startswith("    ")]
    assert [r.split()[0] for r in runs] == ["assets", "assets", "outside"]
    assert runs[0].endswith("SUCCESS") and runs[1].endswith("FAILURE")
    steps = [ln.split() for ln in lines if ln.startswith("    ")]
    assert [s[0] for s in steps] == ["slow", "after", "broken"]
    minutes, seconds = steps[0][1].split(":")
    assert minutes == "0" and 0.5 <= float(seconds) < 5.0  # the step's own sleep
    assert steps[2][-1] == "FAILURE" and len(steps[1]) == 2  # a step that succeeded has no status
    assert len(printed) == 1 and printed[0].splitlines()[1:4] == lines[1:4]
