"""The code location loads and launches without warnings about our own use of Dagster.

Each check runs in a fresh interpreter that turns every warning into an error, except Dagster's
DeprecationWarnings about its own modules (pyproject.toml's pytest filterwarnings says why), so a
deprecated or preview API that the project calls fails here instead of printing on every launch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
