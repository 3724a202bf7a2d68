"""SPEC §5 latents/<clip_id>.pt through the Wan2.2 VAE (sharded by rank, resumable, pipelined).

torchrun --nproc_per_node=8 -m gc25d_core.jobs.latents --config run.yaml --run-dir DIR
"""

from gc25d_core.jobs.preprocess import main_for
from gc25d_core.preprocess.tasks import latents_task

if __name__ == "__main__":
    main_for(latents_task)
