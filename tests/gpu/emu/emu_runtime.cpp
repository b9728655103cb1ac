/* emu_runtime.cpp: the emulator's launches and the CUDA runtime calls the
 * backend makes (emu.h says what the emulator is for).
 *
 * A launch runs its blocks in order on the calling thread. The first block
 * runs as fibers, one per thread; if none of them reached a barrier or a
 * shuffle, the kernel needs no switching and the other blocks' threads
 * run as plain calls, one after another (most kernels: elementwise, grid-
 * stride). Otherwise every block runs as fibers: each fiber runs until it
 * waits (a barrier, a shuffle) or ends, and a wait is released once every
 * thread it names is waiting at the same point. A wait that can never be
 * released (a thread ended or waits elsewhere) is a kernel error: on a GPU
 * it hangs or is undefined. Device memory is host memory from
 * aligned_alloc (256-byte aligned, as cudaMalloc's); copies check that
 * their device side lies in an allocation. Streams and events are
 * accepted and everything runs at once, in the order it was asked. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>

#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "emu.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace visc_emu {

thread_local const thread_pos *current;

/* ---- errors: a failed launch, or a kernel that misbehaved, is sticky ---- */
static std::mutex error_lock;
static cudaError_t sticky = cudaSuccess; /* a kernel fault: every later call fails */
static thread_local cudaError_t last = cudaSuccess;

static void kernel_fault(const char *kernel, const char *what, const thread_pos *p) {
    std::lock_guard<std::mutex> g(error_lock);
    if (p)
        fprintf(stderr, "visc-emu: kernel %s, block (%u,%u,%u) thread (%u,%u,%u): %s\n", kernel,
                p->block.x, p->block.y, p->block.z, p->thread.x, p->thread.y, p->thread.z, what);
    else fprintf(stderr, "visc-emu: kernel %s: %s\n", kernel, what);
    sticky = cudaErrorLaunchFailure;
    last = cudaErrorLaunchFailure;
}
static cudaError_t status(cudaError_t e) {
    if (sticky != cudaSuccess) return sticky;
    if (e != cudaSuccess) last = e;
    return e;
}

/* ---- fibers ---- */
enum fiber_state { READY, AT_BARRIER, AT_WARP, DONE };
enum warp_op { WARP_SYNC, WARP_SHUFFLE };
#define STACK_BYTES ((size_t)256 << 10)

/* A switch between fibers: on x86-64 the callee-saved registers, MXCSR
 * and the x87 control word pushed on the old stack and popped from the new
 * one (glibc's swapcontext also saves the signal mask with two system
 * calls, which made it 85% of the emulator's time); elsewhere ucontext. */
#if defined(__x86_64__)
extern "C" void visc_emu_switch(void **save_sp, void *new_sp);
asm(".text\n"
    ".globl visc_emu_switch\n"
    ".type visc_emu_switch,@function\n"
    "visc_emu_switch:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n"
    "    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    subq $8, %rsp\n    stmxcsr (%rsp)\n    fnstcw 4(%rsp)\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    ldmxcsr (%rsp)\n    fldcw 4(%rsp)\n    addq $8, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n"
    "    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size visc_emu_switch,.-visc_emu_switch\n");
#define EMU_OWN_SWITCH 1
#endif

struct fiber {
#ifdef EMU_OWN_SWITCH
    void *sp;
#else
    ucontext_t ctx;
#endif
    thread_pos pos;
    int linear; /* thread index within the block */
    fiber_state state;
    warp_op op;
    unsigned mask;
    int src_lane;
    uint64_t value, result;
    void *stack;
};

struct block_run {
    const char *kernel;
    void (*body)(void *);
    void *arg;
    std::vector<fiber> fibers;
    int used_sync; /* any barrier or shuffle reached: the kernel needs fibers */
    int failed;
#ifdef EMU_OWN_SWITCH
    void *scheduler_sp;
#else
    ucontext_t scheduler;
#endif
    std::vector<std::pair<const void *, void *>> shared_arrays;
    void *dynamic;
    size_t dynamic_bytes;
#ifdef EMU_ASAN
    const void *main_stack_bottom;
    size_t main_stack_size;
#endif
};
static thread_local block_run *run_now; /* the block in progress */
static thread_local fiber *fiber_now;   /* NULL: a plain call, no switching possible */
static thread_local std::vector<void *> stack_pool;

static void *stack_get(void) {
    if (!stack_pool.empty()) {
        void *s = stack_pool.back();
        stack_pool.pop_back();
        return s;
    }
    void *s = mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED) {
        fprintf(stderr, "visc-emu: out of memory for a thread's stack\n");
        abort();
    }
    return s;
}

/* Into a fiber from the scheduler, and back. */
static void switch_to_fiber(block_run *b, fiber *f) {
    fiber_now = f;
    current = &f->pos;
#ifdef EMU_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, f->stack, STACK_BYTES);
#endif
#ifdef EMU_OWN_SWITCH
    visc_emu_switch(&b->scheduler_sp, f->sp);
#else
    swapcontext(&b->scheduler, &f->ctx);
#endif
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
    fiber_now = NULL;
}
static void switch_to_scheduler(int ended) {
    block_run *b = run_now;
    fiber *f = fiber_now;
#ifdef EMU_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(ended ? NULL : &fake, b->main_stack_bottom, b->main_stack_size);
#else
    (void)ended;
#endif
#ifdef EMU_OWN_SWITCH
    visc_emu_switch(&f->sp, b->scheduler_sp);
#else
    swapcontext(&f->ctx, &b->scheduler);
#endif
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}
static void fiber_entry(void) {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &run_now->main_stack_bottom, &run_now->main_stack_size);
#endif
    run_now->body(run_now->arg);
    fiber_now->state = DONE;
    switch_to_scheduler(1);
}

/* Whether the environment variable `name` is `value` (read once per call
 * site: *cache starts at -1). */
static int env_is(int *cache, const char *name, const char *value) {
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = e && strcmp(e, value) == 0;
    }
    return *cache;
}
static int reverse_order(void) {
    static int r = -1;
    return env_is(&r, "VISC_EMU_ORDER", "reverse");
}
static int always_fibers(void) {
    static int r = -1;
    return env_is(&r, "VISC_EMU_FIBERS", "1");
}

static void make_pos(thread_pos *p, const launch_config &c, uint3 block, int linear) {
    p->block = block;
    p->block_dim = c.block;
    p->grid_dim = c.grid;
    p->thread.x = (unsigned)linear % c.block.x;
    p->thread.y = (unsigned)linear / c.block.x % c.block.y;
    p->thread.z = (unsigned)linear / (c.block.x * c.block.y);
}

static void shared_reset(block_run *b) {
    for (auto &s : b->shared_arrays) free(s.second);
    b->shared_arrays.clear();
    if (b->dynamic) memset(b->dynamic, 0xff, b->dynamic_bytes);
}

/* Releases a warp group whose every lane waits with the same mask and op;
 * 1 if one was released, 0 if none can be, -1 on a misuse (reported). */
static int release_warps(block_run *b) {
    const int n = (int)b->fibers.size();
    for (int i = 0; i < n; i++) {
        fiber *f = &b->fibers[i];
        if (f->state != AT_WARP) continue;
        const int base = i / 32 * 32;
        int ready = 1;
        for (int lane = 0; lane < 32; lane++) {
            if (!(f->mask >> lane & 1)) continue;
            const int t = base + lane;
            if (t >= n) {
                kernel_fault(b->kernel, "a warp operation names a lane the block does not have",
                             &f->pos);
                return -1;
            }
            fiber *g = &b->fibers[t];
            if (g->state == DONE) {
                kernel_fault(b->kernel,
                             "a warp operation waits for a lane that has returned (it never "
                             "arrives: undefined on a GPU)",
                             &f->pos);
                return -1;
            }
            if (g->state != AT_WARP) ready = 0;
            else if (g->mask != f->mask || g->op != f->op) {
                kernel_fault(b->kernel,
                             "lanes of one warp wait at different warp operations (masks or "
                             "kinds differ)",
                             &f->pos);
                return -1;
            }
        }
        if (!ready) continue;
        for (int lane = 0; lane < 32; lane++) {
            if (!(f->mask >> lane & 1)) continue;
            fiber *g = &b->fibers[base + lane];
            if (g->op == WARP_SHUFFLE) {
                const int src = g->src_lane;
                if (src < 0 || src >= 32 || !(f->mask >> src & 1)) {
                    kernel_fault(b->kernel, "a shuffle reads a lane outside its mask", &g->pos);
                    return -1;
                }
                g->result = b->fibers[base + src].value;
            }
        }
        for (int lane = 0; lane < 32; lane++)
            if (f->mask >> lane & 1) b->fibers[base + lane].state = READY;
        return 1;
    }
    return 0;
}

/* Runs one block as fibers; 0, or -1 after a kernel fault. */
static int run_block_fibers(block_run *b, const launch_config &c, uint3 block) {
    const int n = (int)(c.block.x * c.block.y * c.block.z);
    b->fibers.resize((size_t)n);
    for (int t = 0; t < n; t++) {
        fiber *f = &b->fibers[t];
        make_pos(&f->pos, c, block, t);
        f->linear = t;
        f->state = READY;
        f->stack = stack_get();
#ifdef EMU_OWN_SWITCH
        /* what visc_emu_switch pops: MXCSR and the x87 control word (the
         * defaults), six registers, then fiber_entry as the return address
         * above a null one, so fiber_entry starts with the stack aligned as
         * after a call */
        uint64_t *sp = (uint64_t *)((char *)f->stack + STACK_BYTES);
        *--sp = 0;
        *--sp = (uint64_t)(uintptr_t)fiber_entry;
        for (int r = 0; r < 6; r++) *--sp = 0;
        *--sp = 0x1f80u | (uint64_t)0x37fu << 32;
        f->sp = sp;
#else
        getcontext(&f->ctx);
        f->ctx.uc_stack.ss_sp = f->stack;
        f->ctx.uc_stack.ss_size = STACK_BYTES;
        f->ctx.uc_link = NULL;
        makecontext(&f->ctx, fiber_entry, 0);
#endif
    }
    int rc = 0;
    const int rev = reverse_order();
    for (;;) {
        int ran = 0;
        for (int k = 0; k < n; k++) {
            fiber *f = &b->fibers[rev ? n - 1 - k : k];
            if (f->state != READY) continue;
            switch_to_fiber(b, f);
            ran = 1;
        }
        int done = 0, at_barrier = 0;
        for (int t = 0; t < n; t++) {
            done += b->fibers[t].state == DONE;
            at_barrier += b->fibers[t].state == AT_BARRIER;
        }
        if (done == n) break;
        const int w = release_warps(b);
        if (w < 0) {
            rc = -1;
            break;
        }
        if (w > 0) continue;
        if (at_barrier == n) {
            for (int t = 0; t < n; t++) b->fibers[t].state = READY;
            continue;
        }
        if (at_barrier > 0 && at_barrier + done == n) {
            kernel_fault(b->kernel,
                         "__syncthreads waits for threads that have returned (undefined on a "
                         "GPU: the barrier must be reached by the whole block)",
                         NULL);
            rc = -1;
            break;
        }
        if (!ran) {
            kernel_fault(b->kernel,
                         "deadlock: threads wait at a __syncthreads and at a warp operation that "
                         "other threads never reach",
                         NULL);
            rc = -1;
            break;
        }
    }
    for (auto &f : b->fibers) stack_pool.push_back(f.stack);
    return rc;
}

static int guards_intact(const char *after);

static int check_config(const launch_config &c, const char *kernel) {
    const size_t threads = (size_t)c.block.x * c.block.y * c.block.z;
    const char *bad = NULL;
    if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0 || threads == 0)
        bad = "an empty grid or block";
    else if (threads > 1024 || c.block.z > 64) bad = "more than 1024 threads a block";
    else if (c.grid.y > 65535 || c.grid.z > 65535 || c.grid.x > 2147483647u)
        bad = "a grid beyond the device's limits";
    else if (c.shared_bytes > 48 * 1024)
        bad = "more than 48 KB of dynamic shared memory (needs cudaFuncSetAttribute)";
    if (!bad) return 0;
    fprintf(stderr,
            "visc-emu: launch of %s refused: %s (grid %u,%u,%u block %u,%u,%u, %zu "
            "bytes shared)\n",
            kernel, bad, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y, c.block.z,
            c.shared_bytes);
    last = cudaErrorInvalidConfiguration;
    return -1;
}

void run(const launch_config &c, const char *kernel, void (*body)(void *), void *arg) {
    if (sticky != cudaSuccess || check_config(c, kernel)) return;
    block_run b;
    b.kernel = kernel;
    b.body = body;
    b.arg = arg;
    b.used_sync = 0;
    b.failed = 0;
    b.dynamic_bytes = c.shared_bytes;
    b.dynamic = c.shared_bytes ? malloc(c.shared_bytes) : NULL;
    block_run *outer = run_now;
    const thread_pos *outer_pos = current;
    run_now = &b;
    const size_t blocks = (size_t)c.grid.x * c.grid.y * c.grid.z;
    const int n = (int)(c.block.x * c.block.y * c.block.z);
    const int rev = reverse_order();
    int fibers = 1; /* the first block always: it tells whether the kernel switches */
    for (size_t k = 0; k < blocks; k++) {
        const size_t i = rev ? blocks - 1 - k : k;
        const uint3 block = {(unsigned)(i % c.grid.x), (unsigned)(i / c.grid.x % c.grid.y),
                             (unsigned)(i / ((size_t)c.grid.x * c.grid.y))};
        shared_reset(&b);
        if (fibers) {
            if (run_block_fibers(&b, c, block)) break;
            if (!b.used_sync && !always_fibers()) fibers = 0;
            continue;
        }
        thread_pos pos;
        for (int t = 0; t < n && !b.failed; t++) {
            make_pos(&pos, c, block, rev ? n - 1 - t : t);
            current = &pos;
            body(arg);
        }
        if (b.failed) break;
    }
    shared_reset(&b);
    free(b.dynamic);
    run_now = outer;
    current = outer_pos;
    guards_intact(kernel);
}

/* A barrier or shuffle reached outside a fiber: the first block reached
 * none, so the launch went on without fibers. */
void misuse(const char *what) {
    if (run_now && !run_now->failed) {
        kernel_fault(run_now->kernel, what, current);
        run_now->failed = 1;
    }
}

static int switching_possible(void) {
    if (fiber_now) {
        run_now->used_sync = 1;
        return 1;
    }
    misuse("reached a barrier or warp operation that the grid's first block never reached (run "
           "with VISC_EMU_FIBERS=1)");
    return 0;
}

void sync_block(void) {
    if (!switching_possible()) return;
    fiber_now->state = AT_BARRIER;
    switch_to_scheduler(0);
}

int lane_id(void) { return (int)(fiber_now ? fiber_now->linear % 32 : current->thread.x % 32); }

void sync_warp(unsigned mask) {
    if (!switching_possible()) return;
    fiber_now->state = AT_WARP;
    fiber_now->op = WARP_SYNC;
    fiber_now->mask = mask;
    switch_to_scheduler(0);
}

uint64_t shuffle(unsigned mask, uint64_t value, int src_lane) {
    if (!switching_possible()) return value;
    fiber *f = fiber_now;
    f->state = AT_WARP;
    f->op = WARP_SHUFFLE;
    f->mask = mask;
    f->value = value;
    f->src_lane = src_lane;
    switch_to_scheduler(0);
    return f->result;
}

void *shared(const void *key, size_t bytes, size_t align) {
    block_run *b = run_now;
    for (auto &s : b->shared_arrays)
        if (s.first == key) return s.second;
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes)) abort();
    memset(p, 0xff, bytes);
    b->shared_arrays.push_back({key, p});
    return p;
}

void *dynamic_shared(void) { return run_now->dynamic; }

/* ---- device memory: what was allocated, so copies can be checked ---- */
static std::mutex mem_lock;
static std::map<uintptr_t, size_t> allocations;
static size_t allocated;
static const size_t device_bytes = (size_t)141 << 30; /* an H200's */
/* Behind every allocation (past its 256-byte rounding), GUARD bytes of
 * GUARD_BYTE that nothing may write: checked after every launch, copy and
 * library call's next launch, and at cudaFree. */
#define GUARD 256
#define GUARD_BYTE 0xa5
static size_t rounded(size_t bytes) { return (bytes + 255) / 256 * 256; }

/* 0, or -1 after reporting the first allocation whose guard was written. */
static int guards_intact(const char *after) {
    std::lock_guard<std::mutex> g(mem_lock);
    for (const auto &a : allocations) {
        const unsigned char *guard = (const unsigned char *)a.first + rounded(a.second);
        for (int i = 0; i < GUARD; i++)
            if (guard[i] != GUARD_BYTE) {
                char what[200];
                snprintf(what, sizeof what,
                         "wrote past the end of the %zu-byte device allocation at %p (%d bytes "
                         "beyond its 256-byte rounding)",
                         a.second, (void *)a.first, i + 1);
                kernel_fault(after, what, NULL);
                return -1;
            }
    }
    return 0;
}

static int on_device(const void *p, size_t bytes) {
    std::lock_guard<std::mutex> g(mem_lock);
    auto it = allocations.upper_bound((uintptr_t)p);
    if (it == allocations.begin()) return 0;
    --it;
    return (uintptr_t)p + bytes <= it->first + it->second;
}

} // namespace visc_emu

using namespace visc_emu;

/* ---- the CUDA runtime calls the backend makes ---- */
extern "C" {

cudaError_t cudaGetLastError(void) {
    const cudaError_t e = sticky != cudaSuccess ? sticky : last;
    last = cudaSuccess;
    return e;
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorHostMemoryAlreadyRegistered:
        return "part or all of the requested memory range is already mapped";
    case cudaErrorHostMemoryNotRegistered:
        return "pointer does not correspond to a registered memory region";
    default: return "emulated CUDA error";
    }
}
const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    default: return "cudaErrorUnknown";
    }
}

cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev) {
    return status(dev == 0 ? cudaSuccess : cudaErrorInvalidDevice);
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
    if (dev != 0) return status(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "visc-emu (the kernels on the CPU)");
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->totalGlobalMem = device_bytes;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->sharedMemPerBlock = 48 * 1024;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int dev) {
    if (dev != 0) return status(cudaErrorInvalidDevice);
    snprintf(id, (size_t)len, "0000:00:00.0");
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = NULL;
    if (sticky != cudaSuccess) return sticky;
    const size_t size = rounded(bytes);
    {
        std::lock_guard<std::mutex> g(mem_lock);
        if (allocated + size > device_bytes) return status(cudaErrorMemoryAllocation);
    }
    unsigned char *m = (unsigned char *)aligned_alloc(256, size + GUARD);
    if (!m) return status(cudaErrorMemoryAllocation);
    /* device memory starts as garbage: NaN bytes, so a kernel that reads
     * what nobody wrote gives NaNs rather than zeros */
    memset(m, 0xff, size);
    memset(m + size, GUARD_BYTE, GUARD);
    std::lock_guard<std::mutex> g(mem_lock);
    allocations[(uintptr_t)m] = bytes;
    allocated += size;
    *p = m;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    guards_intact("(before cudaFree)");
    {
        std::lock_guard<std::mutex> g(mem_lock);
        auto it = allocations.find((uintptr_t)p);
        if (it == allocations.end()) {
            fprintf(stderr, "visc-emu: cudaFree of %p, which cudaMalloc did not return\n", p);
            return status(cudaErrorInvalidValue);
        }
        allocated -= rounded(it->second);
        allocations.erase(it);
    }
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    std::lock_guard<std::mutex> g(mem_lock);
    *total = device_bytes;
    *free_bytes = device_bytes - allocated;
    return cudaSuccess;
}

static cudaError_t copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (sticky != cudaSuccess) return sticky;
    if (bytes == 0) return cudaSuccess;
    const int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if ((dst_dev && !on_device(dst, bytes)) || (src_dev && !on_device(src, bytes))) {
        fprintf(stderr,
                "visc-emu: a copy of %zu bytes (kind %d) from %p to %p: its device side "
                "is not inside one device allocation\n",
                bytes, (int)kind, src, dst);
        return status(cudaErrorInvalidValue);
    }
    memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    return copy(dst, src, bytes, kind);
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
    return copy(dst, src, bytes, kind);
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t) {
    if (width > dpitch || width > spitch) return status(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++) {
        const cudaError_t e =
            copy((char *)dst + r * dpitch, (const char *)src + r * spitch, width, kind);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t) {
    if (sticky != cudaSuccess) return sticky;
    if (bytes && !on_device(p, bytes)) {
        fprintf(stderr, "visc-emu: cudaMemsetAsync of %zu bytes at %p outside device memory\n",
                bytes, p);
        return status(cudaErrorInvalidValue);
    }
    memset(p, value, bytes);
    return cudaSuccess;
}

/* Page-locked host memory, held to CUDA's rules: no byte registered twice
 * (cudaErrorHostMemoryAlreadyRegistered), unregister only a registered
 * region's start (cudaErrorHostMemoryNotRegistered). Nothing is locked. */
static std::map<uintptr_t, size_t> host_registered; /* start -> bytes */
static std::mutex host_lock;
cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned) {
    if (!p || !bytes) return status(cudaErrorInvalidValue);
    const uintptr_t a = (uintptr_t)p;
    std::lock_guard<std::mutex> g(host_lock);
    auto next = host_registered.lower_bound(a); /* the first region starting at or after a */
    if (next != host_registered.end() && next->first < a + bytes)
        return status(cudaErrorHostMemoryAlreadyRegistered);
    if (next != host_registered.begin() && std::prev(next)->first + std::prev(next)->second > a)
        return status(cudaErrorHostMemoryAlreadyRegistered);
    host_registered[a] = bytes;
    return cudaSuccess;
}
cudaError_t cudaHostUnregister(void *p) {
    std::lock_guard<std::mutex> g(host_lock);
    if (!host_registered.erase((uintptr_t)p)) return status(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned) {
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : status(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void *p) {
    free(p);
    return cudaSuccess;
}

/* Streams: handles only (everything ran when it was asked). Events: the
 * host's clock when recorded, which is when the work before them ended. */
static char stream_token;
struct CUevent_st {
    double ms;
};
cudaError_t cudaStreamCreate(cudaStream_t *s) {
    *s = (cudaStream_t)&stream_token;
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return status(cudaSuccess); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return status(cudaSuccess); }
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = (cudaEvent_t)calloc(1, sizeof(CUevent_st));
    return *e ? cudaSuccess : status(cudaErrorMemoryAllocation);
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    e->ms = t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
    return status(cudaSuccess);
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return status(cudaSuccess); }
cudaError_t cudaEventQuery(cudaEvent_t) { return status(cudaSuccess); }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    *ms = (float)(end->ms - start->ms);
    return status(cudaSuccess);
}

} // extern "C"
