"""``python -m gc25d_core.jobs.train --stage sft``, under the module name README's commands use."""

from gc25d_core.jobs.train import main

if __name__ == "__main__":
    main("sft")
