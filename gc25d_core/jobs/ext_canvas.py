"""SPEC §8 stage 3 cond_ext_canvas/<clip_id>.npz for every clip whose look changes at s+81
(sharded by rank, resumable). Needs cond, meta (and cond_ext, for its blocks and prompts) first.

    torchrun --nproc_per_node=N -m gc25d_core.jobs.ext_canvas --config run.yaml --run-dir DIR
"""

from gc25d_core.jobs.preprocess import main_for
from gc25d_core.preprocess.canvas_task import ext_canvas_task

if __name__ == "__main__":
    main_for(ext_canvas_task, lambda r: r.ext_look_change)
