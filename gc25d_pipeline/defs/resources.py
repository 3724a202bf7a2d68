import dagster as dg

from gc25d_pipeline.lib.project import default_project
from gc25d_pipeline.lib.torchrun import TorchrunLauncher


@dg.definitions
def resources() -> dg.Definitions:
    project = default_project()
    cfg = project.config()
    launcher = TorchrunLauncher(nproc_per_node=cfg.distributed.nproc_per_node, nnodes=cfg.distributed.nnodes)
    return dg.Definitions(resources={"project": project, "torchrun": launcher})
