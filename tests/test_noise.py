"""The code location loads and launches without warnings about our own use of Dagster.

Each check runs in a fresh interpreter that turns every warning into an error, except Dagster's
DeprecationWarnings about its own modules (pyproject.toml's pytest filterwarnings says why), so a
deprecated or preview API that the project calls fails here instead of printing on every launch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg
import yaml

ROOT = Path(__file__).resolve().parent.parent

STRICT = (
    "import warnings\n"
    "warnings.simplefilter('error')\n"
    "warnings.filterwarnings('ignore', category=DeprecationWarning, module=r'dagster\\.')\n"
)

# A Pipes session like every torchrun asset's (lib/launcher.py opens one per launch): Dagster's own
# Pipes code reads a preview property there, which gc25d_pipeline.definitions filters by name.
PIPES_SESSION = """
import sys
import dagster as dg
import gc25d_pipeline.definitions

CHILD = (
    "from dagster_pipes import open_dagster_pipes\\n"
    "with open_dagster_pipes() as p:\\n"
    "    p.report_asset_materialization(metadata={'x': 1})\\n"
)

@dg.asset
def probe(context: dg.AssetExecutionContext, pipes: dg.PipesSubprocessClient):
    return pipes.run(command=[sys.executable, "-c", CHILD], context=context).get_materialize_result()

assert dg.materialize([probe], resources={"pipes": dg.PipesSubprocessClient()}).success
print("PIPES OK")
"""


def _strict(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", STRICT + code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_code_location_loads_without_warnings():
    proc = _strict(
        "import dagster as dg\n"
        "from gc25d_pipeline.definitions import defs\n"
        "dg.Definitions.validate_loadable(defs)\n"
        "print('LOADED', len(list(defs.resolve_asset_graph().get_all_asset_keys())))\n"
    )
    assert proc.returncode == 0 and "LOADED" in proc.stdout, proc.stdout + proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr


def test_pipes_session_prints_no_preview_warning():
    proc = _strict(PIPES_SESSION)
    assert proc.returncode == 0 and "PIPES OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PreviewWarning" not in proc.stdout + proc.stderr


# A job's own reporter over Pipes (rank 0 of a torchrun job): per-step metrics, progress, materialize.
REPORTING_CHILD = """
from gc25d_core.report import open_reporter
with open_reporter() as rep:
    rep.log("fitting: 2 steps")
    for step in (1, 2):
        rep.metrics(step=step, loss=0.5 / step)
    bar = rep.progress(total=2, unit="steps", every_s=0.0)
    bar.update()
    bar.update()
    rep.materialize({"steps": 2})
"""


def test_a_run_on_the_instance_prints_info_and_progress_not_debug(capfd):
    """On the instance of dagster.yaml a job prints its own lines at info, progress with rate and
    ETA among them, but neither Dagster's per-step bookkeeping nor the per-step metrics (at debug:
    they are the run folder's metrics.jsonl); the run's event log still has every Dagster event."""

    @dg.asset
    def reporting(context, pipes: dg.PipesSubprocessClient):
        context.log.info("asset info line")
        return pipes.run(
            command=[sys.executable, "-c", REPORTING_CHILD], context=context, cwd=str(ROOT)
        ).get_materialize_result()

    instance_config = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    defs = dg.Definitions(assets=[reporting], resources={"pipes": dg.PipesSubprocessClient()})
    with dg.instance_for_test(overrides=instance_config) as instance:
        result = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance)
        assert result.success
        logs = instance.all_logs(result.run_id)
    out, err = capfd.readouterr()
    terminal = out + err
    assert "asset info line" in terminal and "fitting: 2 steps" in terminal
    assert "steps 2/2 (" in terminal and "ETA" in terminal  # progress stays on the terminal
    for hidden in (" - DEBUG - ", '"loss": 0.5', "RESOURCE_INIT_STARTED", "LOGS_CAPTURED", "STEP_OUTPUT"):
        assert hidden not in terminal, (hidden, terminal)
    kept = {e.dagster_event.event_type_value for e in logs if e.dagster_event}
    assert {"STEP_START", "STEP_OUTPUT", "ASSET_MATERIALIZATION", "STEP_SUCCESS"} <= kept, kept


def test_other_ranks_do_not_repeat_progress(capsys):
    """Rank 0 reports the job's progress; rank 1's own lines still reach stderr."""
    from gc25d_core.report import StdoutReporter

    r1 = StdoutReporter(rank=1)
    bar = r1.progress(total=2, unit="clips", every_s=0.0)
    bar.update()
    bar.update()
    r1.log("rank 1 found a stale temp file")
    r1.log("rank 1 failed a clip", level="error")
    err = capsys.readouterr().err
    assert "clips 1/2" not in err and "clips 2/2" not in err, err
    assert "[rank 1] info: rank 1 found a stale temp file" in err
    assert "[rank 1] error: rank 1 failed a clip" in err
