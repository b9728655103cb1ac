/* standin_nccl.c: NCCL's part of cuda.h (comm.cu) for the stand-in GPU.
 *
 * The ranks are processes on this machine; they reduce through a shared
 * memory segment that the first rank's visc_cuda_nccl_unique_id creates
 * and names in the id. As NCCL's stream does, a thread of its own runs the
 * all-reduces in the order they were queued, beside the caller: each
 * copies its chunk of the bucket into its slot, waits for every rank, and
 * adds the slots in rank order (so every rank gets the same sums; with two
 * ranks they are a + b, bit for bit what MPI gives), then scales. An event
 * marked after some of them is done once the thread has run them; joining
 * it waits for that, as the kernels queued after the join would wait on a
 * GPU. A peer that never comes leaves the thread waiting in the segment's
 * barrier, and the marked events never done: what the watchdog of
 * src/gpu/comm.c must notice.
 *
 * VISC_STANDIN_NO_NCCL=1 makes NCCL absent (visc_cuda_nccl_load fails). */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "standin.h"

#define MAX_RANKS 8
#define CHUNK ((size_t)1 << 18) /* floats per rank and round */
#define QUEUE 256

typedef struct {
    atomic_int arrived, sense;
    float slots[]; /* [MAX_RANKS][CHUNK] */
} segment;

typedef struct {
    float *buf;       /* all-reduce: in place; all-gather: the destination */
    const float *src; /* all-gather's */
    size_t count;
    float scale;
} op;

static struct {
    int open, world, rank, local_sense;
    segment *seg;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    op queue[QUEUE];
    int64_t queued, done;
    int stop;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static const size_t segment_bytes = sizeof(segment) + MAX_RANKS * CHUNK * sizeof(float);

int visc_cuda_nccl_load(void) {
    const char *off = getenv("VISC_STANDIN_NO_NCCL");
    if (off && !strcmp(off, "1"))
        return visc_set_error("the stand-in GPU has no NCCL (VISC_STANDIN_NO_NCCL=1)");
    return 0;
}

/* The id: the segment's name. */
int visc_cuda_nccl_unique_id(unsigned char id[VISC_NCCL_ID_BYTES]) {
    if (visc_cuda_nccl_load()) return -1;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    memset(id, 0, VISC_NCCL_ID_BYTES);
    snprintf((char *)id, VISC_NCCL_ID_BYTES, "/visc-standin-nccl-%ld-%ld", (long)getpid(),
             (long)t.tv_nsec);
    int fd = shm_open((const char *)id, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return visc_set_error("stand-in NCCL: cannot create %s", (const char *)id);
    int rc = ftruncate(fd, (off_t)segment_bytes);
    close(fd);
    if (rc) {
        shm_unlink((const char *)id);
        return visc_set_error("stand-in NCCL: cannot size %s", (const char *)id);
    }
    return 0;
}

/* Every rank arrives before any leaves (a sense-reversing barrier). */
static void barrier(void) {
    g.local_sense = !g.local_sense;
    if (atomic_fetch_add(&g.seg->arrived, 1) == g.world - 1) {
        atomic_store(&g.seg->arrived, 0);
        atomic_store(&g.seg->sense, g.local_sense);
        return;
    }
    while (atomic_load(&g.seg->sense) != g.local_sense && !g.stop) usleep(20);
}

/* Each rank's chunk through its slot to every rank's destination. */
static void run_allgather(const op *o) {
    float *mine = g.seg->slots + (size_t)g.rank * CHUNK;
    for (size_t at = 0; at < o->count; at += CHUNK) {
        const size_t n = o->count - at < CHUNK ? o->count - at : CHUNK;
        memcpy(mine, o->src + at, n * sizeof(float));
        barrier();
        for (int r = 0; r < g.world; r++)
            memcpy(o->buf + (size_t)r * o->count + at, g.seg->slots + (size_t)r * CHUNK,
                   n * sizeof(float));
        barrier();
    }
}

static void run(const op *o) {
    if (o->src) {
        run_allgather(o);
        return;
    }
    float *mine = g.seg->slots + (size_t)g.rank * CHUNK;
    for (size_t at = 0; at < o->count; at += CHUNK) {
        const size_t n = o->count - at < CHUNK ? o->count - at : CHUNK;
        memcpy(mine, o->buf + at, n * sizeof(float));
        barrier();
        for (size_t i = 0; i < n; i++) {
            float sum = g.seg->slots[i];
            for (int r = 1; r < g.world; r++) sum += g.seg->slots[(size_t)r * CHUNK + i];
            o->buf[at + i] = sum;
        }
        barrier(); /* nobody refills a slot before every rank has read it */
    }
    if (o->scale != 1.0f)
        for (size_t i = 0; i < o->count; i++) o->buf[i] *= o->scale;
}

static void *worker(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g.mu);
    for (;;) {
        while (!g.stop && g.done == g.queued) pthread_cond_wait(&g.cv, &g.mu);
        if (g.stop) break;
        op o = g.queue[g.done % QUEUE];
        pthread_mutex_unlock(&g.mu);
        run(&o);
        pthread_mutex_lock(&g.mu);
        g.done++;
        pthread_cond_broadcast(&g.cv);
    }
    pthread_mutex_unlock(&g.mu);
    return NULL;
}

int visc_cuda_nccl_open(visc_cuda *ctx, const unsigned char id[VISC_NCCL_ID_BYTES], int world,
                        int rank) {
    (void)ctx;
    if (g.open) return visc_set_error("NCCL: this context has a communicator already");
    if (world < 1 || world > MAX_RANKS || rank < 0 || rank >= world)
        return visc_set_error("stand-in NCCL: rank %d of %d (at most %d ranks)", rank, world,
                              MAX_RANKS);
    char name[VISC_NCCL_ID_BYTES + 1] = {0};
    memcpy(name, id, VISC_NCCL_ID_BYTES);
    int fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0) return visc_set_error("stand-in NCCL: no segment %s", name);
    void *p = mmap(NULL, segment_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return visc_set_error("stand-in NCCL: cannot map %s", name);
    g.seg = p;
    g.world = world, g.rank = rank, g.local_sense = 0;
    g.queued = g.done = 0, g.stop = 0;
    barrier(); /* every rank has it mapped: the name can go */
    if (rank == 0) shm_unlink(name);
    if (pthread_create(&g.thread, NULL, worker, NULL)) {
        munmap(g.seg, segment_bytes);
        return visc_set_error("stand-in NCCL: cannot start its thread");
    }
    g.open = 1;
    return 0;
}

static void enqueue(op o) {
    pthread_mutex_lock(&g.mu);
    while (g.queued - g.done == QUEUE) pthread_cond_wait(&g.cv, &g.mu);
    g.queue[g.queued % QUEUE] = o;
    g.queued++;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
}

int visc_cuda_nccl_allreduce(visc_cuda *ctx, float *buf, size_t count, float scale) {
    (void)ctx;
    if (!g.open) return visc_set_error("NCCL all-reduce without a communicator");
    enqueue((op){.buf = buf, .count = count, .scale = scale});
    return 0;
}

int visc_cuda_nccl_allgather(visc_cuda *ctx, float *dst, const float *src, size_t count) {
    (void)ctx;
    if (!g.open) return visc_set_error("NCCL all-gather without a communicator");
    enqueue((op){.buf = dst, .src = src, .count = count, .scale = 1.0f});
    return 0;
}

int visc_cuda_nccl_mark(visc_cuda *ctx, visc_cuda_event *done) {
    (void)ctx;
    if (!g.open) return visc_set_error("NCCL mark without a communicator");
    pthread_mutex_lock(&g.mu);
    done->nccl_seq = g.queued;
    pthread_mutex_unlock(&g.mu);
    return 0;
}

int visc_cuda_nccl_join(visc_cuda *ctx, visc_cuda_event *done) {
    (void)ctx;
    pthread_mutex_lock(&g.mu);
    while (g.done < done->nccl_seq && !g.stop) pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    return 0;
}

int standin_nccl_done(const visc_cuda_event *e) {
    pthread_mutex_lock(&g.mu);
    int done = g.done >= e->nccl_seq;
    pthread_mutex_unlock(&g.mu);
    return done;
}

int visc_cuda_nccl_check(visc_cuda *ctx) {
    (void)ctx;
    return 0;
}

/* The thread may be stuck in the barrier for good: it is told to stop and
 * left (the process is about to end). */
void visc_cuda_nccl_abort(visc_cuda *ctx) {
    (void)ctx;
    pthread_mutex_lock(&g.mu);
    g.stop = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
}

void standin_nccl_close(void) {
    if (!g.open) return;
    pthread_mutex_lock(&g.mu);
    while (g.done < g.queued && !g.stop) pthread_cond_wait(&g.cv, &g.mu); /* as a stream sync */
    g.stop = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    pthread_join(g.thread, NULL);
    munmap(g.seg, segment_bytes);
    g.open = 0;
}
