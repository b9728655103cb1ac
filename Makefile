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
CFLAGS  += -std=c11 -D_GNU_SOURCE -Iinclude -fopenmp $(OPT) $(WARN) $(SANFLAGS) -MMD -MP
LDLIBS  += -ldnnl -ljpeg -lpng -lz -lm -lpthread -ldl
LDFLAGS += -fopenmp $(SANFLAGS)

LIB_SRC   := $(shell find src -name '*.c' ! -path 'src/cli/*' ! -path 'src/dist/mpi/*' | sort)
CLI_SRC   := $(sort $(wildcard src/cli/*.c))
TEST_SRC  := $(sort $(wildcard tests/test_*.c))
BENCH_SRC := $(sort $(wildcard bench/*.c))

LIB_OBJ   := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ   := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_BIN  := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

.PHONY: all test asan bench clean tests deps demo
.SECONDARY:
all: $(BUILD)/visc $(MPI_PLUGIN)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

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

$(BUILD)/visc: $(CLI_OBJ) $(BUILD)/libvisc.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(BUILD)/tests/harness.o $(BUILD)/libvisc.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(BUILD)/libvisc.a
	$(CC) $(LDFLAGS) $^ -o $@ $(LDLIBS)

tests: $(TEST_BIN) $(BUILD)/visc $(MPI_PLUGIN)

# Missing Debian packages are installed first (tools/install_deps.sh).
deps:
	@bash tools/install_deps.sh

# The test suite: every tests/test_*.c binary, then the end-to-end scripts.
test: deps
	@$(MAKE) --no-print-directory tests
	@VISC=$(BUILD)/visc bash tests/run.sh $(BUILD)/tests

# The main job: train the default model on Fashion-MNIST.
demo: deps
	@$(MAKE) --no-print-directory all
	$(BUILD)/visc train --config configs/fashion_mnist.ini

asan:
	$(MAKE) BUILD=build-asan OPT="-O1 -g -fno-omit-frame-pointer" \
	    SANFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" test

bench: $(BENCH_BIN) $(BUILD)/visc

clean:
	rm -rf build build-asan build-cov

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# Quality gates (coverage, static analysis, formatting, fuzzing): mk/quality.mk
-include mk/quality.mk
