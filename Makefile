# gc25d: setup / run / test / lint. Everything runs from the repo root inside .venv.
VENV      ?= .venv
PY        := $(VENV)/bin/python
PIP       := $(PY) -m pip
# dg (dagster-dg-cli) reads the project from pyproject.toml's [tool.dg]
DG        := $(VENV)/bin/dg
# dg warns on every call unless VIRTUAL_ENV names the project's .venv: every command here runs from
# that venv's bin/ without activating it, so say so
export VIRTUAL_ENV := $(abspath $(VENV))
# The instance: dagster.yaml in this folder, used in place (its state lands beside it: history/,
# schedules/, storage/). `dg dev` runs in the project root and warns that a dagster.yaml there is
# ignored unless DAGSTER_HOME is that root. Another DAGSTER_HOME (e.g. one holding
# dagster.postgres.yaml, docs/scaleout.md) is used as it is.
export DAGSTER_HOME ?= $(CURDIR)
INSTANCE_STATE := history schedules storage .nux .logs_queue .telemetry
# deepspeed JIT-compiles a small C++ op on first CPU use; keep the build cache in the repo
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions
export DIFFSYNTH_SKIP_DOWNLOAD := True
export HF_HUB_OFFLINE := 1
# The embedded default's numbers (the teacher's table, the eval's) are the same on every AMD EPYC box:
# ATen's vectorised kernels, MKL's GEMMs, oneDNN's convolutions and NumPy's OpenBLAS (the code
# world's and the camera's float64 maths) take AVX2 code paths, not the widest the CPU has (AVX-512
# sums round differently, and the 400-step CPU SFT carries that to the tables' digits: 4.2 % against
# 15.7 % cond below uncond at t = 500 on two boxes). tests/__init__.py pins the same for the tests.
# MKL honours its branch pin on Intel CPUs only (its cross-vendor branch, COMPATIBLE, is SSE2 and
# ≈ 2.6x slower on these GEMMs), and there its AVX2 mode is strict, as the tests need it (plain AVX2
# picks a GEMM kernel by the GEMM's shape, and the tests hold two code paths bit for bit): one pin,
# so make run's numerics are the tests'. An Intel box's run-to-run digits came from MKL's first-call
# race on several threads, which every process now settles before it computes
# (gc25d_core.numerics.resolve_vml_dispatch; docs/learning_signal.md, "`make run` on an Intel
# Xeon", session 47).
# Override with e.g. `make run ATEN_CPU_CAPABILITY=avx512`.
export ATEN_CPU_CAPABILITY ?= avx2
export MKL_CBWR ?= AVX2,STRICT
export ONEDNN_MAX_CPU_ISA ?= AVX2
export OPENBLAS_CORETYPE ?= Haswell

.PHONY: setup instance run sft dev play services test test-gpu lint validate clean

# Fresh venv with pinned torch (constraints.txt) so diffsynth's torchvision cannot pull a CUDA torch.
# Last, DeepSpeed's CPU collectives op is compiled (≈ 35 s, into TORCH_EXTENSIONS_DIR) rather than
# inside the first training job of `make run`.
setup:
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	DS_BUILD_OPS=0 $(PIP) install -q -c constraints.txt -e '.[dev,scaleout]'
	$(PY) -c "import gc25d_core, gc25d_pipeline.definitions; print('gc25d setup ok')"
	DS_ACCELERATOR=cpu $(PY) -c "from gc25d_core.train.zero2 import build_cpu_comm_op as b; print('DeepSpeed CPU comm op:', b())"

# Materialize the whole graph on the embedded default (tiny preset, CPU): the unpartitioned chain up
# to a published training-cache snapshot, then that snapshot's partition, which the sensors launch
# in a deployment: deep verification → SFT teacher → §10 pick → stage 1 → stage 2 → stage 3 → deploy
# export → eval. Prints the teacher's validation figures (cond vs uncond at t=500 / 800) and the
# eval table across the chain.
CHAIN := key:cache_snapshot+
# make run's steps run one after another inside the launch's process (the in-process executor): a
# step's own process would spend seconds importing the code location before it starts, on every
# step of a rerun that has nothing to do; the heavy work is in torchrun jobs either way
IN_PROCESS := --config-json '{"execution": {"config": {"in_process": {}}}}'
# Last, where the wall time went: every run since the start, with its steps' times and statuses
# (printed after a failure too; make's status is still the chain's).
run: instance
	start=$$(date +%s); \
	$(PY) -m gc25d_pipeline.cli check-config && \
	$(DG) launch --job full_chain $(IN_PROCESS) && \
	snap=$$($(PY) -m gc25d_pipeline.cli sync-snapshots) && \
	$(DG) launch --assets $(CHAIN) --partition $$snap $(IN_PROCESS) && \
	$(PY) -m gc25d_pipeline.cli learning-signal $$snap && \
	$(PY) -m gc25d_pipeline.cli eval-table $$snap; \
	rc=$$?; $(PY) -m gc25d_pipeline.cli timeline --since $$start; exit $$rc

# SFT teacher + pick on the newest snapshot only (tiny preset: 400 steps on 2 CPU ranks), then its
# validation figures (cond vs uncond).
sft: instance
	$(PY) -m gc25d_pipeline.cli check-config
	snap=$$($(PY) -m gc25d_pipeline.cli sync-snapshots) && \
	$(DG) launch --assets sft,sft_teacher --partition $$snap $(IN_PROCESS) && \
	$(PY) -m gc25d_pipeline.cli learning-signal $$snap

# The UI (webserver + daemon) on http://127.0.0.1:3000 (DEV_PORT=...). Ctrl-C / SIGTERM, also in the
# background, stops its runs (CANCELED: not retried) and every process under it (gc25d_pipeline/lib/dev.py).
dev: instance
	$(PY) -m gc25d_pipeline.cli check-config
	$(PY) -m gc25d_pipeline.lib.dev -- $(DG) dev -h 127.0.0.1 -p $(or $(DEV_PORT),3000)

# The live page on http://127.0.0.1:8765: the newest causal export `make run` (and the stages after
# it) left under outputs/tiny (deploy_export, stage 3 / 2 EMA, stage 1), keys in, frames out.
play:
	$(PY) -m gc25d_core.deploy serve --preset tiny

validate: instance
	$(DG) check defs

# Without a dagster.yaml in DAGSTER_HOME Dagster falls back to its defaults (no run queue, no gpu
# pool, no retries) with only a warning; stop instead.
instance:
	@test -f "$(DAGSTER_HOME)/dagster.yaml" || \
	  { echo "DAGSTER_HOME=$(DAGSTER_HOME) holds no dagster.yaml (unset it for this folder's)" >&2; exit 1; }

# Real local services for the scale-out tests (Slurm, PostgreSQL); as root, idempotent.
services:
	bash .ci/services.sh

# The suite on TEST_JOBS processes (pytest-xdist), a test file to a process: a file's module fixtures
# are built once, and its tests that share a real service, a port or a run folder stay in order. Most
# tests wait on launched processes, so two processes on two cores overlap them (docs/benchmarks.md);
# TEST_JOBS=0 runs it in this one process. OMP_WAIT_POLICY=PASSIVE: an OpenMP thread that waits sleeps
# instead of spinning, which two processes' fixed-thread fits (the tiny VAE's 2 threads) otherwise
# spend on each other's cores (two such tests side by side: 78 s each spinning, 29 s passive; one alone
# 20 s against 31). The results do not depend on it.
TEST_JOBS ?= 2
test:
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -q -n $(TEST_JOBS) --dist loadfile

test-gpu:
	$(PY) -m pytest -q -m "gpu and not fa4"

lint:
	$(VENV)/bin/ruff check gc25d_core gc25d_pipeline tests bench
	$(VENV)/bin/ruff format --check gc25d_core gc25d_pipeline tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# the tiny preset's data and runs and the instance's state (runs, event logs, ticks), not its dagster.yaml
clean:
	rm -rf data/tiny outputs/tiny $(addprefix $(DAGSTER_HOME)/,$(INSTANCE_STATE))
