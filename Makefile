# triton-edge-kit. The first target you run creates .venv and installs the kit into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SPEC   ?= deploy.yaml
REPO   ?= model_repository
STAMP  := $(VENV)/.installed-stamp
SAMPLE := models/edge_mlp.onnx

.PHONY: help setup demo test configs serve infer sample-model validate lint clean loadtest sweep loadtest-ui bench tune deploy engines gpu-check wheelhouse

help:
	@echo "make demo      the whole loop on this machine (real tritonserver on the CPU)"
	@echo "make test      the test suite"
	@echo "make configs   generate $(REPO)/ from $(SPEC)"
	@echo "make serve     serve $(SPEC)'s models locally until Ctrl-C"
	@echo "make infer     one request to the served model (MODEL=edge_mlp)"
	@echo "make validate  check $(SPEC) and its ONNX files"
	@echo "make loadtest  measure MODEL at RPS req/s (exact percentiles, server breakdown) into out/loadtest"
	@echo "make loadtest-ui  Locust web UI on :8089 against the served model (MODEL=edge_mlp; make serve first)"
	@echo "make sweep     batch-size sweep of MODEL at RPS req/s: CSV, JSON, plots, report in out/sweep"
	@echo "make bench     9 of the 14 benchmarks, as ratios, into out/bench (over an hour on 2 cores): serving,"
	@echo "              footprint, generators, overload, refusal, floor, tuner, peer, routing. The other five"
	@echo "              run Model Analyzer, many whole tunings or long workloads; run each on its own: tritonkit"
	@echo "              bench versus, mix, remote, ablation and buckets (docs/benchmarks.md)"
	@echo "make tune      tune MODEL's config from measured P95 (trials, report, tuned.yaml) into out/tune"
	@echo "make deploy    build engines (GPU), generate configs, helm upgrade --install into the current kube context"
	@echo "              (DRY_RUN=1: only render and check the manifests, into out/deploy; TUNE=1: also run the chart's"
	@echo "              tune Job on the node and write tuned.yaml; APPLY=1 with TUNE=1: then deploy the tuned configs)"
	@echo "make engines   prepare, verify and plan each model; TensorRT engines where a GPU is present"
	@echo "make gpu-check on an NVIDIA machine: build, verify and time the sample model's engine"
	@echo "make wheelhouse  every wheel the base install needs, into $(WHEELHOUSE)/ (offline installs, the kit image)"
	@echo "make clean     remove everything generated"

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/tritonkit perf-analyzer
	@touch $@

setup: $(STAMP)

$(SAMPLE): | $(STAMP)
	$(BIN)/tritonkit sample-model --out $@

sample-model: $(SAMPLE)

demo: $(STAMP)
	$(BIN)/tritonkit demo --spec $(SPEC) --repo $(REPO)

test: $(STAMP)
	$(BIN)/pytest

validate: $(STAMP) $(SAMPLE)
	$(BIN)/tritonkit validate --spec $(SPEC)

configs: $(STAMP) $(SAMPLE)
	$(BIN)/tritonkit configs --spec $(SPEC) --out $(REPO)

serve: $(STAMP) $(SAMPLE)
	$(BIN)/tritonkit serve --spec $(SPEC) --repo $(REPO)

MODEL ?= edge_mlp
infer: $(STAMP)
	$(BIN)/tritonkit infer --model $(MODEL)

RPS ?= 400
DURATION ?= 10
SHAPE ?= constant
loadtest: $(STAMP) $(SAMPLE)
	$(BIN)/tritonkit loadtest --spec $(SPEC) --repo $(REPO) --model $(MODEL) --rps $(RPS) --duration $(DURATION) \
		--shape $(SHAPE) --class interactive:1:1 --class bulk:3:2

sweep: $(STAMP) $(SAMPLE)
	$(BIN)/tritonkit sweep --spec $(SPEC) --repo $(REPO) --model $(MODEL) --rps $(RPS) --duration $(DURATION)

# 9 of the 14 benchmarks (docs/benchmarks.md), over an hour on 2 cores. The tuner's bench runs an
# exhaustive grid as well (about half an hour); the floor bench measures how closely one config's
# figure agrees with itself here (about ten minutes); the peer bench runs Model Analyzer's quick
# search (at most 15 minutes) and judges its winner. Left out, each run on its own as
# `tritonkit bench NAME --out out/bench`: versus (Model Analyzer and the tuner on four cases, about
# an hour), mix (three models tuned alone and together, 25 minutes), remote (three whole tunings and
# the judge), ablation (the tuner's rules switched off; --case and --real need real tunings).
bench: $(STAMP) $(SAMPLE)
	$(BIN)/tritonkit bench serving --out out/bench
	$(BIN)/tritonkit bench footprint --out out/bench
	$(BIN)/tritonkit bench generators --out out/bench
	$(BIN)/tritonkit bench overload --spec $(SPEC) --model $(MODEL) --out out/bench
	$(BIN)/tritonkit bench refusal --spec $(SPEC) --model $(MODEL) --out out/bench
	$(BIN)/tritonkit bench floor --spec $(SPEC) --model $(MODEL) --out out/bench
	$(BIN)/tritonkit bench tuner --spec $(SPEC) --model $(MODEL) --out out/bench
	$(BIN)/tritonkit bench peer --spec $(SPEC) --model $(MODEL) --out out/bench
	$(BIN)/tritonkit bench routing --out out/bench

tune: $(STAMP) $(SAMPLE)
	$(BIN)/tritonkit tune --spec $(SPEC) --repo $(REPO) --model $(MODEL) --out out/tune

LOCUST_HOST ?= http://127.0.0.1:8000
loadtest-ui: $(STAMP)
	TRITONKIT_MODEL=$(MODEL) $(BIN)/locust -f loadtests/locustfile.py --host $(LOCUST_HOST)

# Values come from the deploy block of $(SPEC); the chart is helm/triton-edge.
deploy: $(STAMP) $(SAMPLE)
	$(BIN)/tritonkit deploy --spec $(SPEC) --repo $(REPO) $(if $(DRY_RUN),--dry-run --out out/deploy) $(if $(TUNE),--tune)$(if $(APPLY), --apply)

engines: $(STAMP) $(SAMPLE)
	$(BIN)/tritonkit build --spec $(SPEC) --out $(REPO)

gpu-check: $(STAMP)
	$(BIN)/pip install --quiet -e '.[gpu]'  # TensorRT for this machine's own build (the node builds its own)
	$(BIN)/python -m tritonkit.build_engines.gpu_check

# The kit's wheel and every wheel its base install needs (no extras), for a box without network:
# pip install --no-index --find-links $(WHEELHOUSE) triton-edge-kit (README, "Installing").
# Wheels are for this machine's Python and architecture; build it where those match the box.
WHEELHOUSE ?= wheelhouse
wheelhouse: $(STAMP)
	$(BIN)/pip wheel --quiet --wheel-dir $(WHEELHOUSE) .
	# the last tritonclient wheel with bin/perf_analyzer for the kit image (Containerfile)
	$(BIN)/pip download --quiet --no-deps --only-binary=:all: --dest $(WHEELHOUSE)/perf_analyzer tritonclient==2.51.0
	@ls $(WHEELHOUSE)/*.whl | wc -l | xargs echo "wheels in $(WHEELHOUSE)/:"

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(REPO)/*/ .tritonkit models out tuned.yaml $(WHEELHOUSE)
