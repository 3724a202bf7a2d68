"""SPEC §5 cond_ext/<clip_id>.npz for every clip with has_ext (sharded by rank, resumable).

torchrun --nproc_per_node=N -m gc25d_core.jobs.cond_ext --config run.yaml --run-dir DIR
"""

from gc25d_core.jobs.preprocess import main_for
from gc25d_core.preprocess.tasks import cond_ext_task

if __name__ == "__main__":
    main_for(cond_ext_task, lambda r: r.has_ext)
