/* test_io.c: safetensors, atomic writes, TensorBoard event files, configs. */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "visc/io.h"
#include "visc/json.h"

/* ---------------------------------------------------------------- helpers */

static char *temp_dir(void) {
    static char dirs[16][64];
    static int n;
    char *d = dirs[n++ % 16];
    strcpy(d, "/tmp/visc_test_io.XXXXXX");
    if (!mkdtemp(d)) {
        perror("mkdtemp");
        exit(2);
    }
    return d;
}

static void rm_rf(const char *path) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

static int has(const char *haystack, const char *needle) {
    return strstr(haystack, needle) != NULL;
}

#define CHECK_ERR(call, needle)                                                                    \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        CHECK_MSG(rc_ == -1, "%s returned %d, expected -1", #call, rc_);                           \
        CHECK_MSG(has(visc_last_error(), needle), "error '%s' lacks '%s'", visc_last_error(),      \
                  needle);                                                                         \
    } while (0)

static size_t read_file(const char *path, uint8_t *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return (size_t)-1;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) {
        perror(path);
        exit(2);
    }
    fclose(f);
}

/* Number of entries in dir whose name contains needle. */
static int count_files(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, needle) != NULL;
    closedir(d);
    return n;
}

/* A safetensors image: 8-byte length, the JSON header, data_len bytes of data. */
static size_t st_image(uint8_t *buf, const char *json, size_t data_len) {
    size_t n = strlen(json);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, json, n);
    for (size_t i = 0; i < data_len; i++) buf[8 + n + i] = (uint8_t)i;
    return 8 + n + data_len;
}

static int st_parse_json(const char *json, size_t data_len) {
    static uint8_t buf[8192];
    size_t n = st_image(buf, json, data_len);
    visc_safetensors st;
    int rc = visc_safetensors_parse(&st, buf, n);
    visc_safetensors_close(&st);
    return rc;
}

/* ---------------------------------------------------------------- safetensors */

static uint16_t f16_bits[] = {0x3E00 /* 1.5 */,   0xC000 /* -2 */,    0x0001 /* 2^-24 */,
                              0x7BFF /* 65504 */, 0x0400 /* 2^-14 */, 0x8000 /* -0 */};
static float f16_vals[] = {1.5f, -2.0f, 5.9604644775390625e-8f, 65504.0f, 6.103515625e-5f, -0.0f};

TEST(safetensors_round_trip_all_dtypes) {
    char *dir = temp_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/m.safetensors", dir);

    float f32[6] = {1, -2, 3.5f, 1e-30f, -1e30f, 0.25f};
    uint16_t bf16[3] = {0x3F80 /* 1 */, 0xC049 /* -3.140625 */, 0x7F80 /* inf */};
    double f64[2] = {0.1, -1e10};
    int64_t i64 = 1234567;
    int32_t i32[4] = {-7, 0, 7, 2147483647};
    uint8_t u8[3] = {0, 128, 255}, bools[2] = {1, 0};
    int64_t s23[] = {2, 3}, s6[] = {6}, s3[] = {3}, s2[] = {2}, s22[] = {2, 2}, s04[] = {0, 4};

    visc_st_writer *w = visc_st_writer_new();
    visc_st_writer_add(w, "z.f32", VISC_DTYPE_F32, 2, s23, f32); /* added first, sorts last */
    visc_st_writer_add(w, "f16", VISC_DTYPE_F16, 1, s6, f16_bits);
    visc_st_writer_add(w, "bf16", VISC_DTYPE_BF16, 1, s3, bf16);
    visc_st_writer_add(w, "f64", VISC_DTYPE_F64, 1, s2, f64);
    visc_st_writer_add(w, "bn.num_batches_tracked", VISC_DTYPE_I64, 0, NULL, &i64);
    visc_st_writer_add(w, "i32", VISC_DTYPE_I32, 2, s22, i32);
    visc_st_writer_add(w, "u8", VISC_DTYPE_U8, 1, s3, u8);
    visc_st_writer_add(w, "mask", VISC_DTYPE_BOOL, 1, s2, bools);
    visc_st_writer_add(w, "empty", VISC_DTYPE_F32, 2, s04, NULL);
    visc_st_writer_meta(w, "format", "pt");
    visc_st_writer_meta(w, "odd \"key\"\\", "line\nbreak, tab\t, caf\xC3\xA9");
    visc_st_writer_meta(w, "format", "pt2"); /* later value wins */
    f32[0] = 99;                             /* data is copied at add time */
    CHECK(visc_st_writer_save(w, path) == 0);
    visc_st_writer_free(w);
    f32[0] = 1;

    /* Header padded so the data section starts 8-byte aligned. */
    uint8_t raw[4096];
    size_t size = read_file(path, raw, sizeof raw);
    CHECK(size > 8 && size < sizeof raw);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | raw[i];
    CHECK(hlen % 8 == 0);
    CHECK(raw[8] == '{');
    CHECK(count_files(dir, ".tmp.") == 0);

    visc_safetensors st;
    CHECK(visc_safetensors_open(&st, path) == 0);
    CHECK(st.count == 9);
    CHECK(st.mapping != NULL);
    CHECK(st.data_size == 24 + 12 + 6 + 16 + 8 + 16 + 3 + 2 + 0);
    /* Sorted by name in the index, and laid out in name order in the file. */
    for (int i = 1; i < st.count; i++) {
        CHECK(strcmp(st.tensors[i - 1].name, st.tensors[i].name) < 0);
        CHECK(st.tensors[i - 1].end <= st.tensors[i].begin);
    }
    CHECK(strcmp(visc_safetensors_meta(&st, "format"), "pt2") == 0);
    CHECK(strcmp(visc_safetensors_meta(&st, "odd \"key\"\\"), "line\nbreak, tab\t, caf\xC3\xA9") ==
          0);
    CHECK(visc_safetensors_meta(&st, "absent") == NULL);

    const visc_st_tensor *t = visc_safetensors_find(&st, "z.f32");
    CHECK(t && t->dtype == VISC_DTYPE_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3);
    CHECK(t && t->numel == 6 && memcmp(st.data + t->begin, f32, 24) == 0);
    float out[8];
    CHECK(visc_safetensors_read_f32(&st, "z.f32", out, 6) == 0);
    CHECK_ARRAYS("f32", out, f32, 6, 0, 0);

    t = visc_safetensors_find(&st, "bn.num_batches_tracked");
    CHECK(t && t->dtype == VISC_DTYPE_I64 && t->ndim == 0 && t->numel == 1);
    CHECK(visc_safetensors_read_f32(&st, "bn.num_batches_tracked", out, 1) == 0 &&
          out[0] == 1234567.0f);

    CHECK(visc_safetensors_read_f32(&st, "f16", out, 6) == 0);
    CHECK_ARRAYS("f16", out, f16_vals, 6, 0, 0);
    CHECK(signbit(out[5]));
    CHECK(visc_safetensors_read_f32(&st, "bf16", out, 3) == 0);
    CHECK(out[0] == 1.0f && out[1] == -3.140625f && isinf(out[2]) && out[2] > 0);
    CHECK(visc_safetensors_read_f32(&st, "f64", out, 2) == 0);
    CHECK(out[0] == (float)0.1 && out[1] == -1e10f);
    CHECK(visc_safetensors_read_f32(&st, "i32", out, 4) == 0);
    CHECK(out[0] == -7 && out[1] == 0 && out[2] == 7 && out[3] == 2147483648.0f);
    CHECK(visc_safetensors_read_f32(&st, "u8", out, 3) == 0);
    CHECK(out[0] == 0 && out[1] == 128 && out[2] == 255);
    CHECK(visc_safetensors_read_f32(&st, "mask", out, 2) == 0 && out[0] == 1 && out[1] == 0);
    t = visc_safetensors_find(&st, "empty");
    CHECK(t && t->numel == 0 && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 4);
    CHECK(visc_safetensors_read_f32(&st, "empty", out, 0) == 0);
    int64_t want23[] = {2, 3};
    CHECK(visc_safetensors_read_f32_shaped(&st, "z.f32", out, 2, want23) == 0);
    visc_safetensors_close(&st);
    CHECK(st.mapping == NULL && st.tensors == NULL);

    /* The same image parses from memory too. */
    CHECK(visc_safetensors_parse(&st, raw, size) == 0 && st.count == 9 && st.mapping == NULL);
    visc_safetensors_close(&st);
    rm_rf(dir);
}

TEST(safetensors_read_errors_name_tensor_and_shapes) {
    char *dir = temp_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    float x[12] = {0};
    int64_t shape[] = {3, 4};
    visc_st_writer *w = visc_st_writer_new();
    visc_st_writer_add(w, "fc.weight", VISC_DTYPE_F32, 2, shape, x);
    CHECK(visc_st_writer_save(w, path) == 0);
    visc_st_writer_free(w);

    visc_safetensors st;
    CHECK(visc_safetensors_open(&st, path) == 0);
    float out[12];
    char want[512];
    snprintf(want, sizeof want, "no tensor named 'fc.bias' in %s", path);
    CHECK_ERR(visc_safetensors_read_f32(&st, "fc.bias", out, 4), want);
    CHECK_ERR(visc_safetensors_read_f32(&st, "fc.weight", out, 10),
              "has shape [3, 4] (12 elements), expected 10");
    CHECK(has(visc_last_error(), "'fc.weight'") && has(visc_last_error(), path));
    int64_t other[] = {4, 3};
    CHECK_ERR(visc_safetensors_read_f32_shaped(&st, "fc.weight", out, 2, other),
              "has shape [3, 4], expected [4, 3]");
    visc_safetensors_close(&st);
    rm_rf(dir);
}

TEST(safetensors_add_table_with_prefix) {
    visc_table t;
    visc_table_init(&t);
    int64_t s1[] = {3}, s2[] = {2, 2};
    visc_table_add(&t, "bias", 1, s1, 0);
    visc_table_add(&t, "weight", 2, s2, 0);
    visc_table_alloc(&t);
    for (int i = 0; i < 3; i++) visc_table_get(&t, 0)[i] = (float)i + 0.5f;
    for (int i = 0; i < 4; i++) visc_table_get(&t, 1)[i] = -(float)i;

    char *dir = temp_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    visc_st_writer *w = visc_st_writer_new();
    visc_st_writer_add_table(w, &t, "fc.");
    CHECK(visc_st_writer_save(w, path) == 0);
    visc_st_writer_free(w);

    visc_safetensors st;
    CHECK(visc_safetensors_open(&st, path) == 0);
    CHECK(st.count == 2);
    float out[4];
    CHECK(visc_safetensors_read_f32_shaped(&st, "fc.bias", out, 1, s1) == 0);
    CHECK_ARRAYS("fc.bias", out, visc_table_get(&t, 0), 3, 0, 0);
    CHECK(visc_safetensors_read_f32_shaped(&st, "fc.weight", out, 2, s2) == 0);
    CHECK_ARRAYS("fc.weight", out, visc_table_get(&t, 1), 4, 0, 0);
    visc_safetensors_close(&st);
    visc_table_free(&t);
    rm_rf(dir);
}

/* tests/golden/io_fixture.safetensors was written by the Python safetensors
 * library (tools/make_io_fixtures.py); every value is exact in its dtype. */
TEST(safetensors_reads_python_fixture_exactly) {
    visc_safetensors st;
    if (visc_safetensors_open(&st, visc_golden_path("io_fixture.safetensors")) != 0) {
        CHECK_MSG(0, "%s", visc_last_error());
        return;
    }
    CHECK(st.count == 9);
    CHECK(strcmp(visc_safetensors_meta(&st, "format") ? visc_safetensors_meta(&st, "format") : "",
                 "pt") == 0);
    CHECK(visc_safetensors_meta(&st, "source") != NULL);
    float out[8];
    int64_t s23[] = {2, 3};
    float conv[6] = {-1.25f, -0.75f, -0.25f, 0.25f, 0.75f, 1.25f};
    CHECK(visc_safetensors_read_f32_shaped(&st, "conv.weight", out, 2, s23) == 0);
    CHECK_ARRAYS("conv.weight", out, conv, 6, 0, 0);
    CHECK(visc_safetensors_read_f32(&st, "half", out, 6) == 0);
    CHECK_ARRAYS("half", out, f16_vals, 6, 0, 0);
    CHECK(visc_safetensors_read_f32(&st, "brain", out, 4) == 0);
    float brain[4] = {1.0f, -3.140625f, 1.2676506002282294e30f /* 2^100 */, 0.0078125f};
    CHECK_ARRAYS("brain", out, brain, 4, 0, 0);
    CHECK(visc_safetensors_read_f32(&st, "double", out, 3) == 0);
    CHECK(out[0] == (float)0.1 && out[1] == -1e10f && out[2] == 2.5f);
    const visc_st_tensor *t = visc_safetensors_find(&st, "bn.num_batches_tracked");
    CHECK(t && t->dtype == VISC_DTYPE_I64 && t->ndim == 0);
    CHECK(visc_safetensors_read_f32(&st, "bn.num_batches_tracked", out, 1) == 0);
    CHECK(out[0] == (float)123456789);
    CHECK(visc_safetensors_read_f32(&st, "ints", out, 4) == 0);
    CHECK(out[0] == -7 && out[1] == 0 && out[2] == 7 && out[3] == (float)2147483647);
    CHECK(visc_safetensors_read_f32(&st, "bytes", out, 3) == 0);
    CHECK(out[0] == 0 && out[1] == 128 && out[2] == 255);
    CHECK(visc_safetensors_read_f32(&st, "mask", out, 4) == 0);
    CHECK(out[0] == 1 && out[1] == 0 && out[2] == 1 && out[3] == 1);
    t = visc_safetensors_find(&st, "empty");
    CHECK(t && t->numel == 0 && t->shape[0] == 0 && t->shape[1] == 3);
    visc_safetensors_close(&st);
}

TEST(safetensors_rejects_malformed_files) {
    uint8_t buf[256];
    visc_safetensors st;
    /* Too short for the length field. */
    CHECK_ERR(visc_safetensors_parse(&st, (const uint8_t *)"\x10\0\0", 3), "too short");
    /* Header length beyond the file; also a file cut inside its header. */
    size_t n = st_image(buf, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    CHECK(visc_safetensors_parse(&st, buf, n) == 0);
    visc_safetensors_close(&st);
    CHECK_ERR(visc_safetensors_parse(&st, buf, 20), "exceeds the file size");
    buf[7] = 0x80; /* length near 2^63: must not overflow the bounds check */
    CHECK_ERR(visc_safetensors_parse(&st, buf, n), "exceeds the file size");

    CHECK_ERR(st_parse_json("[1, 2]   ", 0), "does not start with '{'");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4),
              "JSON: unterminated object");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}}", 4),
              "trailing characters");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\" \"shape\":[1]}}", 4), "expected ',' or '}'");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
              "tensor 'a': unknown dtype 'F8'");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4),
              "shape[0] is not a non-negative integer");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}",
                            4),
              "shape[0] is not a non-negative integer");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296]"
                            ","
                            "\"data_offsets\":[0,4]}}",
                            4),
              "shape is too large");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_"
                            "offsets\":[0,4]}}",
                            4),
              "9 dimensions");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4),
              "data_offsets [0, 8] outside the data section of 4 bytes");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4),
              "outside the data section");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,"
                            "99999999999999999999]}}",
                            4),
              "\"data_offsets\" must be [begin, end]");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4),
              "\"data_offsets\" must be [begin, end]");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8),
              "F32 [2] needs 8 bytes but data_offsets span 4");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                            "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                            12),
              "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
    CHECK_ERR(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                            "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                            8),
              "duplicate tensor name 'a'");
    CHECK_ERR(st_parse_json("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4),
              "missing string \"dtype\"");
    CHECK_ERR(st_parse_json("{\"a\":[1]}", 4), "entry is not an object");
    CHECK_ERR(st_parse_json("{\"__metadata__\":{\"k\":1}}", 0), "metadata 'k' is not a string");
    CHECK_ERR(st_parse_json("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0),
              "duplicate metadata key");
    CHECK_ERR(st_parse_json("{\"__metadata__\":[]}", 0), "\"__metadata__\" is not an object");
    char json[512];
    snprintf(json, sizeof json,
             "{\"%0*d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", VISC_MAX_NAME,
             7);
    CHECK_ERR(st_parse_json(json, 1), "is longer than");
    snprintf(json, sizeof json,
             "{\"%0*d\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
             VISC_MAX_NAME - 1, 7);
    CHECK(st_parse_json(json, 1) == 0);

    /* Accepted: padding, gaps between tensors, empty tensors anywhere, no tensors. */
    CHECK(st_parse_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
                        "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[6,6]}}      ",
                        8) == 0);
    CHECK(st_parse_json("{}", 0) == 0);
}

TEST(safetensors_open_errors) {
    char *dir = temp_dir();
    char path[256];
    visc_safetensors st;
    snprintf(path, sizeof path, "%s/missing.safetensors", dir);
    CHECK_ERR(visc_safetensors_open(&st, path), "No such file");
    CHECK(has(visc_last_error(), path));
    snprintf(path, sizeof path, "%s/empty.safetensors", dir);
    write_file(path, "", 0);
    CHECK_ERR(visc_safetensors_open(&st, path), "too short");
    CHECK_ERR(visc_safetensors_open(&st, dir), "not a regular file");
    /* A bad file's error names the file. */
    uint8_t buf[128];
    size_t n = st_image(buf, "{\"a\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
    snprintf(path, sizeof path, "%s/bad.safetensors", dir);
    write_file(path, buf, n);
    CHECK_ERR(visc_safetensors_open(&st, path), "unknown dtype 'Q7'");
    CHECK(has(visc_last_error(), path));
    visc_safetensors_close(&st); /* harmless after a failed open */
    rm_rf(dir);
}

/* ---------------------------------------------------------------- JSON */

TEST(json_strings_numbers_and_limits) {
    visc_json v;
    const char *doc =
        " {\"a\\u00e9\\ud83d\\ude00\\n\\\"\": [1, -2, 3.5e2, true, false, null, {}]} ";
    CHECK(visc_json_parse(&v, doc, strlen(doc)) == 0);
    CHECK(v.type == VISC_JSON_OBJECT && v.count == 1);
    CHECK(strcmp(v.keys[0], "a\xC3\xA9\xF0\x9F\x98\x80\n\"") == 0);
    const visc_json *arr = &v.items[0];
    int64_t x;
    CHECK(arr->type == VISC_JSON_ARRAY && arr->count == 7);
    CHECK(visc_json_int(&arr->items[1], &x) == 0 && x == -2);
    CHECK(visc_json_int(&arr->items[2], &x) == -1 && strcmp(arr->items[2].str, "3.5e2") == 0);
    CHECK(arr->items[3].type == VISC_JSON_BOOL && arr->items[3].boolean == 1);
    CHECK(arr->items[5].type == VISC_JSON_NULL && arr->items[6].type == VISC_JSON_OBJECT);
    visc_json_free(&v);

    const char *big = "9223372036854775807", *bigger = "9223372036854775808";
    CHECK(visc_json_parse(&v, big, strlen(big)) == 0 && visc_json_int(&v, &x) == 0 &&
          x == INT64_MAX);
    visc_json_free(&v);
    CHECK(visc_json_parse(&v, bigger, strlen(bigger)) == 0 && visc_json_int(&v, &x) == -1);
    visc_json_free(&v);

    CHECK_ERR(visc_json_parse(&v, "\"\xC3\"", 3), "invalid UTF-8");
    CHECK_ERR(visc_json_parse(&v, "\"\xED\xA0\x80\"", 5), "invalid UTF-8"); /* encoded surrogate */
    CHECK_ERR(visc_json_parse(&v, "\"\\ud800\"", 8), "unpaired surrogate");
    CHECK_ERR(visc_json_parse(&v, "\"\\u0000\"", 8), "NUL");
    CHECK_ERR(visc_json_parse(&v, "\"a\nb\"", 5), "control character");
    CHECK_ERR(visc_json_parse(&v, "\"\\x\"", 4), "bad escape");
    CHECK_ERR(visc_json_parse(&v, "01", 2), "trailing");
    CHECK_ERR(visc_json_parse(&v, "-", 1), "bad number");
    CHECK_ERR(visc_json_parse(&v, "1.", 2), "bad number");
    CHECK_ERR(visc_json_parse(&v, "tru", 3), "unexpected character");
    CHECK_ERR(visc_json_parse(&v, "", 0), "unexpected end");
    CHECK_ERR(visc_json_parse(&v, "[1,]", 4), "at byte 3");
    char deep[300];
    memset(deep, '[', 200);
    memset(deep + 200, ']', 100); /* also unbalanced, but depth trips first */
    CHECK_ERR(visc_json_parse(&v, deep, 300), "nesting too deep");
    memset(deep, '[', 60);
    memset(deep + 60, ']', 60);
    CHECK(visc_json_parse(&v, deep, 120) == 0);
    visc_json_free(&v);
}

/* ---------------------------------------------------------------- atomic */

TEST(atomic_write_replaces_and_cleans_up) {
    char *dir = temp_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/f.bin", dir);
    const void *parts[3] = {"abc", "", "defg"};
    size_t sizes[3] = {3, 0, 4};
    CHECK(visc_write_file_atomic(path, parts, sizes, 3) == 0);
    uint8_t buf[64];
    CHECK(read_file(path, buf, sizeof buf) == 7 && memcmp(buf, "abcdefg", 7) == 0);
    sizes[0] = 1;
    CHECK(visc_write_file_atomic(path, parts, sizes, 1) == 0);
    CHECK(read_file(path, buf, sizeof buf) == 1 && buf[0] == 'a');
    CHECK(count_files(dir, ".tmp.") == 0);
    rm_rf(dir);
}

TEST(atomic_write_failures_leave_old_file) {
    char *dir = temp_dir();
    char path[256], sub[256];
    const void *parts[1] = {"new contents"};
    size_t sizes[1] = {12};

    /* Missing directory. */
    snprintf(path, sizeof path, "%s/no/such/dir/f.bin", dir);
    CHECK_ERR(visc_write_file_atomic(path, parts, sizes, 1), "No such file or directory");
    CHECK(has(visc_last_error(), path));

    /* Parent is a regular file (fails even for root). */
    snprintf(sub, sizeof sub, "%s/plain", dir);
    write_file(sub, "x", 1);
    snprintf(path, sizeof path, "%s/plain/f.bin", dir);
    CHECK_ERR(visc_write_file_atomic(path, parts, sizes, 1), "Not a directory");

    /* Read-only directory with an existing file (root ignores permissions,
     * so there the write may legitimately succeed; check it only as a user). */
    snprintf(sub, sizeof sub, "%s/ro", dir);
    CHECK(mkdir(sub, 0755) == 0);
    snprintf(path, sizeof path, "%s/ro/f.bin", dir);
    write_file(path, "old", 3);
    chmod(sub, 0555);
    uint8_t buf[64];
    if (geteuid() != 0) {
        CHECK_ERR(visc_write_file_atomic(path, parts, sizes, 1), "Permission denied");
        CHECK(read_file(path, buf, sizeof buf) == 3 && memcmp(buf, "old", 3) == 0);
        CHECK(count_files(sub, ".tmp.") == 0);
    }
    chmod(sub, 0755);

    /* A write that fails halfway (file size limit: EFBIG, works for root
     * too): the old file is untouched and the temporary file is gone. */
    static char big[1 << 16];
    memset(big, 'n', sizeof big);
    const void *bparts[2] = {big, big};
    size_t bsizes[2] = {sizeof big, sizeof big};
    struct rlimit old_lim, lim;
    getrlimit(RLIMIT_FSIZE, &old_lim);
    lim = old_lim;
    lim.rlim_cur = 1 << 15;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    int rc = visc_write_file_atomic(path, bparts, bsizes, 2);
    setrlimit(RLIMIT_FSIZE, &old_lim);
    signal(SIGXFSZ, old_handler);
    CHECK(rc == -1);
    CHECK_MSG(has(visc_last_error(), path) && has(visc_last_error(), "too large"), "%s",
              visc_last_error());
    CHECK(read_file(path, buf, sizeof buf) == 3 && memcmp(buf, "old", 3) == 0);
    CHECK(count_files(sub, ".tmp.") == 0);
    rm_rf(dir);
}

TEST(mkdirs_creates_nested_directories) {
    char *dir = temp_dir();
    char path[256];
    struct stat st;
    snprintf(path, sizeof path, "%s/a/b//c/", dir);
    CHECK(visc_mkdirs(path) == 0);
    snprintf(path, sizeof path, "%s/a/b/c", dir);
    CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
    CHECK(visc_mkdirs(path) == 0); /* already there */
    snprintf(path, sizeof path, "%s/a/file", dir);
    write_file(path, "x", 1);
    snprintf(path, sizeof path, "%s/a/file/d", dir);
    CHECK_ERR(visc_mkdirs(path), "file'");
    snprintf(path, sizeof path, "%s/a/file", dir);
    CHECK_ERR(visc_mkdirs(path), "exists and is not a directory");
    CHECK_ERR(visc_mkdirs(""), "empty name");
    rm_rf(dir);
}

/* ---------------------------------------------------------------- TensorBoard */

typedef struct {
    int n;
    char tags[16][32];
    int64_t steps[16];
    float values[16];
} scalars;

static void collect(void *ctx, const char *tag, int64_t step, float value) {
    scalars *s = ctx;
    if (s->n < 16) {
        snprintf(s->tags[s->n], 32, "%s", tag);
        s->steps[s->n] = step;
        s->values[s->n] = value;
    }
    s->n++;
}

TEST(crc32c_known_values) {
    CHECK(visc_crc32c(0, "123456789", 9) == 0xE3069283u);
    CHECK(visc_crc32c(0, "", 0) == 0);
    CHECK(visc_crc32c(visc_crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u); /* chains */
    uint8_t zeros[32] = {0};
    CHECK(visc_crc32c(0, zeros, 32) == 0x8A9136AAu); /* RFC 3720 B.4 */
}

TEST(tensorboard_round_trip_and_corruption) {
    char *dir = temp_dir();
    char logdir[256];
    snprintf(logdir, sizeof logdir, "%s/runs/exp1", dir);
    visc_tb_writer *w = visc_tb_open(logdir);
    CHECK(w != NULL);
    if (!w) return;
    const char *path = visc_tb_path(w);
    CHECK(has(path, "/events.out.tfevents.") && has(path, ".v2"));
    CHECK(visc_tb_scalar(w, "loss/train", 0, 2.5f) == 0);
    CHECK(visc_tb_scalar(w, "loss/train", 1, 1.25f) == 0);
    CHECK(visc_tb_scalar(w, "lr", 300000000000LL, 1e-3f) == 0);
    CHECK(visc_tb_scalar(w, "neg", -5, -0.0f) == 0);
    CHECK(visc_tb_scalar(w, "", 0, 1) == -1);
    visc_tb_flush(w);
    char saved[512];
    snprintf(saved, sizeof saved, "%s", path);
    /* A second writer in the same second gets its own file. */
    visc_tb_writer *w2 = visc_tb_open(logdir);
    CHECK(w2 && strcmp(visc_tb_path(w2), saved) != 0);
    visc_tb_close(w2);
    visc_tb_close(w);

    scalars s = {0};
    CHECK(visc_tb_read(saved, collect, &s) == 0);
    CHECK(s.n == 4);
    CHECK(strcmp(s.tags[0], "loss/train") == 0 && s.steps[0] == 0 && s.values[0] == 2.5f);
    CHECK(strcmp(s.tags[1], "loss/train") == 0 && s.steps[1] == 1 && s.values[1] == 1.25f);
    CHECK(strcmp(s.tags[2], "lr") == 0 && s.steps[2] == 300000000000LL && s.values[2] == 1e-3f);
    CHECK(strcmp(s.tags[3], "neg") == 0 && s.steps[3] == -5 && s.values[3] == 0 &&
          signbit(s.values[3]));

    /* The first record is the file_version event. */
    uint8_t buf[4096];
    size_t n = read_file(saved, buf, sizeof buf);
    CHECK(n > 12 && n < sizeof buf);
    uint64_t len0 = 0;
    for (int i = 7; i >= 0; i--) len0 = (len0 << 8) | buf[i];
    CHECK(len0 == 9 + 2 + 13 && memcmp(buf + 12 + 11, "brain.Event:2", 13) == 0);

    /* Any single corrupted byte is caught by a CRC (or a length check). */
    int missed = 0;
    for (size_t i = 0; i < n; i++) {
        buf[i] ^= 0x20;
        if (visc_tb_parse(buf, n, NULL, NULL) == 0) missed++;
        buf[i] ^= 0x20;
    }
    CHECK_MSG(missed == 0, "%d of %zu corrupted bytes went unnoticed", missed, n);
    buf[40] ^= 1;
    write_file(saved, buf, n);
    CHECK_ERR(visc_tb_read(saved, collect, &s), "CRC");
    CHECK(has(visc_last_error(), saved));
    buf[40] ^= 1;
    CHECK_ERR(visc_tb_parse(buf, n - 1, NULL, NULL), "claims");
    CHECK_ERR(visc_tb_parse(buf, 5, NULL, NULL), "truncated record header");
    CHECK(visc_tb_parse(buf, 0, NULL, NULL) == 0);
    rm_rf(dir);
}

/* A hand-built record with fields TensorFlow writes that we do not (unknown
 * fields, summary before step, a Value without simple_value) still reads. */
TEST(tensorboard_reads_unknown_fields) {
    uint8_t ev[64], rec[96];
    size_t k = 0;
    /* summary { value { tag "x" metadata {..} } value { simple_value 3 tag "y" } } */
    const uint8_t summary[] = {0x2a, 19, 0x0a, 5,    0x0a, 1,    'x', 0x4a, 0,    0x0a, 10,
                               0x15, 0,  0,    0x40, 0x40, 0x0a, 1,   'y',  0x18, 1};
    memcpy(ev, summary, sizeof summary);
    k = sizeof summary;
    ev[k++] = 0x10, ev[k++] = 7;                    /* step 7 */
    ev[k++] = 0x38, ev[k++] = 0x96, ev[k++] = 0x01; /* unknown varint field 7 */
    /* Frame it: length, masked CRCs computed the way TensorFlow does. */
    for (int i = 0; i < 8; i++) rec[i] = (uint8_t)((uint64_t)k >> (8 * i));
    uint32_t c = visc_crc32c(0, rec, 8);
    c = ((c >> 15) | (c << 17)) + 0xa282ead8u;
    for (int i = 0; i < 4; i++) rec[8 + i] = (uint8_t)(c >> (8 * i));
    memcpy(rec + 12, ev, k);
    c = visc_crc32c(0, ev, k);
    c = ((c >> 15) | (c << 17)) + 0xa282ead8u;
    for (int i = 0; i < 4; i++) rec[12 + k + i] = (uint8_t)(c >> (8 * i));
    scalars s = {0};
    CHECK(visc_tb_parse(rec, 16 + k, collect, &s) == 0);
    CHECK(s.n == 1 && strcmp(s.tags[0], "y") == 0 && s.steps[0] == 7 && s.values[0] == 3.0f);
}

/* tests/golden/io_fixture.tfevents was written by PyTorch's SummaryWriter
 * (tools/make_io_fixtures.py): TensorFlow's framing and field layout. */
TEST(tensorboard_reads_pytorch_fixture) {
    scalars s = {0};
    if (visc_tb_read(visc_golden_path("io_fixture.tfevents"), collect, &s) != 0) {
        CHECK_MSG(0, "%s", visc_last_error());
        return;
    }
    CHECK(s.n == 4);
    CHECK(strcmp(s.tags[0], "loss/train") == 0 && s.steps[0] == 0 && s.values[0] == 2.5f);
    CHECK(strcmp(s.tags[1], "loss/train") == 0 && s.steps[1] == 7 && s.values[1] == 0.125f);
    CHECK(strcmp(s.tags[2], "lr") == 0 && s.steps[2] == 7 && s.values[2] == 0.001f);
    CHECK(strcmp(s.tags[3], "loss/train") == 0 && s.steps[3] == (int64_t)1 << 40 &&
          s.values[3] == -3.0f);
}

/* ---------------------------------------------------------------- config */

TEST(config_parses_sections_quotes_comments) {
    const char *text = "\xEF\xBB\xBF# leading comment\n"
                       "model = resnet18\n"
                       "  epochs=90   ; trailing\r\n"
                       "\n"
                       "[optim]\n"
                       "lr = 0.1 # the peak\n"
                       "name = \"a # b ; c \"\n"
                       "path = 'C:\\dir\\x'\n"
                       "esc = \"q\\\"\\\\\\n\\t\"\n"
                       "url = http://x/#frag\n"
                       "empty =\n"
                       "[ data.aug-v2 ]   # comment\n"
                       "crop_size = 224\n"
                       "[optim]\n"
                       "lr = 0.2\n";
    visc_config c;
    CHECK(visc_config_parse(&c, text, strlen(text), "t.ini") == 0);
    CHECK(c.count == 9);
    CHECK(strcmp(visc_config_get(&c, "model"), "resnet18") == 0);
    CHECK(strcmp(visc_config_get(&c, "epochs"), "90") == 0);
    CHECK(strcmp(visc_config_get(&c, "optim.lr"), "0.2") == 0); /* later wins */
    CHECK(strcmp(visc_config_get(&c, "optim.name"), "a # b ; c ") == 0);
    CHECK(strcmp(visc_config_get(&c, "optim.path"), "C:\\dir\\x") == 0);
    CHECK(strcmp(visc_config_get(&c, "optim.esc"), "q\"\\\n\t") == 0);
    CHECK(strcmp(visc_config_get(&c, "optim.url"), "http://x/#frag") == 0);
    CHECK(strcmp(visc_config_get(&c, "optim.empty"), "") == 0);
    CHECK(strcmp(visc_config_get(&c, "data.aug-v2.crop_size"), "224") == 0);
    CHECK(visc_config_get(&c, "lr") == NULL);
    visc_config_set(&c, "model", "vit");
    visc_config_set(&c, "new", "1");
    CHECK(strcmp(visc_config_get(&c, "model"), "vit") == 0 && c.count == 10);
    visc_config_free(&c);
    CHECK(c.count == 0 && c.keys == NULL);
}

TEST(config_errors_name_file_and_line) {
    visc_config c;
    const char *t1 = "a = 1\n# ok\njust words\n";
    CHECK_ERR(visc_config_parse(&c, t1, strlen(t1), "config.ini"),
              "config.ini:3: expected 'key = value'");
    CHECK(c.count == 0 && c.keys == NULL);
    CHECK_ERR(visc_config_parse(&c, "a b = 1", 7, "x.ini"),
              "x.ini:1: invalid character ' ' in key");
    CHECK_ERR(visc_config_parse(&c, "a/b = 1", 7, "x.ini"),
              "x.ini:1: invalid character '/' in key");
    CHECK_ERR(visc_config_parse(&c, "= 1", 3, "x.ini"), "x.ini:1: expected 'key = value'");
    CHECK_ERR(visc_config_parse(&c, "\n\na = \"open", 11, "x.ini"),
              "x.ini:3: unterminated quoted value");
    CHECK_ERR(visc_config_parse(&c, "a = \"x\" y", 9, "x.ini"),
              "unexpected text after the quoted value");
    CHECK_ERR(visc_config_parse(&c, "a = \"\\q\"", 8, "x.ini"), "unknown escape");
    CHECK_ERR(visc_config_parse(&c, "[sec", 4, "x.ini"), "x.ini:1: expected '[section]'");
    CHECK_ERR(visc_config_parse(&c, "[]", 2, "x.ini"), "empty section name");
    CHECK_ERR(visc_config_parse(&c, "[a b]", 5, "x.ini"), "invalid character 'b' in section name");
    CHECK_ERR(visc_config_parse(&c, "[a] x", 5, "x.ini"), "unexpected text after ']'");
    CHECK_ERR(visc_config_parse(&c, "a = 1\0", 6, "x.ini"), "x.ini:1: NUL byte");
    /* Without a trailing newline the last line still counts. */
    CHECK(visc_config_parse(&c, "a = 1", 5, "x.ini") == 0 &&
          strcmp(visc_config_get(&c, "a"), "1") == 0);
    visc_config_free(&c);
}

TEST(config_load_from_file) {
    char *dir = temp_dir();
    char path[256];
    snprintf(path, sizeof path, "%s/train.ini", dir);
    visc_config c;
    CHECK_ERR(visc_config_load(&c, path), "cannot open");
    write_file(path, "[train]\nbatch = 256\nbad line\n", 28);
    char want[300];
    snprintf(want, sizeof want, "%s:3: expected 'key = value'", path);
    CHECK_ERR(visc_config_load(&c, path), want);
    write_file(path, "[train]\nbatch = 256\n", 20);
    CHECK(visc_config_load(&c, path) == 0);
    CHECK(c.count == 1 && strcmp(visc_config_get(&c, "train.batch"), "256") == 0);
    visc_config_free(&c);
    rm_rf(dir);
}
