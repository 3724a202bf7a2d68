"""SPEC §5 cond/<clip_id>.npz for every clip (sharded by rank, resumable).

torchrun --nproc_per_node=N -m gc25d_core.jobs.cond --config run.yaml --run-dir DIR
"""

from gc25d_core.jobs.preprocess import main_for
from gc25d_core.preprocess.tasks import cond_task

if __name__ == "__main__":
    main_for(cond_task, None)
