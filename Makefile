# goep: make run runs the main job with 4 ranks; make test passes every test.
# Both install missing system packages first (scripts/install-deps.sh).

GO      ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.6.1
NP      ?= 4
MPIRUN  ?= mpirun
# More ranks than cores, and root (containers, CI), are normal here.
MPIRUN_FLAGS ?= --oversubscribe $(shell [ "$$(id -u)" = 0 ] && echo --allow-run-as-root)
# make test runs every multi-rank test once in each configuration that exercises a path of its own: 1
# and 2 ranks on one node and 4 ranks on 2 simulated nodes (every transport: shared memory, messages
# across nodes, the one-sided window), the race detector with cgo's pointer checks at 2 ranks. The long
# matrix (make test-long: every package at 4 and 8 ranks on one node and 8 on 2 and 4 simulated nodes,
# nodes of unequal size, the race detector across simulated nodes, and the rank counts below left to
# it) runs the same tests at more ranks; CI (.ci/run) runs make test, and leaves test-long to changes of
# rank counts, node shapes or launching (it takes 20 to 45 minutes on 2 cores).
#
# Packages whose tests also run under mpirun.
MPI_TEST_PKGS ?= ./mpi ./ep ./moe ./gpu
MPI_TEST_NP   ?= 1,2
MPI_TEST_SIM  ?= 4/2
# ep.CPUOneSided differs from ep.CPU only across nodes (its puts into the staging window): on one node
# its conformance run is ep.CPU's, so it runs where there are simulated nodes.
ONE_NODE_SKIP ?= TestConformanceCPUOneSided
# The GPU backend on the emulated device (the ep conformance suite, on NCCL's path and on the IPC
# transport) and the emulator: 2 simulated nodes of 2 take both transports, the one inside a node
# and the one across (40 to 50 s here), under cgo's strict pointer checks (test-cgocheck); 2 ranks on
# one node, a part of that, run in test-long.
MPI_TEST_EMU_PKGS ?= ./ep/epgpu ./gpu/emulator
MPI_TEST_EMU_NP   ?= ""
MPI_TEST_EMU_SIM  ?= 4/2
# Training runs (moe/runs: traces, checkpoints, resumes), whose gathering, writing and resharding is
# moe's State, tested at every rank count above, and the serving loop (moe/serve: served tokens
# against the reference, overlap on and off, a stalled rank masked for 1.2 s twice per run): 2 ranks
# and 2 simulated nodes of 2 (test-long: 1, 4 and 8).
MPI_TEST_JOB_PKGS ?= ./moe/runs ./moe/serve
MPI_TEST_JOB_NP   ?= 2
MPI_TEST_JOB_SIM  ?= 4/2

# The race detector (which also checks unsafe pointer arithmetic: checkptr) and cgo's strict pointer
# checks (GOEXPERIMENT=cgocheck2) in one build, on the multi-rank tests at 2 ranks (test-long: -race alone, at 2
# simulated nodes of 2), without ep's FP8 value sweeps (single-rank arithmetic that takes minutes
# under -race and runs in test-unit and test-mpi); the emulated GPU backend under cgocheck2 (above).
RACE_TEST_PKGS     ?= ./ep ./moe ./moe/runs ./mpi
RACE_TEST_SKIP     ?= TestQuantizeFloat32Sweep|TestE4M3FromMatchesReference|TestQuantizeEveryBF16Value

# Fuzz targets, each run for FUZZTIME by make test (their corpus: testdata/fuzz of their package; a
# crash found is written there and fails the run): routing input through a group, the layout kernel,
# and the C entry points' descriptors. FUZZTIME is a count of inputs (about 9 s each, idle), not a time:
# Go 1.26 fails a time-limited fuzz run whose deadline finds a worker mid-input on a loaded machine
# ("context deadline exceeded", golang/go#75804, fixed in Go 1.27), which a count has no deadline for.
FUZZTIME ?= 200000x

export GOEP_REQUIRE_TOOLS = 1

.PHONY: all deps deps-nvrtc deps-python deps-python-test build run hello test test-unit test-mpi test-race test-cgocheck test-capi test-snippets test-fuzz test-long capi bench-capi test-gpu test-slurm test-cluster lint clean

all: build

deps:
	@scripts/install-deps.sh

# NVRTC (Debian's libnvrtc11.2, non-free): gpu's TestKernelPTX compiles the CUDA kernels to PTX
# with it, no GPU needed, and under make test fails rather than skips without it.
deps-nvrtc:
	@scripts/install-deps.sh --nvrtc

# Debian's python3 with numpy, mpi4py and venv from apt, for the Python interface (make capi): not the
# first python3 on PATH, which may be another (pyenv's) without them; its tests add pytest and torch.
deps-python:
	@scripts/install-deps.sh --python

deps-python-test:
	@scripts/install-deps.sh --python --python-test

bin/ep-plot: deps FORCE
	$(GO) build -o $@ ./cmd/ep-plot

# The jobs users run live under cmd/, small examples under examples/.
bin/%: deps FORCE
	$(GO) build -tags mpi -o $@ ./$(if $(wildcard cmd/$*),cmd,examples)/$*

FORCE:

build: deps
	$(GO) build ./...
	$(GO) build -tags mpi ./...

# make run: train the toy MoE (cmd/moe-train) on $(NP) ranks, about a minute here;
# writes out/trace.h5 and out/ckpt-*.h5, a new run each time (-fresh: the previous run's files are
# moved to out/moved-aside/). Override e.g. RUN_MODE=ht RUN_DTYPE=bf16 RUN_STEPS=2000.
# RUN_DEVICE picks the ep backend (moe-train -device): cpu (ep's CPU engine), emulate (the GPU engine
# on the emulated device, no GPU needed) or cuda (each rank's GPU, with NCCL); with a device the
# ranks make the communicator's unique ID on rank 0 and hand it over MPI at start.
RUN_MODE   ?= ll
RUN_DTYPE  ?= f32
RUN_STEPS  ?= 6000
RUN_DEVICE ?= cpu
RUN_FLAGS ?= -device $(RUN_DEVICE) -mode $(RUN_MODE) -dtype $(RUN_DTYPE) -steps $(RUN_STEPS) -ckpt-every 1000 -progress-every 500 \
             -trace out/trace.h5 -ckpt-dir out -fresh

## run: the main job on $(NP) ranks.
run: bin/moe-train
	$(MPIRUN) $(MPIRUN_FLAGS) -np $(NP) bin/moe-train $(RUN_FLAGS)

hello: bin/mpi-hello
	$(MPIRUN) $(MPIRUN_FLAGS) -np $(NP) bin/mpi-hello

## test: formatting, vet, single-rank tests, the multi-rank tests under mpirun, some of them again
## with the race detector and cgo's strict pointer checks, the C and Python interfaces, and the fuzz
## targets for a bounded time: two at a time (TEST_JOBS), since the multi-rank tests spend a third of
## their time waiting (for stalled ranks, timeouts, launches), each one's output printed whole when it
## ends. The system packages are installed first, one apt-get at a time.
TEST_JOBS ?= 2
TEST_PARTS = test-mpi lint test-race test-unit test-cgocheck test-capi test-snippets test-fuzz
test: deps deps-nvrtc deps-python-test
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target $(TEST_PARTS)

# Builds without the checkout's path (-trimpath), so that a fresh clone reuses the build cache instead
# of compiling every cgo package again; staticcheck's own cache stays in the checkout, whose results
# carry its file paths (shared across checkouts, their positions would point into another one).
lint: export GOFLAGS := $(GOFLAGS) -trimpath
lint: export STATICCHECK_CACHE := $(CURDIR)/bin/lint-cache
lint: deps
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags mpi ./...
	@# staticcheck once per build configuration, merged, so that code used in one only is not "unused";
	@# the gpu and purego tags change only the packages named beside them (their files with those tags)
	@rm -rf bin/lint && mkdir -p bin/lint && for run in none:./... mpi:./... gpu,ci:./gpu/...,./ep/epgpu/... \
	    mpi,gpu:./gpu/...,./ep/epgpu/... purego:./internal/rowsum; do \
	  tags=$${run%%:*}; pkgs=$$(echo $${run#*:} | tr , ' '); \
	  $(GO) run $(STATICCHECK) -f binary -tags $$tags $$pkgs > bin/lint/$$tags.bin || exit 1; done
	$(GO) run $(STATICCHECK) -merge bin/lint/*.bin

test-unit: deps deps-nvrtc
	$(GO) test -count=1 ./...
	$(GO) test -count=1 -tags purego ./internal/rowsum # the Go loops that stand in for the assembly

test-mpi: deps
	$(GO) run ./internal/cmd/mpitest -np $(MPI_TEST_NP) -sim $(MPI_TEST_SIM) -skip-one-node '$(ONE_NODE_SKIP)' $(MPI_TEST_PKGS)
	$(GO) run ./internal/cmd/mpitest -np $(MPI_TEST_JOB_NP) -sim $(MPI_TEST_JOB_SIM) $(MPI_TEST_JOB_PKGS)

test-race: deps
	GOEXPERIMENT=cgocheck2 $(GO) run ./internal/cmd/mpitest -race -np 2 -sim "" -skip '$(RACE_TEST_SKIP)' $(RACE_TEST_PKGS)

test-cgocheck: deps
	GOEXPERIMENT=cgocheck2 $(GO) run ./internal/cmd/mpitest -np $(MPI_TEST_EMU_NP) -sim $(MPI_TEST_EMU_SIM) $(MPI_TEST_EMU_PKGS)

test-fuzz: deps
	$(GO) test -run '^$$' -fuzz '^FuzzDispatchInput$$' -fuzztime $(FUZZTIME) ./ep
	$(GO) test -run '^$$' -fuzz '^FuzzLayout$$' -fuzztime $(FUZZTIME) ./ep
	$(GO) test -tags mpi -run '^$$' -fuzz '^FuzzTensorDescriptor$$' -fuzztime $(FUZZTIME) ./capi
	$(GO) test -tags mpi -run '^$$' -fuzz '^FuzzConfigStructs$$' -fuzztime $(FUZZTIME) ./capi

## test-long: the long matrix, what make test leaves to it: every multi-rank package at 4 and 8 ranks on
## one node and at 8 on 2 and 4 simulated nodes; nodes of unequal size (2+2+1, 3+2), as Slurm gives 5 tasks on 2
## or 3 nodes; the race detector across 2 simulated nodes of 2; and the rank counts the training runs,
## the serving loop (1 and 4 ranks, 8 on 2 nodes) and the emulated GPU backend (1, 2 and 4 ranks) take only here.
test-long: deps
	$(GO) run ./internal/cmd/mpitest -np 4,8 -sim "" -skip '$(ONE_NODE_SKIP)' $(MPI_TEST_PKGS)
	$(GO) run ./internal/cmd/mpitest -np "" -sim 8/4,8/2 $(MPI_TEST_PKGS)
	$(GO) run ./internal/cmd/mpitest -np "" -sim 5/2,5/3 ./ep
	$(GO) run ./internal/cmd/mpitest -np "" -sim 5/2 ./moe ./moe/runs
	$(GO) run ./internal/cmd/mpitest -np 1,4 -sim 8/2 ./moe/runs
	$(GO) run ./internal/cmd/mpitest -np 1,4 -sim "" ./moe/serve
	$(GO) run ./internal/cmd/mpitest -np 1,2,4 -sim "" $(MPI_TEST_EMU_PKGS)
	$(GO) run ./internal/cmd/mpitest -race -np "" -sim 4/2 -skip '$(RACE_TEST_SKIP)' $(RACE_TEST_PKGS)

## capi: the C interface (docs/capi.md): bin/capi/libgoep_ep.so and libgoep_ep.a, whose API is
## capi/goep_ep.h, bin/capi/goep_ep.pc (pkg-config's flags for a program linked with them), and the C
## example, tests and benchmark; first what C and Python need (Open MPI; numpy, mpi4py, venv).
PYTHON      ?= /usr/bin/python3
MPICC       ?= mpicc
CAPI_CFLAGS ?= -std=c11 -O2 -Wall -Wextra -Werror -Icapi
CAPI_LINK   := -Lbin/capi -lgoep_ep -Wl,-rpath,'$$ORIGIN'
# The library's SONAME, which programs linked with it record (python/_build/goep_build.py builds the same).
CAPI_LDFLAGS := -extldflags=-Wl,-soname,libgoep_ep.so
CAPI_VERSION = $(shell awk '/^\#define GOEP_EP_(MAJOR|MINOR|PATCH) / { v = v s $$3; s = "." } END { print v }' capi/goep_ep.h)
capi: deps deps-python
	$(GO) build -tags mpi -buildmode=c-shared -ldflags='$(CAPI_LDFLAGS)' -o bin/capi/libgoep_ep.so ./capi
	$(GO) build -tags mpi -buildmode=c-archive -o bin/capi/libgoep_ep.a ./capi
	@# a program built with $$(pkg-config --cflags --libs goep_ep) finds the library from any directory
	@# (its run path is the library's directory), with no LD_LIBRARY_PATH
	printf '%s\n' 'libdir=$(CURDIR)/bin/capi' 'includedir=$(CURDIR)/capi' '' 'Name: goep_ep' \
	  'Description: goep expert-parallel dispatch and combine, C interface (compile with mpicc)' \
	  'Version: $(CAPI_VERSION)' 'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -lgoep_ep -Wl,-rpath,$${libdir}' \
	  > bin/capi/goep_ep.pc
	$(MPICC) $(CAPI_CFLAGS) -o bin/capi/ep_test capi/examples/ep_test.c $(CAPI_LINK)
	$(MPICC) $(CAPI_CFLAGS) -o bin/capi/ep_test_static capi/examples/ep_test.c bin/capi/libgoep_ep.a -lpthread -ldl -lm
	$(MPICC) $(CAPI_CFLAGS) -o bin/capi/ep_errors capi/tests/ep_errors.c $(CAPI_LINK)
	$(MPICC) $(CAPI_CFLAGS) -o bin/capi/ep_sequences capi/tests/ep_sequences.c $(CAPI_LINK)
	$(MPICC) $(CAPI_CFLAGS) -o bin/capi/ep_features capi/tests/ep_features.c $(CAPI_LINK) -lm
	$(MPICC) $(CAPI_CFLAGS) -o bin/capi/abi capi/tests/abi.c $(CAPI_LINK)
	$(MPICC) $(CAPI_CFLAGS) -o bin/capi/ep_bench_capi capi/bench/ep_bench_capi.c $(CAPI_LINK)

## test-capi: the C and Python interfaces under mpirun at 1, 2, 4 ranks and simulated nodes, and the
## quick start of README.md and docs/capi.md as written: the offline pip install of the Python package,
## a C program compiled with the documented line (scripts/capi/test-capi.sh); 2 to 7 minutes here.
test-capi: deps-python-test capi
	$(GO) test -count=1 -tags mpi ./capi
	PYTHON=$(PYTHON) MPIRUN=$(MPIRUN) GO=$(GO) scripts/capi/test-capi.sh

## test-snippets: every Go, C and Python snippet of README.md and docs/capi.md is lines of the complete
## program its marker names, and those programs build and give the values of their own reference at 2
## ranks (scripts/check-snippets.sh; about half a minute).
test-snippets: deps-python capi
	PYTHON=$(PYTHON) MPIRUN=$(MPIRUN) MPICC=$(MPICC) GO=$(GO) scripts/check-snippets.sh

## bench-capi: the cost of the C and Python boundaries against the same round in Go (JSON lines).
bench-capi: deps-python capi
	PYTHON=$(PYTHON) MPIRUN=$(MPIRUN) scripts/capi/bench-boundary.sh

## test-gpu: build the GPU tests (-tags gpu; no GPU needed to build) into bin/gpu/, stripped, with the
## device command that runs them (scripts/gpu/run-on-device.sh): package gpu's (device, kernels, NCCL),
## the kernels against a device copy, the ep conformance suite on the CUDA backend (epgpu), ep-bench
## -device cuda and moe-train -device cuda against -device cpu, with the HDF5 library and what it links
## in bin/gpu/lib/ for a machine that has none; then the command's dry run here. Carry bin/gpu/ to a GPU
## machine (no Go needed there) and run bin/gpu/run-on-device.sh; it fails, never skips, without a GPU.
test-gpu: deps
	$(GO) vet -tags gpu ./gpu ./ep/epgpu
	$(GO) vet -tags 'gpu mpi' ./gpu ./ep/epgpu
	$(GO) test -c -tags gpu -ldflags '-s -w' -o bin/gpu/gpu.test ./gpu
	$(GO) test -c -tags 'gpu mpi' -ldflags '-s -w' -o bin/gpu/gpu-mpi.test ./gpu
	$(GO) test -c -tags gpu -ldflags '-s -w' -o bin/gpu/epgpu.test ./ep/epgpu
	$(GO) test -c -tags 'gpu mpi' -ldflags '-s -w' -o bin/gpu/epgpu-mpi.test ./ep/epgpu
	$(GO) build -tags mpi -ldflags '-s -w' -o bin/gpu/ep-bench ./cmd/ep-bench
	$(GO) build -ldflags '-s -w' -o bin/gpu/ep-bench-1rank ./cmd/ep-bench
	$(GO) build -tags mpi -ldflags '-s -w' -o bin/gpu/moe-train ./cmd/moe-train
	$(GO) build -ldflags '-s -w' -o bin/gpu/moe-train-1rank ./cmd/moe-train
	$(GO) build -ldflags '-s -w' -o bin/gpu/gpu-info ./internal/cmd/gpu-info
	@# moe-train writes HDF5: the HDF5 library and everything it links but glibc, for a GPU machine
	@# without them
	rm -rf bin/gpu/lib && mkdir -p bin/gpu/lib && ldd bin/gpu/moe-train-1rank | \
	  awk '$$2 == "=>" && $$3 ~ /^\// { print $$3 }' | grep -vE '/lib(c|m|pthread|dl|rt|resolv)\.so' | xargs -r cp -L -t bin/gpu/lib
	cp scripts/gpu/run-on-device.sh bin/gpu/
	@# the device command's dry run: every section walked, the binaries and test names checked
	bin/gpu/run-on-device.sh --dry-run

## test-slurm: a real 2-node Slurm cluster (root): mpi-hello by srun and sbatch+mpirun, the training
## (train.sbatch) and a small scaling study (study.sbatch) by srun and mpirun; 1.5-2 min. The nodes
## are emulated hosts with their own network (scripts/cluster, one slurmd each); SLURM_TEST_FLAGS=--local
## simulates both nodes on this machine instead (where network namespaces are not available).
SLURM_TEST_FLAGS ?= --net
test-slurm:
	GO=$(GO) scripts/slurm/test-slurm.sh $(SLURM_TEST_FLAGS)

## test-cluster: goep across emulated hosts with their own network (root): scripts/cluster/cluster.sh brings
## up 4 hosts (network namespaces on a bridge, links capped at 10 Gbit/s); mpi-hello and the mpi test
## binary run under mpirun across 2x2, 4x1 and 2+2+1 ranks per host, the ep test binary across 2+2+1
## (its dispatch and combine checks across 2x2 and 4x1 too), moe's and moe/runs' across 2+2+1 (most of
## them across 2x2 and 4x1 too), a short training and ep-bench LL and HT against alltoallv across 2 hosts; then it
## comes down and nothing may be left.
test-cluster: deps
	GO=$(GO) scripts/cluster/test-cluster.sh

clean:
	rm -rf bin out
