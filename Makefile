# visc: one library (libvisc.a), one program (visc), tests, benchmarks, fuzzers.
# `make` builds the program, `make test` runs the suite, `make asan` runs it
# under AddressSanitizer + UndefinedBehaviorSanitizer. Optional components
# are detected, never assumed.
CC      ?= gcc
BUILD   ?= build
OPT     ?= -O3 -g
WARN    := -Wall -Wextra -Wshadow -Wpointer-arith -Wstrict-prototypes -Wmissing-prototypes \
           -Wno-unused-parameter -Wvla
ifeq ($(WERROR),1)
WARN    += -Werror
endif
# -fno-trapping-math: no code here reads the floating-point exception flags,
# and with GCC's default an operation written in one arm of a select is not
# computed speculatively, so loops such as GELU's and softmax's did not
# vectorize without AVX-512's masks (GELU was 27% of a small ViT's step on
# an AVX2 CPU). It changes no result: the rounding of every operation stays.
# -ffp-contract=fast: a * b + c as one FMA where the target has it (the
# AVX2 and AVX-512 clones), as GCC does by default in its GNU modes; -std=c11
# turns it off, and the AVX2 clones of GELU, softmax and layer norm then ran
# multiplies and adds apart. Results move by an FMA's single rounding.
CFLAGS  += -std=c11 -D_GNU_SOURCE -Iinclude -fopenmp -fno-trapping-math -ffp-contract=fast $(OPT) $(WARN) $(SANFLAGS) \
           -MMD -MP
# Except in the optimizers: each operation of a step is rounded on its own
# (-ffp-contract=off), so a step gives the same bits on every CPU, with FMA
# or without, and on the GPU, whose kernels spell each rounding
# (src/cuda/optim.cu); test_cuda_kernels holds SGD and AdamW to that. With
# contraction, adamw.c's AVX2 clone fused m * beta1 + (1 - beta1) * g and
# its steps differed from the GPU's in the last bit (found by the kernels'
# run on the emulator, tests/gpu/emu). A step reads and writes memory; an
# FMA saves it nothing.
$(BUILD)/src/optim/%.o: CFLAGS += -ffp-contract=off
LDLIBS  += -ldnnl -ljpeg -lpng -lz -lm -lpthread -ldl
LDFLAGS += -fopenmp $(SANFLAGS)

LIB_SRC   := $(shell find src -name '*.c' ! -path 'src/cli/*' ! -path 'src/dist/mpi/*' ! -path 'src/swarm/*' | sort)
CLI_SRC   := $(sort $(wildcard src/cli/*.c))
TEST_SRC  := $(sort $(wildcard tests/test_*.c))

# The swarm (src/swarm/) is a library of its own, build/libvisc_swarm.a,
# because its DHT links OpenDHT, which is GPL-3 (libsodium is ISC). It is
# built when both are installed (libopendht-c-dev, libsodium-dev); SWARM=0
# builds visc without it (no `visc swarm`, no --swarm).
ifndef SWARM
SWARM := $(shell test -f /usr/include/opendht/opendht_c.h && test -f /usr/include/sodium.h && echo 1 || echo 0)
endif
ifeq ($(SWARM),1)
SWARM_SRC := $(sort $(wildcard src/swarm/*.c))
SWARM_LIB := $(BUILD)/libvisc_swarm.a
CFLAGS    += -DVISC_WITH_SWARM
LDLIBS    += -lopendht-c -lsodium
else
TEST_SRC  := $(filter-out tests/test_swarm_%,$(TEST_SRC))
endif
SWARM_OBJ := $(SWARM_SRC:%.c=$(BUILD)/%.o)

# The CUDA backend (src/cuda/*.cu behind include/visc/cuda.h) is a library
# of its own, build/libvisc_cuda.a, compiled by nvcc for one GPU generation
# (CUDA_ARCH=90: H100/H200), which keeps its build short. Built when nvcc
# (on PATH, or CUDA_HOME/bin) and cuBLASLt's header are installed; CUDA=0
# builds without it. visc links the CUDA runtime statically, which loads
# the driver (libcuda.so.1) at the first CUDA call, and opens cuBLASLt with
# dlopen at the first matrix product (src/cuda/cublaslt_dl.cu; linked, its
# 540 MB made every start of visc 10x slower): visc starts on a machine
# without a GPU driver, and only a command that asks for the GPU (`visc
# devices`) says that there is none.
ifndef NVCC
NVCC := $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
endif
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_LIBDIR ?= $(CUDA_HOME)/lib64
ifndef CUDA
CUDA := $(shell test -n "$(NVCC)" && test -f $(CUDA_HOME)/include/cublasLt.h && echo 1 || echo 0)
endif
ifeq ($(CUDA),1)
CUDA_ARCH   ?= 90
CUDA_SRC    := $(sort $(wildcard src/cuda/*.cu))
CUDA_OBJ    := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
CUDA_LIB    := $(BUILD)/libvisc_cuda.a
# -lineinfo: compute-sanitizer's reports name the source line (no cost at run time).
CUDA_FLAGS  := -std=c++17 -O3 -lineinfo -gencode arch=compute_$(CUDA_ARCH),code=sm_$(CUDA_ARCH) \
               -DVISC_CUDA_SM=$(CUDA_ARCH) -DVISC_CUDA_LIBDIR='"$(CUDA_LIBDIR)"' \
               -Iinclude -I$(CUDA_HOME)/include \
               -Xcompiler -Wall,-Wextra,-Wshadow,-Wno-unused-parameter -MMD -MP $(NVCC_EXTRA)
ifeq ($(WERROR),1)
CUDA_FLAGS  += -Werror all-warnings -Xcompiler -Werror
endif
CUDA_LDLIBS := -L$(CUDA_LIBDIR) -lcudart_static -lrt -ldl -lpthread -lstdc++
CFLAGS      += -DVISC_WITH_CUDA
GPU_TEST    := $(BUILD)/tests/gpu/test_cuda_kernels
GPU_MODEL_TEST := $(BUILD)/tests/gpu/test_cuda_model
endif
# What every program links: the engine, then (src/gpu/ calls into it) the
# CUDA backend where it is built, then the engine once more for what the
# backend calls back (errors, optimizer names).
ENGINE := $(BUILD)/libvisc.a $(CUDA_LIB)
ENGINE_LDLIBS = $(if $(CUDA_LIB),$(BUILD)/libvisc.a) $(LDLIBS) $(CUDA_LDLIBS)
BENCH_SRC := $(sort $(wildcard bench/*.c))

LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ   := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all test test-long asan bench clean tests deps demo test-gpu test-gpu-model test-gpu-model-emu
.SECONDARY:
all: $(BUILD)/visc $(MPI_PLUGIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(CUDA_FLAGS) -c $< -o $@

# The MPI backend (src/dist/mpi/), a plugin loaded only by runs that mpirun
# started, so visc itself never links libmpi. Built when Open MPI's
# compiler wrapper is installed (libopenmpi-dev); without it visc runs
# alone and says how to get it when launched by mpirun.
MPICC := $(shell command -v mpicc 2>/dev/null)
ifneq ($(MPICC),)
MPI_PLUGIN := $(BUILD)/libvisc_mpi.so
$(MPI_PLUGIN): src/dist/mpi/mpi_backend.c src/dist/backend.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE -fPIC -shared $(OPT) $(WARN) $(shell mpicc --showme:compile) \
	    $< -o $@ $(shell mpicc --showme:link)
endif

$(BUILD)/libvisc.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libvisc_swarm.a: $(SWARM_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/libvisc_cuda.a: $(CUDA_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/visc: $(CLI_OBJ) $(SWARM_LIB) $(ENGINE)
	$(CC) $(LDFLAGS) $^ -o $@ $(ENGINE_LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/tests/harness.o $(SWARM_LIB) $(ENGINE)
	$(CC) $(LDFLAGS) $^ -o $@ $(ENGINE_LDLIBS)

# Programs that are not suites but that the multi-process swarm tests and
# benchmarks start (tests/swarm_*.c: a peer, a DHT node).
ifeq ($(SWARM),1)
TOOL_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(sort $(wildcard tests/swarm_*.c)))
$(TOOL_BIN): $(BUILD)/tests/%: $(BUILD)/tests/%.o $(SWARM_LIB) $(ENGINE)
	$(CC) $(LDFLAGS) $^ -o $@ $(ENGINE_LDLIBS)
endif

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(ENGINE)
	$(CC) $(LDFLAGS) $^ -o $@ $(ENGINE_LDLIBS)

# Diagnostics (tools/diag/*.c): programs that measure something the
# README quotes, not tests; built with the tests so that they keep building.
DIAG_BIN := $(patsubst tools/diag/%.c,$(BUILD)/tools/%,$(sort $(wildcard tools/diag/*.c)))
$(DIAG_BIN): $(BUILD)/tools/%: $(BUILD)/tools/diag/%.o $(ENGINE)
	$(CC) $(LDFLAGS) $^ -o $@ $(ENGINE_LDLIBS)

tests: $(TEST_BIN) $(TOOL_BIN) $(DIAG_BIN) $(BUILD)/visc $(MPI_PLUGIN) $(GPU_TEST) $(GPU_MODEL_TEST)

# Missing Debian packages are installed first (tools/install_deps.sh).
deps:
	@bash tools/install_deps.sh

# The test suite: every tests/test_*.c binary, then the end-to-end scripts.
test: deps
	@$(MAKE) --no-print-directory tests
	@VISC=$(BUILD)/visc bash tests/run.sh $(BUILD)/tests

# The full-length training runs (tests/long.sh: the 4- and 12-epoch
# Fashion-MNIST accuracies, the transformers' 85%, MoCo v2's kNN gain):
# about an hour on 2 cores without AVX-512; make test runs their short forms.
test-long: deps
	@$(MAKE) --no-print-directory all tests
	@VISC=$(BUILD)/visc bash tests/long.sh

# The main job: train the default model on Fashion-MNIST.
demo: deps
	@$(MAKE) --no-print-directory all
	$(BUILD)/visc train --config configs/fashion_mnist.ini

# The GPU kernels against their CPU twins (tests/gpu/test_cuda_kernels.c),
# on a machine with a GPU; without one the program says so, exits 77, and
# this reports "skipped: no GPU" (GPU_REQUIRED=1 makes that a failure: the
# device check). The program links the CPU twins' objects rather than
# libvisc.a, so it builds where oneDNN and the image libraries are absent.
ifeq ($(CUDA),1)
GPU_REF_OBJ := $(patsubst %,$(BUILD)/src/%.o,core/error core/memory core/table nn/layernorm \
               nn/gelu nn/loss nn/loss_soft nn/batchnorm2d nn/pool2d nn/global_pool nn/eltwise \
               optim/optimizer optim/sgd optim/adamw optim/lamb optim/lars optim/clip optim/ema \
               nn/token_ops nn/droppath nn/layerscale core/rng models/talking_heads \
               models/swin_window transforms/to_tensor)
$(GPU_TEST): $(BUILD)/tests/gpu/test_cuda_kernels.o $(CUDA_LIB) $(GPU_REF_OBJ)
	$(CC) $(LDFLAGS) $^ -o $@ -lm $(CUDA_LDLIBS)
# Whole models on the GPU against the CPU (tests/gpu/test_cuda_model.c):
# the whole engine, oneDNN included.
$(GPU_MODEL_TEST): $(BUILD)/tests/gpu/test_cuda_model.o $(ENGINE)
	$(CC) $(LDFLAGS) $^ -o $@ $(ENGINE_LDLIBS)
endif

# The GPU plumbing on a stand-in GPU (tests/gpu/cpu_standin.c: cuda.h's
# calls done by the CPU layers on host memory), in every build, so that CI,
# which has no GPU, runs the GPU code path of src/gpu/ and the models:
# test_gpu_standin (test_cuda_model.c held to zero difference) and
# visc_standin (the whole program, tests/e2e_gpu_standin.sh). src/gpu/ is
# compiled again with the backend's calls in (VISC_WITH_CUDA), and these
# objects come before libvisc.a, so its own copies are not linked.
STANDIN_DIR := $(BUILD)/tests/gpu/standin
STANDIN_OBJ := $(patsubst src/gpu/%.c,$(STANDIN_DIR)/%.o,$(sort $(wildcard src/gpu/*.c))) \
               $(STANDIN_DIR)/cpu_standin.o $(STANDIN_DIR)/standin_nhwc.o \
               $(STANDIN_DIR)/standin_nccl.o
STANDIN_BIN := $(BUILD)/tests/gpu/test_gpu_standin $(BUILD)/tests/gpu/visc_standin
$(STANDIN_DIR)/%.o: src/gpu/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DVISC_WITH_CUDA -c $< -o $@
$(STANDIN_DIR)/cpu_standin.o $(STANDIN_DIR)/standin_nhwc.o $(STANDIN_DIR)/standin_nccl.o: \
    $(STANDIN_DIR)/%.o: tests/gpu/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
$(STANDIN_DIR)/test_cuda_model.o: tests/gpu/test_cuda_model.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DVISC_GPU_STANDIN -c $< -o $@
$(BUILD)/tests/gpu/test_gpu_standin: $(STANDIN_DIR)/test_cuda_model.o $(STANDIN_OBJ) \
                                     $(BUILD)/libvisc.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/tests/gpu/visc_standin: $(CLI_OBJ) $(SWARM_LIB) $(STANDIN_OBJ) $(BUILD)/libvisc.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)
tests: $(STANDIN_BIN)

test-gpu:
ifeq ($(CUDA),1)
	@$(MAKE) --no-print-directory $(GPU_TEST)
	@$(GPU_TEST); rc=$$?; \
	if [ $$rc -eq 77 ]; then echo "test-gpu: skipped: no GPU"; [ "$(GPU_REQUIRED)" != 1 ]; \
	else exit $$rc; fi
else
	@echo "test-gpu: skipped: this build has no CUDA backend (no nvcc or cuBLASLt, or CUDA=0)"
	@[ "$(GPU_REQUIRED)" != 1 ]
endif

# The models on the GPU against the CPU (needs the whole engine's
# libraries, oneDNN too).
test-gpu-model:
ifeq ($(CUDA),1)
	@$(MAKE) --no-print-directory $(GPU_MODEL_TEST)
	@$(GPU_MODEL_TEST); rc=$$?; \
	if [ $$rc -eq 77 ]; then echo "test-gpu-model: skipped: no GPU"; [ "$(GPU_REQUIRED)" != 1 ]; \
	else exit $$rc; fi
else
	@echo "test-gpu-model: skipped: this build has no CUDA backend"
	@[ "$(GPU_REQUIRED)" != 1 ]
endif

asan:
	$(MAKE) BUILD=build-asan OPT="-O1 -g -fno-omit-frame-pointer" \
	    SANFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" test

bench: $(BENCH_BIN) $(BUILD)/visc

clean:
	rm -rf build build-asan build-cov

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# Quality gates (coverage, static analysis, formatting, fuzzing): mk/quality.mk
-include mk/quality.mk
include mk/emu.mk
