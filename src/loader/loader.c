/* loader.c: worker threads that decode ahead, and batches delivered in order.
 *
 * The unit of work is one sample position of this rank's slice of the
 * epoch order (loader.h: rank-strided sharding). A ring of R = P x B sample
 * slots, allocated once, holds decoded samples: workers claim positions in
 * increasing order, at most R ahead of the oldest position the consumer may
 * still read, and fill slot (position - epoch start) mod R. So which thread
 * decoded what, and when, never shows in the batches: they depend only on
 * (dataset, seed, epoch, rank, start position). Nothing is allocated per
 * batch (only a bad sample's message is).
 *
 * Zero copy: the slots' memory is P batch buffers in the visc_batch layout
 * (view v of sample b at (v * B + b) * CHW), and slot s is sample s mod B
 * of buffer s / B. A batch of B consecutive good positions that starts on a
 * buffer boundary is that buffer: visc_loader_next hands it out as is, and
 * workers do not claim positions that would overwrite it until the next
 * call (hence P = prefetch + 1: one buffer is the consumer's). A single
 * view is decoded straight into place; several views are decoded into a
 * per-worker buffer and scattered by the worker. A batch that is not so
 * aligned (bad samples were skipped, or a resume / epoch end moved the
 * cursor off a boundary) is gathered by copying into one separate buffer,
 * as before. 0.6 MB per 224 px image copied by the consumer was 4-7% of
 * the pipeline's CPU time.
 *
 * Why samples and not whole batches as the unit of work: a skipped bad
 * sample shifts every later batch by one position, which a batch-per-worker
 * design only learns after the fact; here the shift is just the cursor.
 *
 * Wake-ups: a worker signals the consumer only when it finished the
 * position the consumer waits for, and the consumer wakes workers only
 * when some sleep: a futex call per sample was ~5% of the CPU time.
 *
 * Shutdown and restart: the consumer may stop at any time (start another
 * epoch, or free). start() first waits until no worker is inside get()
 * (claims are stopped meanwhile), so no late write lands in a slot of the
 * new epoch; free() sets stop and joins. A worker blocked in get() is
 * waited for, never cancelled. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "visc/core.h"
#include "visc/loader.h"

enum { SLOT_EMPTY = 0, SLOT_BUSY, SLOT_READY, SLOT_BAD, SLOT_FAIL };

typedef struct {
    int state;
    int32_t label;
    int64_t index;    /* dataset index */
    unsigned char *x; /* view 0 of this sample; view v at x + v * vstride */
    char msg[384];
} slot;

struct visc_loader {
    const visc_dataset *ds;
    visc_loader_config c;
    int views;
    size_t sample;  /* bytes of one view of one sample (floats, or bytes: c.bytes) */
    size_t vstride; /* bytes between two views of one sample: B x sample */
    int64_t *order;
    int64_t slice_len, nbatches;

    int R; /* P x B slots */
    slot *slots;
    unsigned char *slot_mem; /* P batch buffers */
    unsigned char *bx;       /* the gather buffer for unaligned batches (made on first use) */
    int32_t *by;
    int64_t *bidx;

    pthread_t *threads;
    int nthreads;
    pthread_mutex_t mu;
    pthread_cond_t work, ready, idle;
    int stop, active, failed, inflight;
    int sleeping;     /* workers waiting on work */
    int64_t wait_pos; /* the position the consumer waits for (-1: none) */
    int64_t epoch, base, claim, cursor, batch;
    int64_t hold; /* first position whose slot memory the consumer may read */
    char error[512];

    int64_t bad_count, bad_cap;
    int64_t *bad_idx;
    char **bad_msg;
};

static void *worker_main(void *arg) {
    visc_loader *l = arg;
    const visc_dataset *ds = l->ds;
    /* several views: get() writes them one after another, the batch keeps
     * them B samples apart */
    unsigned char *tmp =
        l->views > 1 ? visc_malloc((size_t)l->views * l->sample, "loader views") : NULL;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && !(l->active && l->claim < l->slice_len && l->claim < l->hold + l->R)) {
            l->sleeping++;
            pthread_cond_wait(&l->work, &l->mu);
            l->sleeping--;
        }
        if (l->stop) break;
        int64_t p = l->claim++;
        slot *s = &l->slots[(p - l->base) % l->R];
        int64_t idx = l->order[(int64_t)l->c.rank + p * (int64_t)l->c.world];
        int64_t epoch = l->epoch;
        s->state = SLOT_BUSY;
        s->index = idx;
        l->inflight++;
        pthread_mutex_unlock(&l->mu);

        int32_t label = 0;
        unsigned char *dst = tmp ? tmp : s->x;
        int rc = l->c.bytes ? ds->get_bytes(ds, idx, l->c.train, l->c.seed, epoch, dst, &label)
                            : ds->get(ds, idx, &l->c.aug, l->c.train, l->c.seed, epoch,
                                      (float *)(void *)dst, &label);
        if (rc != 0) snprintf(s->msg, sizeof s->msg, "%s", visc_last_error());
        else if (tmp)
            for (int v = 0; v < l->views; v++)
                memcpy(s->x + (size_t)v * l->vstride, tmp + (size_t)v * l->sample, l->sample);

        pthread_mutex_lock(&l->mu);
        s->label = label;
        s->state = rc == 0 ? SLOT_READY : rc == VISC_SAMPLE_BAD ? SLOT_BAD : SLOT_FAIL;
        if (--l->inflight == 0) pthread_cond_broadcast(&l->idle);
        if (p == l->wait_pos) pthread_cond_signal(&l->ready);
    }
    pthread_mutex_unlock(&l->mu);
    free(tmp);
    return NULL;
}

static int online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Batch memory in whole pages of its own, so that a caller can page-lock
 * each region alone (visc_loader_each_buffer: cudaHostRegister locks whole
 * pages, and two regions sharing a page would collide there). Zeroed;
 * free() releases it. */
static void *batch_memory(size_t bytes, const char *what) {
    long page = sysconf(_SC_PAGESIZE);
    size_t align = page > 64 ? (size_t)page : 64, rounded = (bytes + align - 1) / align * align;
    void *p = aligned_alloc(align, rounded ? rounded : align);
    if (!p) visc_die("out of memory allocating %zu bytes for %s", bytes, what);
    memset(p, 0, rounded ? rounded : align);
    return p;
}

visc_loader *visc_loader_new(const visc_dataset *ds, const visc_loader_config *cfg) {
    visc_loader_config c = *cfg;
    if (c.world <= 0) c.world = 1;
    if (c.batch_size <= 0 || c.rank < 0 || c.rank >= c.world || ds->size <= 0) {
        visc_set_error("loader: bad configuration (batch %d, rank %d of %d, %lld samples)",
                       c.batch_size, c.rank, c.world, (long long)ds->size);
        return NULL;
    }
    if (c.bytes && !ds->get_bytes) {
        visc_set_error("loader: this dataset has no byte form (in-memory data, or a recipe that "
                       "erases)");
        return NULL;
    }
    if (c.workers <= 0) c.workers = online_cores();
    if (c.prefetch <= 0) c.prefetch = 2;
    visc_loader *l = visc_calloc(1, sizeof *l, "loader");
    l->ds = ds;
    l->c = c;
    l->views = ds->views > 1 ? ds->views : 1;
    l->sample = (size_t)ds->channels * ds->height * ds->width * (c.bytes ? 1 : sizeof(float));
    int64_t n = ds->size, w = c.world, B = c.batch_size;
    if (c.drop_last) {
        l->slice_len = n / w;
        l->nbatches = l->slice_len / B;
    } else {
        l->slice_len = (n - c.rank + w - 1) / w;
        l->nbatches = (l->slice_len + B - 1) / B;
    }
    l->order = visc_malloc((size_t)n * sizeof *l->order, "epoch order");
    /* the ring: prefetch batches ahead plus the one the consumer holds, and
     * enough slots that every worker has work */
    int64_t P = (int64_t)c.prefetch + 1;
    if (P * B < 2 * (int64_t)c.workers + B) P = (2 * (int64_t)c.workers + 2 * B - 1) / B;
    if (P * B > INT32_MAX / 2) {
        free(l->order);
        free(l);
        visc_set_error("loader: batch size %d is too large", c.batch_size);
        return NULL;
    }
    l->R = (int)(P * B);
    l->vstride = (size_t)B * l->sample;
    size_t per_batch = (size_t)l->views * l->vstride;
    l->slots = visc_calloc((size_t)l->R, sizeof *l->slots, "loader slots");
    l->slot_mem = batch_memory((size_t)P * per_batch, "loader prefetch ring");
    for (int64_t i = 0; i < l->R; i++)
        l->slots[i].x = l->slot_mem + (size_t)(i / B) * per_batch + (size_t)(i % B) * l->sample;
    l->by = visc_calloc((size_t)B, sizeof *l->by, "loader labels");
    l->bidx = visc_calloc((size_t)B, sizeof *l->bidx, "loader indices");
    l->wait_pos = -1;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->work, NULL);
    pthread_cond_init(&l->ready, NULL);
    pthread_cond_init(&l->idle, NULL);
    l->threads = visc_calloc((size_t)c.workers, sizeof *l->threads, "loader threads");
    for (int i = 0; i < c.workers; i++) {
        if (pthread_create(&l->threads[i], NULL, worker_main, l) != 0) break;
        l->nthreads++;
    }
    if (l->nthreads == 0) {
        visc_loader_free(l);
        visc_set_error("loader: cannot start worker threads");
        return NULL;
    }
    return l;
}

int64_t visc_loader_batches(const visc_loader *l) { return l->nbatches; }

static void clear_bad(visc_loader *l) {
    for (int64_t i = 0; i < l->bad_count; i++) free(l->bad_msg[i]);
    l->bad_count = 0;
}

int visc_loader_start(visc_loader *l, int64_t epoch, int64_t start_batch, int64_t start_pos) {
    if (start_pos < 0) start_pos = start_batch * l->c.batch_size;
    if (epoch < 0 || start_batch < 0 || start_pos > l->slice_len)
        return visc_set_error("loader: cannot start epoch %lld at batch %lld, position %lld",
                              (long long)epoch, (long long)start_batch, (long long)start_pos);
    pthread_mutex_lock(&l->mu);
    l->active = 0; /* no new claims; wait for the ones in get() */
    while (l->inflight > 0) pthread_cond_wait(&l->idle, &l->mu);
    for (int i = 0; i < l->R; i++) l->slots[i].state = SLOT_EMPTY;
    visc_epoch_order(l->order, l->ds->size, l->c.shuffle, l->c.seed, epoch);
    l->epoch = epoch;
    l->base = l->claim = l->cursor = l->hold = start_pos;
    l->wait_pos = -1;
    l->batch = start_batch;
    l->failed = 0;
    clear_bad(l);
    l->active = 1;
    pthread_cond_broadcast(&l->work);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

static void record_bad(visc_loader *l, const slot *s) {
    if (l->bad_count == l->bad_cap) {
        l->bad_cap = l->bad_cap ? 2 * l->bad_cap : 16;
        l->bad_idx = visc_realloc(l->bad_idx, (size_t)l->bad_cap * sizeof *l->bad_idx, "bad list");
        l->bad_msg = visc_realloc(l->bad_msg, (size_t)l->bad_cap * sizeof *l->bad_msg, "bad list");
    }
    l->bad_idx[l->bad_count] = s->index;
    l->bad_msg[l->bad_count] = visc_strdup(s->msg);
    l->bad_count++;
}

/* Ends the epoch with an error; called with the lock held. */
static int fail(visc_loader *l, const char *what, const slot *s, const char *hint) {
    snprintf(l->error, sizeof l->error, "%s (sample %lld): %s%s", what, (long long)s->index, s->msg,
             hint);
    l->failed = 1;
    l->active = 0;
    return -1;
}

/* Waits until position p (claimed or not) is decoded; lock held. */
static slot *wait_slot(visc_loader *l, int64_t p) {
    slot *s = &l->slots[(p - l->base) % l->R];
    while (s->state == SLOT_EMPTY || s->state == SLOT_BUSY) {
        l->wait_pos = p;
        pthread_cond_wait(&l->ready, &l->mu);
    }
    l->wait_pos = -1;
    return s;
}

/* The consumer no longer reads slot memory below `hold`; lock held. */
static void release_to(visc_loader *l, int64_t hold) {
    l->hold = hold;
    if (l->sleeping) pthread_cond_broadcast(&l->work);
}

/* The batch starting at the cursor as one ring buffer, when it starts on a
 * buffer boundary and all its samples are good: 1 and *x set; 0 leaves
 * everything as it was (the gather path takes over). Lock held. */
static int take_aligned(visc_loader *l, unsigned char **x, int *count) {
    const int B = l->c.batch_size;
    if ((l->cursor - l->base) % B != 0) return 0;
    int64_t left = l->slice_len - l->cursor;
    int n = left < B ? (int)left : B;
    /* the last one first: positions finish about in order, so this is one
     * wake-up per batch rather than one per sample */
    if (wait_slot(l, l->cursor + n - 1)->state != SLOT_READY) return 0;
    for (int i = 0; i < n - 1; i++)
        if (wait_slot(l, l->cursor + i)->state != SLOT_READY) return 0;
    for (int i = 0; i < n; i++) {
        slot *s = &l->slots[(l->cursor + i - l->base) % l->R];
        l->by[i] = s->label;
        l->bidx[i] = s->index;
        s->state = SLOT_EMPTY; /* its memory stays held until the next call */
    }
    *x = l->slots[(l->cursor - l->base) % l->R].x;
    *count = n;
    l->cursor += n;
    return 1;
}

/* The gather buffer, made on first use (most runs never need it). */
static unsigned char *gather_buffer(visc_loader *l) {
    if (!l->bx) l->bx = batch_memory((size_t)l->views * l->vstride, "loader batch");
    return l->bx;
}

int visc_loader_each_buffer(visc_loader *l, int (*fn)(void *ctx, void *p, size_t bytes),
                            void *ctx) {
    size_t per_batch = (size_t)l->views * l->vstride;
    int rc = fn(ctx, l->slot_mem, (size_t)(l->R / l->c.batch_size) * per_batch);
    return rc ? rc : fn(ctx, gather_buffer(l), per_batch);
}

int visc_loader_next(visc_loader *l, visc_batch *b) {
    const int B = l->c.batch_size;
    pthread_mutex_lock(&l->mu);
    if (l->failed) {
        pthread_mutex_unlock(&l->mu);
        return visc_set_error("%s", l->error);
    }
    if (!l->active || l->batch >= l->nbatches || l->cursor >= l->slice_len) {
        pthread_mutex_unlock(&l->mu);
        return 0;
    }
    release_to(l, l->cursor); /* the previous batch is given back */
    int count = 0, rc = 1;
    unsigned char *x = NULL;
    if (!take_aligned(l, &x, &count)) {
        /* gather: good samples copied in order into bx, bad ones recorded */
        x = gather_buffer(l);
        while (count < B && l->cursor < l->slice_len) {
            slot *s = wait_slot(l, l->cursor);
            if (s->state == SLOT_READY) {
                /* the slot stays ours until the cursor passes it: copy unlocked */
                pthread_mutex_unlock(&l->mu);
                for (int v = 0; v < l->views; v++)
                    memcpy(l->bx + (size_t)v * l->vstride + (size_t)count * l->sample,
                           s->x + (size_t)v * l->vstride, l->sample);
                l->by[count] = s->label;
                l->bidx[count] = s->index;
                count++;
                pthread_mutex_lock(&l->mu);
            } else if (s->state == SLOT_BAD && l->c.on_bad == VISC_ON_BAD_SKIP) {
                record_bad(l, s);
            } else if (s->state == SLOT_BAD) {
                rc = fail(l, "bad image", s, " (--on-bad-image skip skips such files)");
                break;
            } else {
                rc = fail(l, "cannot load", s, "");
                break;
            }
            s->state = SLOT_EMPTY;
            l->cursor++;
            release_to(l, l->cursor);
        }
    }
    if (rc == 1 && count == 0) rc = 0; /* only bad samples were left */
    if (rc == 1) {
        b->x = l->c.bytes ? NULL : (float *)(void *)x;
        b->x8 = l->c.bytes ? x : NULL;
        b->y = l->by;
        b->indices = l->bidx;
        b->count = count;
        b->views = l->views;
        b->epoch = l->epoch;
        b->index = l->batch++;
        b->next_pos = l->cursor;
    }
    pthread_mutex_unlock(&l->mu);
    if (rc < 0) return visc_set_error("%s", l->error);
    return rc;
}

int64_t visc_loader_bad_count(const visc_loader *l) { return l->bad_count; }

const char *visc_loader_bad_message(const visc_loader *l, int64_t i) {
    return i >= 0 && i < l->bad_count ? l->bad_msg[i] : NULL;
}

int64_t visc_loader_bad_index(const visc_loader *l, int64_t i) {
    return i >= 0 && i < l->bad_count ? l->bad_idx[i] : -1;
}

void visc_loader_free(visc_loader *l) {
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->work);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->nthreads; i++) pthread_join(l->threads[i], NULL);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->work);
    pthread_cond_destroy(&l->ready);
    pthread_cond_destroy(&l->idle);
    clear_bad(l);
    free(l->bad_idx);
    free(l->bad_msg);
    free(l->threads);
    free(l->order);
    free(l->slots);
    free(l->slot_mem);
    free(l->bx);
    free(l->by);
    free(l->bidx);
    free(l);
}
