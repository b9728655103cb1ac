# Quality gates, included at the end of the Makefile. Each gate is a script
# in tools/ci/ that CI calls directly; these targets are the same scripts
# under shorter names, plus the fuzz build they rely on.
#   make coverage      gcov build in build-cov/, whole suite, per-folder report, floor
#   make static        zero-warning -Werror build + cppcheck (+ clang-tidy)
#   make format-check  clang-format --dry-run --Werror over our sources
#   make format        reformat our sources in place (same file list)
#   make fuzz          libFuzzer targets in build-fuzz/fuzz/ (clang, ASan+UBSan)
#   make fuzz-smoke    each fuzz target for FUZZ_SECONDS on a copy of its corpus
#   make gates         all of the above in CI's order, with each gate's time
.PHONY: coverage static format-check format fuzz fuzz-bins fuzz-smoke gates

coverage:
	@bash tools/ci/coverage.sh
static:
	@bash tools/ci/static.sh
format-check:
	@bash tools/ci/format_check.sh
format:
	@bash tools/ci/format_check.sh --fix
fuzz-smoke:
	@bash tools/ci/fuzz_smoke.sh
gates:
	@bash tools/ci/gates.sh

# The fuzz targets link against a libvisc built by clang with the same
# sanitizers and libFuzzer's coverage hooks (fuzzer-no-link), so mutations
# are guided by the parser's own branches; only the final link adds
# libFuzzer's main. No parser runs on a GPU: CUDA=0 keeps nvcc out. -fno-sanitize-recover makes any UBSan report a crash.
FUZZ_BUILD := build-fuzz
FUZZ_SAN   := -fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined
FUZZ_SRC   := $(sort $(wildcard fuzz/fuzz_*.c))
ifneq ($(SWARM),1)
FUZZ_SRC   := $(filter-out fuzz/fuzz_swarm_%,$(FUZZ_SRC))
endif
FUZZ_BIN   := $(FUZZ_SRC:fuzz/%.c=$(BUILD)/fuzz/%)

fuzz:
	$(MAKE) CC=clang CUDA=0 BUILD=$(FUZZ_BUILD) OPT="-O1 -g -fno-omit-frame-pointer -Wno-pass-failed" \
	    SANFLAGS="$(FUZZ_SAN)" fuzz-bins

fuzz-bins: $(FUZZ_BIN)

# A static pattern rule, so it cannot be mistaken for the rule of the objects.
$(FUZZ_BIN): $(BUILD)/fuzz/%: $(BUILD)/fuzz/%.o $(SWARM_LIB) $(ENGINE)
	$(CC) $(LDFLAGS) -fsanitize=fuzzer $^ -o $@ $(ENGINE_LDLIBS)
