import dagster as dg

from gc25d_pipeline.lib.launchers import launcher_from_env
from gc25d_pipeline.lib.project import default_project


@dg.definitions
def resources() -> dg.Definitions:
    project = default_project()
    # the embedded default is a one-node TorchrunLauncher; GC25D_LAUNCHER_CONFIG picks another
    launcher = launcher_from_env(project.config())
    return dg.Definitions(resources={"project": project, "torchrun": launcher})
