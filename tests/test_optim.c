/* test_optim.c: optimizers, schedules, EMA and clipping against torch 1.13
 * and timm 0.9.16 (tests/golden/optim_golden.h, from tools/gen_golden_optim.py). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "golden/optim_golden.h"
#include "test.h"
#include "visc/optim.h"

/* fp32 reference, fp32 here, different rounding order in places (torch's
 * vector kernels, float vs double norms): a few ulps after five steps. */
#define RTOL 1e-6
#define ATOL 1e-7

static void make_table(visc_table *t) {
    visc_table_init(t);
    for (int i = 0; i < OG_TENSORS; i++)
        visc_table_add(t, og_names[i], og_ndim[i], og_shape[i], og_flags[i]);
    visc_table_alloc(t);
}

/* Golden arrays are concatenated; table buffers are padded per tensor. */
static void scatter(const visc_table *t, float *dst, const float *src) {
    for (int i = 0, o = 0; i < t->count; o += (int)t->entries[i].numel, i++)
        memcpy(dst + t->entries[i].offset, src + o, t->entries[i].numel * sizeof(float));
}

TEST(optimizers_match_torch_and_timm) {
    visc_table t;
    make_table(&t);
    float *grads = visc_alloc_aligned(t.total * sizeof(float), "grads");
    for (int c = 0; c < OG_CASES; c++) {
        const og_case *gc = &og_cases[c];
        visc_optimizer o;
        visc_optimizer_init(&o, &gc->cfg, &t);
        scatter(&t, t.data, og_init);
        for (int s = 0; s < OG_STEPS; s++) {
            scatter(&t, grads, og_grads[s]);
            visc_optimizer_step(&o, t.data, grads, gc->lr[s]);
            /* The gradients are read-only, even where timm clips p.grad in place. */
            for (int i = 0, off = 0; i < t.count; off += (int)t.entries[i].numel, i++)
                CHECK(memcmp(grads + t.entries[i].offset, og_grads[s] + off,
                             t.entries[i].numel * sizeof(float)) == 0);
            for (int i = 0, off = 0; i < t.count; off += (int)t.entries[i].numel, i++) {
                char what[160];
                snprintf(what, sizeof what, "%s step %d %s", gc->name, s, t.entries[i].name);
                CHECK_ARRAYS(what, visc_table_get(&t, i), gc->expect[s] + off, t.entries[i].numel,
                             ATOL, RTOL);
            }
        }
        CHECK(o.step == OG_STEPS);
        visc_optimizer_free(&o);
    }
    visc_free_aligned(grads);
    visc_table_free(&t);
}

/* The golden run must be able to fail: the weight-decay exclusion and the
 * trust ratio each move the result well beyond the tolerance. */
TEST(optimizer_golden_detects_wrong_rules) {
    visc_table t;
    make_table(&t);
    float *grads = visc_alloc_aligned(t.total * sizeof(float), "grads");
    for (int c = 0; c < OG_CASES; c++) {
        const og_case *gc = &og_cases[c];
        if (gc->cfg.weight_decay == 0.0f || gc->cfg.decay_norm_and_bias) continue;
        visc_opt_config cfg = gc->cfg;
        cfg.decay_norm_and_bias = 1; /* wrong on purpose */
        visc_optimizer o;
        visc_optimizer_init(&o, &cfg, &t);
        scatter(&t, t.data, og_init);
        for (int s = 0; s < OG_STEPS; s++) {
            scatter(&t, grads, og_grads[s]);
            visc_optimizer_step(&o, t.data, grads, gc->lr[s]);
        }
        /* bn.weight (no-decay) must now differ from the reference. */
        const float *want = gc->expect[OG_STEPS - 1] + t.entries[0].numel;
        const float *got = visc_table_get(&t, 1);
        double worst = 0;
        for (size_t i = 0; i < t.entries[1].numel; i++)
            worst = fmax(worst, fabs(got[i] - want[i]) / fabs(want[i]));
        CHECK_MSG(worst > 100 * RTOL, "%s: decaying bn.weight changed it by only %g", gc->name,
                  worst);
        visc_optimizer_free(&o);
    }
    visc_free_aligned(grads);
    visc_table_free(&t);
}

static float large_value(int64_t i, int64_t mul, int step) {
    return (float)(((i * mul + 17 * step) % 2001) - 1000) / 1000.0f;
}

static void large_table(visc_table *t) {
    visc_table_init(t);
    for (int i = 0; i < OG_LARGE_TENSORS; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d", i);
        visc_table_add(t, name, 1, &og_large_numel[i], og_large_flags[i]);
    }
    visc_table_alloc(t);
}

/* Fills params (step < 0) or the gradients of a step, in table layout. */
static void large_fill(const visc_table *t, float *dst, int step) {
    int64_t i = 0;
    for (int e = 0; e < t->count; e++)
        for (size_t k = 0; k < t->entries[e].numel; k++, i++)
            dst[t->entries[e].offset + k] =
                step < 0 ? large_value(i, 104729, 0) * 0.5f
                         : large_value(i, 7919 + 31 * step, step) * (step == 1 ? 0.01f : 1.0f);
}

static void large_run(const og_large_case *gc, const visc_table *t, float *params, float *grads) {
    visc_optimizer o;
    visc_optimizer_init(&o, &gc->cfg, t);
    large_fill(t, params, -1);
    for (int s = 0; s < OG_LARGE_STEPS; s++) {
        large_fill(t, grads, s);
        visc_optimizer_step(&o, params, grads, gc->lr[s]);
    }
    visc_optimizer_free(&o);
}

/* Tensors of 40000 and 20000 floats span several blocks: the per-tensor
 * norms of LAMB and LARS are then sums over blocks. */
TEST(optimizers_match_on_tensors_spanning_blocks) {
    visc_table t;
    large_table(&t);
    float *grads = visc_alloc_aligned(t.total * sizeof(float), "grads");
    for (int c = 0; c < OG_LARGE_CASES; c++) {
        const og_large_case *gc = &og_large_cases[c];
        large_run(gc, &t, t.data, grads);
        /* concatenated index -> table offset */
        float got[OG_LARGE_SAMPLES];
        for (int j = 0; j < OG_LARGE_SAMPLES; j++) {
            int64_t i = gc->idx[j];
            int e = 0;
            while (i >= og_large_numel[e]) i -= og_large_numel[e++];
            got[j] = t.data[t.entries[e].offset + (size_t)i];
        }
        CHECK_ARRAYS(gc->name, got, gc->sample, OG_LARGE_SAMPLES, ATOL, RTOL);
        double sum = 0;
        for (int e = 0; e < t.count; e++)
            for (size_t k = 0; k < t.entries[e].numel; k++) sum += t.data[t.entries[e].offset + k];
        CHECK_CLOSE(sum, gc->sum, 1e-4, 1e-6);
    }
    visc_free_aligned(grads);
    visc_table_free(&t);
}

TEST(optimizer_step_is_thread_count_independent) {
    visc_table t;
    large_table(&t);
    float *grads = visc_alloc_aligned(t.total * sizeof(float), "grads");
    float *one = visc_alloc_aligned(t.total * sizeof(float), "params");
    const int threads = visc_num_threads();
    for (int c = 0; c < OG_LARGE_CASES; c++) {
        visc_set_num_threads(1);
        large_run(&og_large_cases[c], &t, one, grads);
        visc_set_num_threads(3);
        large_run(&og_large_cases[c], &t, t.data, grads);
        CHECK_MSG(memcmp(one, t.data, t.total * sizeof(float)) == 0,
                  "%s differs between 1 and 3 threads", og_large_cases[c].name);
    }
    visc_set_num_threads(threads);
    visc_free_aligned(one);
    visc_free_aligned(grads);
    visc_table_free(&t);
}

TEST(optimizer_defaults_and_names) {
    visc_opt_kind k;
    const char *names[] = {"sgd", "adamw", "lamb", "lars"};
    for (int i = 0; i < 4; i++) {
        CHECK(visc_opt_parse_kind(names[i], &k) == 0 && (int)k == i);
        CHECK(strcmp(visc_opt_kind_name(k), names[i]) == 0);
        visc_opt_config c = visc_opt_defaults(k);
        CHECK(c.kind == k);
        CHECK(c.beta1 == 0.9f && c.beta2 == 0.999f && c.max_grad_norm == 1.0f &&
              c.trust_coef == 0.001f);
    }
    CHECK(visc_opt_parse_kind("adam", &k) == -1);
    CHECK(strstr(visc_last_error(), "adam") != NULL);
    CHECK(visc_opt_defaults(VISC_OPT_LAMB).eps == 1e-6f &&
          visc_opt_defaults(VISC_OPT_ADAMW).eps == 1e-8f);
    CHECK(visc_opt_defaults(VISC_OPT_ADAMW).weight_decay == 0.01f);
    CHECK(visc_optimizer_state_slots(VISC_OPT_SGD) == 1 &&
          visc_optimizer_state_slots(VISC_OPT_LARS) == 1);
    CHECK(visc_optimizer_state_slots(VISC_OPT_ADAMW) == 2 &&
          visc_optimizer_state_slots(VISC_OPT_LAMB) == 2);
}

TEST(schedules_match_torch) {
    for (int c = 0; c < OG_SCHEDS; c++) {
        const og_sched *g = &og_scheds[c];
        for (int k = 0; k < g->n; k++) {
            float lr = visc_schedule_lr(&g->s, k);
            if (!(fabs(lr - g->lrs[k]) <= 1e-9 + 1e-6 * fabs(g->lrs[k])))
                visc_test_fail(__FILE__, __LINE__, "%s step %d: lr %.9g, torch %.9g", g->name, k,
                               lr, g->lrs[k]);
        }
    }
}

TEST(schedule_edges) {
    visc_schedule s = {.kind = VISC_SCHED_COSINE,
                       .base_lr = 0.4f,
                       .min_lr = 0.01f,
                       .total_steps = 100,
                       .warmup_steps = 10,
                       .warmup_start = 0.1f};
    CHECK_CLOSE(visc_schedule_lr(&s, 0), 0.04, 0, 1e-6);  /* warmup_start * base_lr */
    CHECK_CLOSE(visc_schedule_lr(&s, -5), 0.04, 0, 1e-6); /* before the start: step 0 */
    CHECK_CLOSE(visc_schedule_lr(&s, 5), 0.04 + 0.36 * 0.5, 0, 1e-6);
    CHECK_CLOSE(visc_schedule_lr(&s, 10), 0.4, 0, 1e-6); /* end of warmup: base_lr */
    CHECK_CLOSE(visc_schedule_lr(&s, 55), 0.01 + 0.39 * 0.5, 0,
                1e-6);                                      /* halfway through the cosine */
    CHECK_CLOSE(visc_schedule_lr(&s, 100), 0.01, 0, 1e-6);  /* last step */
    CHECK_CLOSE(visc_schedule_lr(&s, 1000), 0.01, 0, 1e-6); /* beyond total: stays at min_lr */
    CHECK(visc_schedule_lr(&s, 99) > 0.01f);

    s.kind = VISC_SCHED_ONECYCLE;
    CHECK_CLOSE(visc_schedule_lr(&s, 10), 0.4, 0, 1e-6);
    CHECK_CLOSE(visc_schedule_lr(&s, 55), 0.205, 0, 1e-6);
    CHECK_CLOSE(visc_schedule_lr(&s, 100), 0.01, 0, 1e-6);
    CHECK_CLOSE(visc_schedule_lr(&s, 5000), 0.01, 0, 1e-6);

    s.kind = VISC_SCHED_CONSTANT;
    CHECK_CLOSE(visc_schedule_lr(&s, 0), 0.04, 0, 1e-6);
    CHECK_CLOSE(visc_schedule_lr(&s, 10), 0.4, 0, 1e-6);
    CHECK_CLOSE(visc_schedule_lr(&s, 1 << 30), 0.4, 0, 1e-6);

    visc_schedule st = {.kind = VISC_SCHED_STEP,
                        .base_lr = 1.0f,
                        .total_steps = 10,
                        .step_size = 3,
                        .gamma = 0.1f};
    CHECK_CLOSE(visc_schedule_lr(&st, 0), 1.0, 0, 1e-6);
    CHECK_CLOSE(visc_schedule_lr(&st, 2), 1.0, 0, 1e-6);
    CHECK_CLOSE(visc_schedule_lr(&st, 3), 0.1, 0, 1e-6);
    CHECK_CLOSE(visc_schedule_lr(&st, 12), 1e-4, 0,
                1e-5); /* beyond total: keeps stepping, like torch */

    visc_schedule ms = {.kind = VISC_SCHED_MULTISTEP,
                        .base_lr = 1.0f,
                        .total_steps = 10,
                        .gamma = 0.5f,
                        .milestones = {2, 4},
                        .num_milestones = 2};
    CHECK_CLOSE(visc_schedule_lr(&ms, 1), 1.0, 0, 1e-6);
    CHECK_CLOSE(visc_schedule_lr(&ms, 2), 0.5, 0, 1e-6);
    CHECK_CLOSE(visc_schedule_lr(&ms, 4), 0.25, 0, 1e-6);
    CHECK_CLOSE(visc_schedule_lr(&ms, 100), 0.25, 0, 1e-6);

    /* Degenerate: no steps left after warmup. */
    visc_schedule d = {.kind = VISC_SCHED_COSINE,
                       .base_lr = 1.0f,
                       .min_lr = 0.0f,
                       .total_steps = 5,
                       .warmup_steps = 5};
    CHECK_CLOSE(visc_schedule_lr(&d, 4), 0.8, 0, 1e-6);
    CHECK(visc_schedule_lr(&d, 5) == 0.0f);

    visc_sched_kind k;
    const char *names[] = {"constant", "step", "multistep", "cosine", "onecycle"};
    for (int i = 0; i < 5; i++) {
        CHECK(visc_sched_parse_kind(names[i], &k) == 0 && (int)k == i);
        CHECK(strcmp(visc_sched_kind_name(k), names[i]) == 0);
    }
    CHECK(visc_sched_parse_kind("linear", &k) == -1);
    CHECK(strstr(visc_last_error(), "linear") != NULL);
}

TEST(ema_matches_timm_model_ema_v2) {
    float ema[OG_TOTAL];
    memcpy(ema, og_init, sizeof ema);
    for (int s = 0; s < 3; s++) visc_ema_update(ema, og_grads[s], OG_TOTAL, OG_EMA_DECAY);
    CHECK_ARRAYS("ema", ema, og_ema_expect, OG_TOTAL, ATOL, RTOL);
}

TEST(clip_matches_torch_clip_grad_norm) {
    for (int c = 0; c < OG_CLIPS; c++) {
        float g[OG_TOTAL];
        for (int i = 0; i < OG_TOTAL; i++) g[i] = og_grads[og_clips[c].step][i] * og_clips[c].scale;
        float norm = visc_clip_grad_norm(g, OG_TOTAL, og_clips[c].max_norm);
        CHECK_CLOSE(norm, og_clips[c].norm, 0, RTOL);
        CHECK_ARRAYS("clipped grads", g, og_clips[c].grads, OG_TOTAL, 0, RTOL);
    }
    CHECK(og_clips[0].norm > og_clips[0].max_norm && og_clips[1].norm < og_clips[1].max_norm);
    CHECK(og_clips[2].norm < og_clips[2].max_norm); /* clipped only through the eps */
}

/* 3M floats: the norm in double is exact to float rounding, and the same
 * whatever the thread count. */
TEST(global_norm_is_accurate_and_deterministic) {
    const size_t n = 3000017;
    float *x = visc_malloc(n * sizeof(float), "norm test");
    double ref = 0;
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)((int)(i * 2654435761u % 2001) - 1000) / 1000.0f;
        ref += (double)x[i] * x[i];
    }
    const int threads = visc_num_threads();
    visc_set_num_threads(1);
    float a = visc_global_norm(x, n);
    visc_set_num_threads(4);
    float b = visc_global_norm(x, n);
    visc_set_num_threads(threads);
    CHECK(a == b);
    CHECK(a == (float)sqrt(ref));
    CHECK(visc_global_norm(x, 0) == 0.0f);
    float tiny[3] = {3, 4, 0};
    CHECK(visc_clip_grad_norm(tiny, 3, 10.0f) == 5.0f &&
          tiny[0] == 3.0f); /* under the limit: untouched */
    CHECK(visc_clip_grad_norm(tiny, 3, 1.0f) == 5.0f);
    CHECK_CLOSE(tiny[0], 0.6, 0, 1e-6);
    free(x);
}
