/* test_knn.c: the weighted kNN classifier (eval/knn.c) on hand-built
 * feature sets whose neighbours, votes and accuracies are known. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "visc/rng.h"
#include "visc/ssl_eval.h"

/* A bank over caller-owned arrays (not freed). */
static visc_feature_bank bank_of(float *feats, int32_t *labels, int64_t n, int dim, int classes) {
    visc_feature_bank b = {feats, labels, n, dim, classes};
    return b;
}

/* Unit vector at angle a (radians) in the plane: cos(a - b) is the similarity. */
static void unit2(float *v, double a) {
    v[0] = (float)cos(a);
    v[1] = (float)sin(a);
}

TEST(knn_scores_by_hand) {
    /* bank on the unit circle: angles 0, 0.1, 0.2, 1.0, 3.0 with labels 0 1 1 2 0 */
    const double ang[5] = {0, 0.1, 0.2, 1.0, 3.0};
    int32_t labels[5] = {0, 1, 1, 2, 0};
    float feats[10], q[2];
    for (int i = 0; i < 5; i++) unit2(feats + 2 * i, ang[i]);
    visc_feature_bank b = bank_of(feats, labels, 5, 2, 3);
    unit2(q, 0.0);
    float s[3];
    /* k = 3: rows 0, 1, 2 (sims 1, cos .1, cos .2) */
    CHECK(visc_knn_scores(&b, q, 1, 3, 0.1f, s) == 0);
    CHECK_CLOSE(s[0], exp(1.0 / 0.1), 0, 1e-5);
    CHECK_CLOSE(s[1], exp(cos(0.1) / 0.1) + exp(cos(0.2) / 0.1), 0, 1e-5);
    CHECK_CLOSE(s[2], 0.0, 0, 0);
    /* k = 4 adds row 3 (class 2) */
    CHECK(visc_knn_scores(&b, q, 1, 4, 0.1f, s) == 0);
    CHECK_CLOSE(s[2], exp(cos(1.0) / 0.1), 0, 1e-5);
    /* k = 1: only the nearest */
    CHECK(visc_knn_scores(&b, q, 1, 1, 0.1f, s) == 0);
    CHECK_CLOSE(s[0], exp(10.0), 0, 1e-5);
    CHECK(s[1] == 0 && s[2] == 0);
    /* class 1 has two close votes: it ranks first at k = 3 (e^9.95 + e^9.80 > e^10) */
    CHECK(visc_knn_scores(&b, q, 1, 3, 0.1f, s) == 0);
    CHECK(visc_knn_rank(s, 3, 1) == 0);
    CHECK(visc_knn_rank(s, 3, 0) == 1);
    CHECK(visc_knn_rank(s, 3, 2) == 2);
}

TEST(knn_k_larger_than_bank_uses_all) {
    const double ang[4] = {0.3, 1.2, 2.0, 2.9};
    int32_t labels[4] = {1, 0, 1, 0};
    float feats[8], q[2], s1[2], s2[2];
    for (int i = 0; i < 4; i++) unit2(feats + 2 * i, ang[i]);
    visc_feature_bank b = bank_of(feats, labels, 4, 2, 2);
    unit2(q, 0.5);
    CHECK(visc_knn_scores(&b, q, 1, 200, 0.1f, s1) == 0);
    CHECK(visc_knn_scores(&b, q, 1, 4, 0.1f, s2) == 0);
    CHECK(s1[0] == s2[0] && s1[1] == s2[1]);
    CHECK_CLOSE(s1[1], exp(cos(0.2) / 0.1) + exp(cos(1.5) / 0.1), 0, 1e-5);
    CHECK_CLOSE(s1[0], exp(cos(0.7) / 0.1) + exp(cos(2.4) / 0.1), 0, 1e-5);
}

TEST(knn_neighbour_ties_take_the_lower_bank_index) {
    /* rows 0..3 identical; k = 2 takes rows 0 and 1 (labels 3 and 2) */
    int32_t labels[5] = {3, 2, 1, 0, 0};
    float feats[10] = {1, 0, 1, 0, 1, 0, 1, 0, 0, 1};
    visc_feature_bank b = bank_of(feats, labels, 5, 2, 4);
    float q[2] = {1, 0}, s[4];
    CHECK(visc_knn_scores(&b, q, 1, 2, 0.1f, s) == 0);
    CHECK(s[3] > 0 && s[2] > 0 && s[1] == 0 && s[0] == 0);
    /* the same bank reversed: the lower index is now another row */
    int32_t rev[5] = {0, 1, 2, 3, 0};
    b.labels = rev;
    CHECK(visc_knn_scores(&b, q, 1, 2, 0.1f, s) == 0);
    CHECK(s[0] > 0 && s[1] > 0 && s[2] == 0 && s[3] == 0);
}

TEST(knn_class_ties_rank_the_lower_class_first) {
    float s[4] = {1.0f, 2.0f, 2.0f, 2.0f};
    CHECK(visc_knn_rank(s, 4, 1) == 0);
    CHECK(visc_knn_rank(s, 4, 2) == 1);
    CHECK(visc_knn_rank(s, 4, 3) == 2);
    CHECK(visc_knn_rank(s, 4, 0) == 3);
    /* a query equidistant to two classes: predicted as the lower one */
    int32_t labels[2] = {1, 0};
    float feats[4] = {1, 0, 0, 1}, q[2] = {0.70710678f, 0.70710678f};
    visc_feature_bank b = bank_of(feats, labels, 2, 2, 2), qs = bank_of(q, labels, 1, 2, 2);
    visc_knn_counts c;
    int32_t want0 = 0;
    qs.labels = &want0;
    CHECK(visc_knn_classify(&b, &qs, 2, 0.1f, &c) == 0);
    CHECK(c.top1 == 1 && c.top5 == 1 && c.count == 1);
    int32_t want1 = 1;
    qs.labels = &want1;
    CHECK(visc_knn_classify(&b, &qs, 2, 0.1f, &c) == 0);
    CHECK(c.top1 == 0 && c.top5 == 1);
}

TEST(knn_temperature_changes_the_vote) {
    /* one very close neighbour of class 0, two farther ones of class 1:
     * a low temperature trusts the nearest, a high one counts votes */
    int32_t labels[3] = {0, 1, 1};
    float feats[6], q[2], s[2];
    unit2(feats, 0.05);
    unit2(feats + 2, 0.6);
    unit2(feats + 4, -0.6);
    unit2(q, 0.0);
    visc_feature_bank b = bank_of(feats, labels, 3, 2, 2);
    CHECK(visc_knn_scores(&b, q, 1, 3, 0.02f, s) == 0);
    CHECK(visc_knn_rank(s, 2, 0) == 0);
    CHECK(visc_knn_scores(&b, q, 1, 3, 1.0f, s) == 0);
    CHECK(visc_knn_rank(s, 2, 1) == 0);
    /* the ratio of the votes is exp((s0 - s1) / t) */
    CHECK_CLOSE(s[0] / s[1], exp(cos(0.05)) / (2 * exp(cos(0.6))), 0, 1e-5);
}

TEST(knn_exact_top1_top5_accuracy) {
    /* 8 classes at angles c * pi / 4 on the circle, 3 bank rows each
     * (slightly spread); 16 queries: query j sits at class j % 8 exactly
     * (neighbours all its own class for k = 3) ... */
    enum { C = 8, PER = 3, N = C * PER, Q = 16 };
    const double pi = 3.14159265358979323846;
    float feats[2 * N], qf[2 * Q];
    int32_t labels[N], ql[Q];
    for (int c = 0; c < C; c++)
        for (int j = 0; j < PER; j++) {
            unit2(feats + 2 * (c * PER + j), c * pi / 4 + (j - 1) * 0.01);
            labels[c * PER + j] = c;
        }
    for (int j = 0; j < Q; j++) {
        unit2(qf + 2 * j, (j % C) * pi / 4);
        /* ... and carries the right label for j < 8; j >= 8 is labelled
         * with the class two steps around: with k = 15 the votes come from
         * its own class, both neighbours at pi/4 and both classes at pi/2,
         * so the label ranks 3rd or 4th: inside top-5, outside top-1 */
        ql[j] = j < C ? j % C : (j % C + 2) % C;
    }
    visc_feature_bank b = bank_of(feats, labels, N, 2, C), qs = bank_of(qf, ql, Q, 2, C);
    visc_knn_counts c;
    CHECK(visc_knn_classify(&b, &qs, 15, 0.1f, &c) == 0);
    CHECK(c.count == Q);
    CHECK(c.top1 == C);
    CHECK(c.top5 == Q);
    /* k = 3: only the own class votes; every other class scores 0 and
     * zero scores rank by class index, so a shifted label is in the top 5
     * only when fewer than 4 lower classes (besides its own) precede it */
    CHECK(visc_knn_classify(&b, &qs, 3, 0.1f, &c) == 0);
    CHECK(c.top1 == C);
    int want5 = C;
    for (int j = C; j < Q; j++) {
        int own = j % C, lab = (own + 2) % C;
        int before = 1 + lab - (own < lab ? 1 : 0); /* own class, then lower zero-score classes */
        if (before < 5) want5++;
    }
    CHECK(c.top5 == want5);
}

/* Straightforward reference: all similarities in double, full sort. */
typedef struct {
    double sim;
    int64_t idx;
} pair;
static int by_sim(const void *a, const void *b) {
    const pair *x = a, *y = b;
    if (x->sim != y->sim) return x->sim < y->sim ? 1 : -1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

TEST(knn_matches_brute_force) {
    enum { N = 700, D = 24, C = 10, Q = 40, K = 25 };
    float *bank = malloc(sizeof(float) * N * D), *q = malloc(sizeof(float) * Q * D);
    int32_t labels[N];
    visc_rng r = visc_rng_make(7, 99, 0);
    for (int i = 0; i < N * D; i++) bank[i] = visc_rng_normal(&r);
    for (int i = 0; i < Q * D; i++) q[i] = visc_rng_normal(&r);
    for (int i = 0; i < N; i++) labels[i] = (int32_t)visc_rng_below(&r, C);
    for (int i = 0; i < N; i++) { /* normalize rows */
        double ss = 0;
        for (int j = 0; j < D; j++) ss += bank[i * D + j] * bank[i * D + j];
        for (int j = 0; j < D; j++) bank[i * D + j] /= (float)sqrt(ss);
    }
    visc_feature_bank b = bank_of(bank, labels, N, D, C);
    float *s = malloc(sizeof(float) * Q * C);
    CHECK(visc_knn_scores(&b, q, Q, K, 0.07f, s) == 0);
    pair *p = malloc(sizeof(pair) * N);
    double worst = 0;
    for (int i = 0; i < Q; i++) {
        for (int n = 0; n < N; n++) {
            double dot = 0;
            for (int j = 0; j < D; j++) dot += (double)q[i * D + j] * bank[n * D + j];
            p[n].sim = dot;
            p[n].idx = n;
        }
        qsort(p, N, sizeof(pair), by_sim);
        double want[C] = {0};
        for (int j = 0; j < K; j++) want[labels[p[j].idx]] += exp(p[j].sim / 0.07);
        for (int c = 0; c < C; c++) {
            double e = fabs(s[i * C + c] - want[c]) / (want[c] > 1 ? want[c] : 1);
            if (e > worst) worst = e;
        }
    }
    CHECK_MSG(worst < 1e-4, "worst relative error %g", worst);
    free(p);
    free(s);
    free(bank);
    free(q);
}

TEST(knn_rejects_bad_settings) {
    float feats[2] = {1, 0};
    int32_t labels[1] = {0};
    visc_feature_bank b = bank_of(feats, labels, 1, 2, 1);
    float s[1];
    CHECK(visc_knn_scores(&b, feats, 1, 0, 0.1f, s) == -1);
    CHECK(strstr(visc_last_error(), "k must be"));
    CHECK(visc_knn_scores(&b, feats, 1, 5, 0.0f, s) == -1);
    CHECK(strstr(visc_last_error(), "temperature"));
    visc_feature_bank q3 = bank_of(feats, labels, 1, 1, 1);
    visc_knn_counts c;
    CHECK(visc_knn_classify(&b, &q3, 5, 0.1f, &c) == -1);
}
