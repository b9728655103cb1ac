/* grad_sync.c: averaging gradients over the ranks, overlapped with backward.
 *
 * As PyTorch's DistributedDataParallel: buckets of adjacent tensors, made
 * from the last parameter to the first because backward produces
 * gradients in about that order. Each bucket counts the floats still to
 * be reported final; the report that brings it to zero submits the
 * bucket's all-reduce (sum, then x 1/world on the communication thread).
 * Every rank runs the same backward, so buckets are submitted in the same
 * order everywhere, which is what the collectives need. */
#include <stdlib.h>
#include <string.h>

#include "visc/core.h"
#include "visc/dist.h"

typedef struct {
    size_t lo, hi;    /* float range in the flat gradient buffer */
    size_t expected;  /* floats of its tensors (offsets leave alignment gaps) */
    size_t remaining; /* of those, not yet reported final this step */
    int64_t ticket;   /* -1: not submitted this step */
} bucket;

struct visc_grad_sync {
    visc_dist *d;
    visc_grad_transport transport;
    float *grads;
    size_t total;
    bucket *buckets; /* ascending lo */
    int num_buckets;
    const visc_table *params;
    int *tensor_bucket;      /* [tensors]: the bucket holding each */
    unsigned char *reported; /* [tensors]: final this step */
    int failed;
};

/* The default transport: the group's all-reduce on host memory. */
static int64_t host_start(void *d, float *buf, size_t count, float scale) {
    return visc_dist_allreduce_async(d, buf, count, scale);
}
static int host_wait(void *d, int64_t ticket) { return visc_dist_wait(d, ticket); }

visc_grad_sync *visc_grad_sync_new(visc_dist *d, const visc_table *params, float *grads,
                                   size_t bucket_bytes, const visc_grad_transport *transport) {
    visc_grad_sync *g = visc_calloc(1, sizeof *g, "gradient sync");
    g->d = d;
    g->transport = transport ? *transport : (visc_grad_transport){host_start, host_wait, d};
    g->grads = grads;
    g->total = params->total;
    int n = params->count;
    g->buckets = visc_calloc((size_t)(n > 0 ? n : 1), sizeof(bucket), "gradient buckets");
    size_t limit = bucket_bytes / sizeof(float);
    /* from the last tensor down: a bucket closes once it holds >= limit floats */
    size_t hi = params->total, numel = 0;
    int count = 0;
    for (int i = n - 1; i >= 0; i--) {
        size_t lo = params->entries[i].offset;
        numel += params->entries[i].numel;
        int last = i == 0;
        if (last || (limit > 0 && hi - lo >= limit)) {
            g->buckets[count++] = (bucket){.lo = last ? 0 : lo, .hi = hi, .expected = numel};
            hi = lo;
            numel = 0;
        }
    }
    /* reverse into ascending order for the lookup */
    for (int i = 0; i < count / 2; i++) {
        bucket t = g->buckets[i];
        g->buckets[i] = g->buckets[count - 1 - i];
        g->buckets[count - 1 - i] = t;
    }
    g->num_buckets = count;
    g->params = params;
    g->tensor_bucket = visc_calloc((size_t)(n > 0 ? n : 1), sizeof(int), "gradient buckets");
    g->reported = visc_calloc((size_t)(n > 0 ? n : 1), 1, "gradient buckets");
    for (int i = 0, b = 0; i < n; i++) {
        while (b + 1 < count && g->buckets[b + 1].lo <= params->entries[i].offset) b++;
        g->tensor_bucket[i] = b;
    }
    visc_grad_sync_begin(g);
    return g;
}

int visc_grad_sync_buckets(const visc_grad_sync *g) { return g->num_buckets; }

void visc_grad_sync_begin(visc_grad_sync *g) {
    for (int i = 0; i < g->num_buckets; i++) {
        g->buckets[i].remaining = g->buckets[i].expected;
        g->buckets[i].ticket = -1;
    }
    memset(g->reported, 0, (size_t)(g->params->count > 0 ? g->params->count : 1));
    g->failed = 0;
}

static void submit(visc_grad_sync *g, bucket *b) {
    float scale = 1.0f / (float)visc_dist_world(g->d);
    b->ticket = g->transport.start(g->transport.ctx, g->grads + b->lo, b->hi - b->lo, scale);
    if (b->ticket < 0) g->failed = 1;
}

/* The first tensor whose offset is >= off. */
static int first_tensor_at(const visc_table *t, size_t off) {
    int lo = 0, hi = t->count;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (t->entries[mid].offset < off) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Marks the tensors starting inside [grad, grad + count) final; a bucket
 * whose tensors are all final is submitted. A tensor reported twice counts
 * once. */
void visc_grad_sync_ready(void *ctx, const float *grad, size_t count) {
    visc_grad_sync *g = ctx;
    if (grad < g->grads || grad >= g->grads + g->total) return; /* not a parameter */
    size_t off = (size_t)(grad - g->grads), end = off + count;
    const visc_table *t = g->params;
    for (int i = first_tensor_at(t, off); i < t->count && t->entries[i].offset < end; i++) {
        if (g->reported[i]) continue;
        g->reported[i] = 1;
        bucket *b = &g->buckets[g->tensor_bucket[i]];
        b->remaining -= t->entries[i].numel;
        if (b->remaining == 0 && b->ticket < 0) submit(g, b);
    }
}

int visc_grad_sync_finish(visc_grad_sync *g) {
    for (int i = g->num_buckets - 1; i >= 0; i--)
        if (g->buckets[i].ticket < 0) submit(g, &g->buckets[i]);
    int rc = g->failed ? -1 : 0;
    for (int i = 0; i < g->num_buckets; i++)
        if (g->buckets[i].ticket >= 0 && g->transport.wait(g->transport.ctx, g->buckets[i].ticket))
            rc = -1;
    visc_grad_sync_begin(g);
    return rc;
}

void visc_grad_sync_free(visc_grad_sync *g) {
    if (!g) return;
    free(g->buckets);
    free(g->tensor_bucket);
    free(g->reported);
    free(g);
}
