"""SPEC §5 meta/<clip_id>.npz for every clip (sharded by rank, resumable).

torchrun --nproc_per_node=N -m gc25d_core.jobs.meta --config run.yaml --run-dir DIR
"""

from gc25d_core.jobs.preprocess import main_for
from gc25d_core.preprocess.tasks import meta_task

if __name__ == "__main__":
    main_for(meta_task, None)
