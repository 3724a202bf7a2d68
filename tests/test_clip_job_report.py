"""What a per-clip job reports (gc25d_core.preprocess.runner): the job's progress across ranks, and a
rerun that skips every clip reported as a skip that keeps what the data is."""

from __future__ import annotations

from pathlib import Path

from gc25d_core.preprocess.runner import ClipTask, RankCounts, run_task
from gc25d_core.report import StdoutReporter, human_bytes

from .train.world import synthetic_row


class _Rows:
    def __init__(self, out: Path, num: int):
        self.out = out
        self.rows = [synthetic_row("R10_s1512", 96 * i, "train") for i in range(num)]

    def task(self) -> ClipTask:
        def path(row) -> Path:
            return self.out / f"{row.clip_id}.bin"

        def build(row) -> int:
            path(row).parent.mkdir(parents=True, exist_ok=True)
            path(row).write_bytes(b"x" * 1536)
            return 1536

        return ClipTask("toy", lambda r: [path(r)], lambda r: path(r).is_file(), build=build)


def test_a_rerun_that_skips_every_clip_says_so_and_keeps_the_data_size(tmp_path):
    rows = _Rows(tmp_path / "out", 3)
    rep = StdoutReporter(rank=0)
    first = run_task(rows.task(), rows.rows, rep, tmp_path / "run")
    assert (first["status"], first["num_built"], first["size"], first["written"]) == (
        "built",
        3,
        "4.5 KiB",
        "4.5 KiB",
    )
    assert first["clips_per_s"] > 0
    again = run_task(rows.task(), rows.rows, rep, tmp_path / "run")
    assert again["status"] == "skipped: every clip was built before"
    assert (again["num_built"], again["num_skipped"], again["size"]) == (0, 3, "4.5 KiB")
    assert not {"clips_per_s", "seconds", "written"} & set(again)  # no rate of a check
    assert rep.materializations[-1]["metadata"] == again


def test_progress_of_rank_0_counts_every_rank(tmp_path):
    folder = tmp_path / "progress"
    zero, one = RankCounts(folder, 0, 2, every_s=0), RankCounts(folder, 1, 2, every_s=0)
    one(4)
    assert zero(3) == 7 and one(5) == 5  # rank 0: the job's count; rank 1: its own
    assert zero(3) == 8


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 1023, 1536, 5 * 2**20, 3 * 2**40)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "5 MiB",
        "3 TiB",
    ]


def test_a_finished_job_is_recorded_and_found_only_while_its_files_stand(tmp_path):
    """The record the asset reads before a launch: the config, the index, the inputs and every
    output as the finished job left them; any change leaves the work to the job."""
    import dataclasses
    import os

    from gc25d_core.job_record import finished_job

    rows, run_dir = _Rows(tmp_path / "out", 3), tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("preset: toy\n")
    index, vae = tmp_path / "clips.jsonl", tmp_path / "vae.bin"
    index.write_text("{}\n")
    vae.write_bytes(b"weights")
    task = dataclasses.replace(rows.task(), inputs=(vae,))
    summary = run_task(task, rows.rows, StdoutReporter(rank=0), run_dir, index=index)
    assert finished_job(run_dir, "preset: toy\n") == summary
    assert finished_job(run_dir, "preset: other\n") is None

    def touched(path: Path) -> None:
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
        assert finished_job(run_dir, "preset: toy\n") is None
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert finished_job(run_dir, "preset: toy\n") == summary

    for path in (index, vae, rows.out / f"{rows.rows[1].clip_id}.bin"):
        touched(path)
    (rows.out / f"{rows.rows[2].clip_id}.bin").unlink()
    assert finished_job(run_dir, "preset: toy\n") is None
    # a job over some clips (--limit) keeps no record
    other = tmp_path / "run2"
    other.mkdir()
    run_task(rows.task(), rows.rows[:1], StdoutReporter(rank=0), other)
    assert not (other / "job_done.json").exists()
