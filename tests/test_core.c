/* test_core.c: RNG, tables and the arena. */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "visc/rng.h"
#include "visc/table.h"

TEST(philox_known_answer) {
    /* Known-answer vectors from the Random123 distribution (kat_vectors):
     * philox4x32 10 rounds, counter 0 / key 0 and counter all-ones / key all-ones. */
    uint32_t out[4];
    visc_philox4x32(0, 0, 0, out);
    CHECK(out[0] == 0x6627e8d5u && out[1] == 0xe169c58du && out[2] == 0xbc57ac4cu &&
          out[3] == 0x9b00dbd8u);
    visc_philox4x32(~0ull, ~0ull, ~0ull, out);
    CHECK(out[0] == 0x408f276du && out[1] == 0x41c83b0eu && out[2] == 0xa20bc7c6u &&
          out[3] == 0x6d5451fdu);
}

TEST(rng_uniform_and_normal_moments) {
    visc_rng r = visc_rng_make(42, VISC_STREAM_INIT, 0);
    double s = 0, s2 = 0, n1 = 0, n2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        float u = visc_rng_uniform(&r);
        CHECK(u >= 0.0f && u < 1.0f);
        s += u;
        s2 += (double)u * u;
        float z = visc_rng_normal(&r);
        n1 += z;
        n2 += (double)z * z;
    }
    CHECK_CLOSE(s / n, 0.5, 0.005, 0);
    CHECK_CLOSE(s2 / n - (s / n) * (s / n), 1.0 / 12, 0.002, 0);
    CHECK_CLOSE(n1 / n, 0.0, 0.01, 0);
    CHECK_CLOSE(n2 / n, 1.0, 0.02, 0);
}

/* The parallel fill is n calls of visc_rng_normal, bit for bit, and leaves
 * the stream where they would: from a block boundary (past the parallel
 * threshold, and after whole blocks drawn) and from mid-block. */
TEST(rng_normal_fill_is_the_serial_draws) {
    enum { N = 100003 };
    float *fill = malloc(N * sizeof(float)), *serial = malloc(N * sizeof(float));
    for (int start = 0; start < 3; start++) { /* words drawn first: 0, 4, 1 */
        const int skip = start == 0 ? 0 : start == 1 ? 4 : 1;
        visc_rng a = visc_rng_make(11, VISC_STREAM_INIT, 5), b = a;
        for (int k = 0; k < skip; k++) visc_rng_u32(&a), visc_rng_u32(&b);
        visc_rng_normal_fill(fill, N, 0.37f, &a);
        for (int j = 0; j < N; j++) serial[j] = 0.37f * visc_rng_normal(&b);
        CHECK_MSG(memcmp(fill, serial, N * sizeof(float)) == 0, "%d words drawn first", skip);
        CHECK(visc_rng_u32(&a) == visc_rng_u32(&b));
    }
    free(fill), free(serial);
}

TEST(rng_streams_are_reproducible_and_distinct) {
    visc_rng a = visc_rng_make(7, VISC_STREAM_SHUFFLE, 3),
             b = visc_rng_make(7, VISC_STREAM_SHUFFLE, 3);
    visc_rng c = visc_rng_make(7, VISC_STREAM_SHUFFLE, 4),
             d = visc_rng_make(8, VISC_STREAM_SHUFFLE, 3);
    int same_c = 0, same_d = 0;
    for (int i = 0; i < 100; i++) {
        uint32_t x = visc_rng_u32(&a);
        CHECK(x == visc_rng_u32(&b));
        same_c += x == visc_rng_u32(&c);
        same_d += x == visc_rng_u32(&d);
    }
    CHECK(same_c < 3 && same_d < 3);
}

TEST(rng_permutation_is_a_permutation) {
    int32_t perm[1000];
    int seen[1000] = {0};
    visc_rng_permutation(perm, 1000, 1, VISC_STREAM_SHUFFLE, 0);
    int moved = 0;
    for (int i = 0; i < 1000; i++) {
        CHECK(perm[i] >= 0 && perm[i] < 1000);
        if (perm[i] >= 0 && perm[i] < 1000) seen[perm[i]]++;
        moved += perm[i] != i;
    }
    for (int i = 0; i < 1000; i++) CHECK(seen[i] == 1);
    CHECK(moved > 900);
}

TEST(rng_below_is_uniform) {
    visc_rng r = visc_rng_make(3, 9, 0);
    int counts[7] = {0};
    for (int i = 0; i < 70000; i++) counts[visc_rng_below(&r, 7)]++;
    for (int i = 0; i < 7; i++) CHECK(abs(counts[i] - 10000) < 500);
}

TEST(table_layout) {
    visc_table t;
    visc_table_init(&t);
    int64_t s1[2] = {3, 5}, s2[1] = {7};
    int a = visc_table_add(&t, "conv.weight", 2, s1, 0);
    int b = visc_table_add(&t, "bn.bias", 1, s2, VISC_TENSOR_NO_DECAY);
    visc_table_alloc(&t);
    CHECK(t.entries[a].numel == 15 && t.entries[b].numel == 7);
    CHECK(t.entries[b].offset % 16 == 0 && t.entries[b].offset >= 15);
    CHECK(t.total % 16 == 0 && t.total >= t.entries[b].offset + 7);
    CHECK(visc_table_find(&t, "bn.bias") == b && visc_table_find(&t, "nope") == -1);
    CHECK(((uintptr_t)visc_table_get(&t, b) & 63) == 0);
    CHECK(visc_table_get(&t, a)[14] == 0.0f);
    visc_table_free(&t);
}

TEST(arena_plans_then_carves) {
    visc_arena plan;
    visc_arena_init(&plan, 0);
    CHECK(visc_arena_floats(&plan, 10) == NULL);
    visc_arena_floats(&plan, 100);
    visc_arena a;
    visc_arena_init(&a, plan.used);
    float *x = visc_arena_floats(&a, 10), *y = visc_arena_floats(&a, 100);
    CHECK(x && y && ((uintptr_t)y & 63) == 0 && y >= x + 10);
    CHECK(a.used == plan.used);
    visc_arena_free(&a);
}

/* MemTotal + SwapTotal of /proc/meminfo in bytes; 0 when unreadable. */
static double machine_memory_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    double kib = 0, v;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %lf", &v) == 1 || sscanf(line, "SwapTotal: %lf", &v) == 1)
            kib += v;
    fclose(f);
    return kib * 1024;
}

TEST(memory_available_is_the_machine_within_the_limit) {
    unsetenv("VISC_MEMORY_LIMIT");
    double machine = machine_memory_bytes();
    size_t avail = visc_memory_available();
    CHECK(machine > 0);
    CHECK(avail > ((size_t)64 << 20) && (double)avail <= machine);
    /* A limit under what is there lowers it; one above leaves it. */
    setenv("VISC_MEMORY_LIMIT", "0.5G", 1);
    size_t capped = visc_memory_available();
    CHECK(capped < ((size_t)512 << 20) && capped > 0);
    setenv("VISC_MEMORY_LIMIT", "100000G", 1);
    size_t high = visc_memory_available();
    CHECK((double)high <= machine && high > avail / 2);
    /* Allocations under the limit still go through; the refusal itself
     * (visc_die) is checked by tests/e2e_errors.sh. */
    setenv("VISC_MEMORY_LIMIT", "1G", 1);
    char *p = visc_alloc_aligned((size_t)128 << 20, "a test buffer");
    CHECK(p && p[0] == 0 && p[(128 << 20) - 1] == 0);
    visc_free_aligned(p);
    unsetenv("VISC_MEMORY_LIMIT");
}

TEST(parse_size_units) {
    long long b = -1;
    CHECK(visc_parse_size("1048576", &b) == 0 && b == 1048576);
    CHECK(visc_parse_size("512K", &b) == 0 && b == 512 * 1024);
    CHECK(visc_parse_size("1.5GiB", &b) == 0 && b == 3LL << 29);
    CHECK(visc_parse_size("64M", &b) == 0 && b == 64LL << 20);
    CHECK(visc_parse_size("0B", &b) == 0 && b == 0);
    b = 7;
    CHECK(visc_parse_size("", &b) == -1 && visc_parse_size("G", &b) == -1);
    CHECK(visc_parse_size("3x", &b) == -1 && visc_parse_size("-1M", &b) == -1);
    CHECK(visc_parse_size("8 G", &b) == -1 && visc_parse_size("1e30G", &b) == -1);
    CHECK(visc_parse_size("nan", &b) == -1 && b == 7);
}
