# The CUDA backend's kernels on the CPU (tests/gpu/emu/, see emu.h): each
# src/cuda/NAME.cu rewritten by tests/gpu/emu/cu2cpp.sh and compiled by the
# host's C++ compiler against the emulator, linked with the kernels' test
# (tests/gpu/test_cuda_kernels.c) into build/tests/test_cuda_kernels_emu,
# which `make test` runs like any suite: CI, which has no GPU, runs the
# real kernels against their CPU twins. The backend's own loaders
# (cublaslt_dl.cu, cudnn_dl.cu) open the emulator's cuBLASLt and cuDNN,
# built under the real libraries' names into $(EMU_DIR)/lib, which the
# program's RPATH puts before every other place the loader looks. Built
# where the CUDA headers are (the same condition as the backend's: nvcc and
# cuBLASLt; cuDNN's header too).
ifeq ($(CUDA),1)
ifneq ($(wildcard $(CUDA_HOME)/include/cudnn.h),)
CXX          ?= g++
EMU_DIR      := $(BUILD)/emu
EMU_LIBDIR   := $(abspath $(EMU_DIR)/lib)
EMU_CU_HDR   := $(patsubst src/cuda/%,$(EMU_DIR)/src/cuda/%,$(wildcard src/cuda/*.cuh))
EMU_CU_SRC   := $(patsubst src/cuda/%,$(EMU_DIR)/src/cuda/%,$(CUDA_SRC))
EMU_OBJ      := $(EMU_CU_SRC:%.cu=%.o) $(EMU_DIR)/emu_runtime.o
LT_MAJOR     := $(shell sed -n 's/^\#define CUBLAS_VER_MAJOR \([0-9]*\).*/\1/p' $(CUDA_HOME)/include/cublas_api.h)
DNN_MAJOR    := $(shell sed -n 's/^\#define CUDNN_MAJOR \([0-9]*\).*/\1/p' $(CUDA_HOME)/include/cudnn_version.h)
EMU_LIBS     := $(EMU_DIR)/lib/libcublasLt.so.$(LT_MAJOR) $(EMU_DIR)/lib/libcudnn.so.$(DNN_MAJOR)
EMU_TEST     := $(BUILD)/tests/test_cuda_kernels_emu
EMU_MODEL_TEST := $(BUILD)/tests/gpu/test_cuda_model_emu
# Not instrumented for coverage (tools/ci/coverage.sh): the figure is the
# engine's C code in src/, as before the emulator; the kernels' lines would
# come in through the rewritten sources' #line. The sanitizers do apply.
# No floating-point contraction: the _rn intrinsics and the kernels'
# arithmetic round each operation, as nvcc's code does where it matters
# (the kernels that must match the CPU bit for bit spell their roundings
# with __fmul_rn and friends).
# (The coverage build's -O0/-O1 would only slow them: there they keep -O2.)
EMU_OPT      := $(if $(findstring --coverage,$(SANFLAGS)),-O2 -g,$(OPT))
EMU_CXXFLAGS := -std=c++17 $(EMU_OPT) $(filter-out --coverage,$(SANFLAGS)) -ffp-contract=off -Wall -Wno-unused-parameter \
                -Wno-unused-function -Wno-unknown-pragmas -Wno-sign-compare -Iinclude -I$(CUDA_HOME)/include -include tests/gpu/emu/emu.h \
                -DVISC_CUDA_SM=$(CUDA_ARCH) -DVISC_CUDA_LIBDIR='"$(EMU_LIBDIR)"' -MMD -MP

$(EMU_DIR)/src/cuda/%: src/cuda/% tests/gpu/emu/cu2cpp.sh
	@bash tests/gpu/emu/cu2cpp.sh $< $@
$(EMU_DIR)/src/cuda/%.o: $(EMU_DIR)/src/cuda/%.cu $(EMU_CU_HDR) tests/gpu/emu/emu.h tests/gpu/emu/emu_wmma.h
	$(CXX) $(EMU_CXXFLAGS) -x c++ -c $< -o $@
$(EMU_DIR)/emu_runtime.o: tests/gpu/emu/emu_runtime.cpp tests/gpu/emu/emu.h tests/gpu/emu/emu_wmma.h
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
$(EMU_DIR)/lib/libcublasLt.so.$(LT_MAJOR): tests/gpu/emu/emu_cublaslt.cpp
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O3 -g -fPIC -shared -Wall -I$(CUDA_HOME)/include \
	    -Wl,-soname,$(notdir $@) $< -o $@
$(EMU_DIR)/lib/libcudnn.so.$(DNN_MAJOR): tests/gpu/emu/emu_cudnn.cpp
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O3 -g -fPIC -shared -Wall -I$(CUDA_HOME)/include \
	    -Wl,-soname,$(notdir $@) $< -o $@
$(EMU_TEST): $(BUILD)/tests/gpu/test_cuda_kernels.o $(GPU_REF_OBJ) $(EMU_OBJ) | $(EMU_LIBS)
	$(CXX) $(LDFLAGS) $^ -o $@ -lm -ldl -lpthread -Wl,--disable-new-dtags,-rpath,$(EMU_LIBDIR)
# Whole models (tests/gpu/test_cuda_model.c) on the emulated GPU: the
# engine, src/gpu/ and every kernel together, against the CPU. Built with
# the tests, run by `make test-gpu-model-emu` and not by `make test`: it
# takes tens of minutes on the emulator (ResNet-20 alone 7).
$(EMU_MODEL_TEST): $(BUILD)/tests/gpu/test_cuda_model.o $(BUILD)/libvisc.a $(EMU_OBJ) | $(EMU_LIBS)
	$(CXX) $(LDFLAGS) $^ $(BUILD)/libvisc.a -o $@ $(LDLIBS) -Wl,--disable-new-dtags,-rpath,$(EMU_LIBDIR)
# Not in the sanitizer build (`make asan`): there the kernel test took over
# 25 minutes and had not left the convolutions (the fibers themselves work
# under AddressSanitizer: the pooling, batch-norm and Swin groups pass),
# more than CI's sanitizer pass can spend. Not in the coverage build either
# (tools/ci/coverage.sh): the kernels are not instrumented (above), and the
# CPU twins' lines it reaches, the rest of the suite reaches too: of the
# 883 lines of src/ it ran by itself, each had a larger count in a whole
# coverage pass (a fresh clone's, 2026-12-05) than the kernel test alone
# gives it, so every one is reached by another test too: the figure is the
# same (95.7%) without its 103 s (148 s on the AVX2 machine). The plain
# pass (`make test`) runs it.
ifeq ($(findstring sanitize=address,$(SANFLAGS))$(findstring --coverage,$(SANFLAGS)),)
tests: $(EMU_TEST) $(EMU_MODEL_TEST)
endif
test-gpu-model-emu: $(EMU_MODEL_TEST)
	$(EMU_MODEL_TEST)
endif
endif
