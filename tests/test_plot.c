/* test_plot.c: the PNG writer (checked by a small independent decoder),
 * tick selection, the log.jsonl reader on good and bad input, the canvas,
 * and `visc plot` end to end on a synthetic run directory. */
#include <dirent.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "test.h"
#include "visc/core.h"
#include "visc/io.h"
#include "visc/plot.h"

/* ---- helpers ---- */

static char temp_path[64];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_temp_dir(void) {
    if (temp_path[0]) nftw(temp_path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* One scratch directory for the whole binary, removed at exit. */
static const char *temp_dir(void) {
    if (!temp_path[0]) {
        strcpy(temp_path, "/tmp/visc_test_plot.XXXXXX");
        if (!mkdtemp(temp_path)) {
            perror("mkdtemp");
            exit(1);
        }
        atexit(remove_temp_dir);
    }
    return temp_path;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

static int count_files(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, needle)) n++;
    if (d) closedir(d);
    return n;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* A PNG decoder for exactly what we write (8-bit RGB, no interlace, filter
 * 0 on every line), written from the specification and independent of
 * src/io/png.c: checks the signature, every chunk's CRC, IHDR's fields and
 * the chunk order, inflates the IDATs and returns the pixels in *rgb
 * (malloc'd). Returns NULL on success, else what is wrong. */
/* The chunk walk: IDAT data gathered into idat (room for n bytes). */
static const char *png_chunks(const uint8_t *b, size_t n, int *w, int *h, uint8_t *idat,
                              size_t *idat_n) {
    static const uint8_t sig[8] = {137, 80, 78, 71, 13, 10, 26, 10};
    if (n < 8 || memcmp(b, sig, 8) != 0) return "bad signature";
    size_t at = 8;
    int chunks = 0;
    *w = *h = 0;
    *idat_n = 0;
    while (at < n) {
        if (n - at < 12) return "truncated chunk";
        uint32_t len = be32(b + at);
        if (len > n - at - 12) return "chunk length past the end";
        const uint8_t *type = b + at + 4, *data = b + at + 8;
        uLong crc = crc32(crc32(0, Z_NULL, 0), type, 4 + len);
        if (crc != be32(data + len)) return "bad CRC";
        at += 12 + len;
        if (chunks++ == 0) {
            if (memcmp(type, "IHDR", 4) || len != 13) return "first chunk is not a 13-byte IHDR";
            *w = (int)be32(data);
            *h = (int)be32(data + 4);
            if (*w <= 0 || *h <= 0 || *w > 100000 || *h > 100000) return "bad size";
            if (data[8] != 8 || data[9] != 2 || data[10] || data[11] || data[12])
                return "IHDR is not 8-bit RGB, deflate, no interlace";
        } else if (!memcmp(type, "IDAT", 4)) {
            memcpy(idat + *idat_n, data, len);
            *idat_n += len;
        } else if (!memcmp(type, "IEND", 4)) {
            if (len != 0) return "IEND with data";
            return at == n ? NULL : "bytes after IEND";
        } else if (!(type[0] & 0x20)) {
            return "unknown critical chunk";
        }
    }
    return "no IEND";
}

static const char *png_decode(const uint8_t *b, size_t n, int *w, int *h, uint8_t **rgb) {
    *rgb = NULL;
    uint8_t *idat = malloc(n + 1);
    size_t idat_n;
    const char *why = png_chunks(b, n, w, h, idat, &idat_n);
    if (why) {
        free(idat);
        return why;
    }
    size_t row = (size_t)*w * 3, want = (row + 1) * (size_t)*h;
    uint8_t *raw = malloc(want + 1);
    uLongf got = want + 1;
    int zrc = uncompress(raw, &got, idat, idat_n);
    free(idat);
    if (zrc != Z_OK || got != want) {
        free(raw);
        return "IDAT does not inflate to the scanlines";
    }
    *rgb = malloc(row * (size_t)*h);
    for (int y = 0; y < *h; y++) {
        if (raw[(size_t)y * (row + 1)] != 0) {
            free(raw);
            free(*rgb);
            *rgb = NULL;
            return "a scanline with a filter other than 0";
        }
        memcpy(*rgb + (size_t)y * row, raw + (size_t)y * (row + 1) + 1, row);
    }
    free(raw);
    return NULL;
}

static int count_color(const uint8_t *rgb, size_t pixels, visc_rgb c) {
    int n = 0;
    for (size_t i = 0; i < pixels; i++)
        if (rgb[3 * i] == c.r && rgb[3 * i + 1] == c.g && rgb[3 * i + 2] == c.b) n++;
    return n;
}

/* ---- PNG ---- */

TEST(png_encode_decodes_to_the_canvas) {
    const int w = 37, h = 23;
    uint8_t *img = malloc((size_t)w * h * 3);
    for (int i = 0; i < w * h * 3; i++) img[i] = (uint8_t)(i * 7 + (i / 97) * 13);
    uint8_t *png;
    size_t size;
    CHECK(visc_png_encode(img, w, h, &png, &size) == 0);
    int dw, dh;
    uint8_t *back;
    const char *why = png_decode(png, size, &dw, &dh, &back);
    CHECK_MSG(why == NULL, "decoder: %s", why);
    CHECK(dw == w && dh == h);
    CHECK(back && memcmp(back, img, (size_t)w * h * 3) == 0);
    free(back);

    /* the checker itself catches damage: a flipped bit in IDAT's data fails its CRC */
    png[8 + 25 + 10] ^= 1;
    why = png_decode(png, size, &dw, &dh, &back);
    CHECK(why != NULL && strcmp(why, "bad CRC") == 0);
    free(back);
    free(png);
    free(img);
}

TEST(png_one_pixel_and_bad_sizes) {
    uint8_t px[3] = {255, 0, 128}, *png = NULL, *back;
    size_t size;
    int w, h;
    CHECK(visc_png_encode(px, 1, 1, &png, &size) == 0);
    CHECK(png_decode(png, size, &w, &h, &back) == NULL);
    CHECK(w == 1 && h == 1 && back && memcmp(back, px, 3) == 0);
    free(back);
    free(png);
    CHECK(visc_png_encode(px, 0, 1, &png, &size) == -1 && png == NULL && size == 0);
    CHECK(strstr(visc_last_error(), "out of range") != NULL);
    CHECK(visc_png_encode(px, 1, -5, &png, &size) == -1);
    CHECK(visc_png_encode(px, 20000, 1, &png, &size) == -1);
}

TEST(png_write_is_atomic_and_matches_encode) {
    char path[256];
    snprintf(path, sizeof path, "%s/img.png", temp_dir());
    visc_canvas c;
    visc_canvas_init(&c, 64, 48, (visc_rgb){255, 255, 255});
    visc_canvas_line(&c, 2, 3, 60, 40, 2.0, (visc_rgb){31, 119, 180});
    CHECK(visc_png_write(path, c.rgb, c.width, c.height) == 0);
    size_t n;
    uint8_t *file = visc_test_read_file(path, &n), *mem, *back;
    size_t msize;
    CHECK(visc_png_encode(c.rgb, c.width, c.height, &mem, &msize) == 0);
    CHECK(file && n == msize && memcmp(file, mem, n) == 0);
    int w, h;
    CHECK(png_decode(file, n, &w, &h, &back) == NULL);
    CHECK(back && memcmp(back, c.rgb, (size_t)64 * 48 * 3) == 0);
    CHECK(count_files(temp_dir(), ".tmp.") == 0);
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no/such/dir/x.png", temp_dir());
    CHECK(visc_png_write(bad, c.rgb, c.width, c.height) == -1);
    CHECK(strstr(visc_last_error(), "x.png") != NULL);
    free(back);
    free(file);
    free(mem);
    visc_canvas_free(&c);
}

/* ---- ticks ---- */

static int is_nice_step(double s) {
    double k = floor(log10(s) + 1e-9), m = s / pow(10, k);
    return fabs(m - 1) < 1e-9 || fabs(m - 2) < 1e-9 || fabs(m - 5) < 1e-9;
}

static void check_ticks(double lo, double hi, int max, const double *want, int nwant,
                        double want_step) {
    double t[VISC_MAX_TICKS], step;
    int n = visc_nice_ticks(lo, hi, max, t, &step);
    CHECK_MSG(n == nwant, "[%g, %g] max %d: %d ticks, want %d", lo, hi, max, n, nwant);
    CHECK_CLOSE(step, want_step, 0, 1e-12);
    for (int i = 0; i < n && i < nwant; i++) CHECK_CLOSE(t[i], want[i], 1e-15, 1e-12);
}

TEST(nice_ticks_known_ranges) {
    check_ticks(0, 1, 6, (double[]){0, 0.2, 0.4, 0.6, 0.8, 1}, 6, 0.2);
    check_ticks(0, 10, 5, (double[]){0, 5, 10}, 3, 5);
    check_ticks(0, 10, 6, (double[]){0, 2, 4, 6, 8, 10}, 6, 2);
    check_ticks(0.0013, 0.0087, 5, (double[]){0.002, 0.004, 0.006, 0.008}, 4, 0.002);
    check_ticks(-3.7, 2.2, 8, (double[]){-3, -2, -1, 0, 1, 2}, 6, 1);
    check_ticks(1234, 98765, 6, (double[]){20000, 40000, 60000, 80000}, 4, 20000);
    check_ticks(67.3, 99.1, 8, (double[]){70, 75, 80, 85, 90, 95}, 6, 5);
    check_ticks(5, 5, 6, (double[]){5}, 1, 1);
    /* 0.1 * 3 is 0.30000000000000004; the ticks are the decimal values */
    double t[VISC_MAX_TICKS], step;
    int n = visc_nice_ticks(0, 0.7, 8, t, &step);
    CHECK(n == 8 && t[3] == 0.3 && t[7] == 0.7);
    CHECK(visc_nice_ticks(2, 1, 6, t, &step) == 0);
    CHECK(visc_nice_ticks(NAN, 1, 6, t, &step) == 0);
    CHECK(visc_nice_ticks(-1e308, 1e308, 6, t, &step) == 0); /* range overflows */
}

TEST(nice_ticks_properties_on_many_ranges) {
    uint64_t s = 12345;
    for (int it = 0; it < 20000; it++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        double u1 = (double)(s >> 11) / 9007199254740992.0;
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        double u2 = (double)(s >> 11) / 9007199254740992.0;
        double scale = pow(10, (int)(u1 * 40) - 20);
        double lo = (u2 - 0.5) * scale * 10, hi = lo + u1 * scale + 1e-300;
        int max = 2 + it % 12;
        double t[VISC_MAX_TICKS], step;
        int n = visc_nice_ticks(lo, hi, max, t, &step);
        int ok = n >= 1 && n <= max && is_nice_step(step);
        for (int i = 0; i < n && ok; i++) {
            ok = t[i] >= lo - step * 1e-6 && t[i] <= hi + step * 1e-6;
            if (i) ok = ok && fabs(t[i] - t[i - 1] - step) <= step * 1e-6;
        }
        /* the step is the finest allowed: the next smaller nice step gives more than max ticks */
        if (ok && n >= 2) {
            double m = step / pow(10, floor(log10(step) + 1e-9));
            double finer = m > 4 ? step * 0.4 : m > 1.5 ? step * 0.5 : step * 0.5;
            ok = floor(hi / finer + 1e-9) - ceil(lo / finer - 1e-9) + 1 > max;
        }
        CHECK_MSG(ok, "[%.17g, %.17g] max %d: %d ticks, step %g", lo, hi, max, n, step);
        if (!ok) break;
    }
}

TEST(log_ticks) {
    double t[VISC_MAX_TICKS];
    int n = visc_log_ticks(0.05, 3, 8, t);
    double want1[] = {0.05, 0.1, 0.2, 0.5, 1, 2};
    CHECK(n == 6);
    for (int i = 0; i < n && i < 6; i++) CHECK_CLOSE(t[i], want1[i], 0, 1e-12);
    n = visc_log_ticks(1e-4, 10, 8, t);
    CHECK(n == 6);
    for (int i = 0; i < n; i++) CHECK_CLOSE(t[i], pow(10, i - 4), 0, 1e-12);
    n = visc_log_ticks(1e-12, 1e12, 6, t); /* 25 powers of ten: every 5th */
    CHECK(n == 5);
    for (int i = 0; i < n; i++) CHECK_CLOSE(t[i], pow(10, 5 * i - 12), 0, 1e-12);
    n = visc_log_ticks(0.3, 0.45, 6, t); /* no 1, 2 or 5 inside: linear ticks */
    CHECK(n >= 2 && t[0] >= 0.3 && t[n - 1] <= 0.45);
    CHECK(visc_log_ticks(0, 1, 6, t) == 0);
    CHECK(visc_log_ticks(-1, 1, 6, t) == 0);
    CHECK(visc_log_ticks(1e-300, 1e300, 6, t) >= 2);
}

static void check_label(double v, double step, double axis_max, const char *want) {
    char buf[32];
    visc_format_tick(v, step, axis_max, buf, sizeof buf);
    CHECK_MSG(strcmp(buf, want) == 0, "%g (step %g, axis %g): '%s', want '%s'", v, step, axis_max,
              buf, want);
}

TEST(tick_labels) {
    check_label(0.2, 0.2, 1, "0.2");
    check_label(0.3, 0.1, 1, "0.3");
    check_label(0.002, 0.002, 0.008, "0.002");
    check_label(300, 100, 500, "300");
    check_label(2.5, 0.5, 5, "2.5");
    check_label(5000, 5000, 10000, "5k");
    check_label(10000, 5000, 10000, "10k");
    check_label(12500, 2500, 20000, "12.5k");
    check_label(0, 5000, 10000, "0");
    check_label(2e6, 1e6, 1e7, "2M");
    check_label(-1e-17, 0.1, 1, "0.0"); /* round-off of a zero tick, no "-0" */
    check_label(0, 0.02, 0.1, "0.00");
    check_label(0, 1e-5, 1e-4, "0");
    check_label(-3, 1, 3, "-3");
    check_label(1e-7, 1e-7, 1e-7, "1e-07");
}

/* ---- canvas ---- */

TEST(canvas_lines_text_and_clipping) {
    const visc_rgb white = {255, 255, 255}, red = {200, 0, 0};
    visc_canvas c;
    visc_canvas_init(&c, 40, 30, white);
    visc_canvas_line(&c, 5, 10, 35, 10, 2.0, red); /* covers rows 9 and 10 fully */
    const uint8_t *p = c.rgb + (10 * 40 + 20) * 3, *q = c.rgb + (9 * 40 + 20) * 3;
    CHECK(p[0] == 200 && p[1] == 0 && q[0] == 200 && q[1] == 0);
    const uint8_t *far = c.rgb + (20 * 40 + 20) * 3;
    CHECK(far[0] == 255 && far[1] == 255);
    /* anti-aliasing: half a pixel of coverage blends halfway */
    visc_canvas_line(&c, 5, 25, 35, 25, 1.0, red); /* rows 24.5..25.5: half of 24, half of 25 */
    const uint8_t *h = c.rgb + (24 * 40 + 20) * 3;
    CHECK(h[1] > 100 && h[1] < 155);
    /* clipping: nothing outside the clip rectangle changes */
    visc_canvas_clip(&c, 0, 0, 20, 30);
    visc_canvas_rect(&c, 0, 0, 40, 5, red);
    CHECK(c.rgb[(2 * 40 + 19) * 3 + 1] == 0 && c.rgb[(2 * 40 + 20) * 3 + 1] == 255);
    visc_canvas_unclip(&c);
    /* off-canvas and non-finite coordinates are harmless */
    visc_canvas_line(&c, -1e300, 5, 1e300, 5, 2.0, red);
    visc_canvas_line(&c, NAN, 5, 3, INFINITY, 2.0, red);
    visc_canvas_disc(&c, -50, -50, 3, red);
    visc_canvas_text(&c, 35, 28, "overflowing text", 2, red);
    CHECK(visc_text_width("ab", 2) == (2 * 6 - 1) * 2 && visc_text_width("", 3) == 0);
    CHECK(visc_text_height(2) == 2 * VISC_FONT_H);
    /* text: "1" draws its stem; a space draws nothing */
    visc_canvas c2;
    visc_canvas_init(&c2, 10, 10, white);
    visc_canvas_text(&c2, 0, 0, " ", 1, red);
    CHECK(count_color(c2.rgb, 100, white) == 100);
    visc_canvas_text(&c2, 0, 0, "1", 1, red);
    CHECK(count_color(c2.rgb, 100, red) == 10); /* the 5x7 '1': 7 stem + 2 foot + 1 flag */
    CHECK(visc_font_glyph(200) == visc_font_glyph('?'));
    visc_canvas_free(&c2);
    visc_canvas_free(&c);
}

/* ---- the log reader ---- */

static const char *good_log =
    "{\"type\":\"config\",\"config\":{\"model\":\"resnet20\",\"dataset\":\"cifar10\","
    "\"opt\":\"sgd\",\"lr\":0.1,\"milestones\":[3,6],\"ema\":{\"decay\":0.999},\"s\":\"a\\\"b\"}}\n"
    "{\"type\":\"train\",\"epoch\":1,\"step\":50,\"loss\":2.5,\"top1\":10.0,\"lr\":0.02,"
    "\"img_per_s\":1400.0}\n"
    "\n"
    "  {\"type\":\"train\",\"epoch\":1,\"step\":100,\"loss\":2.0,\"top1\":20.0,\"lr\":0.04}\r\n"
    "{\"type\":\"val\",\"epoch\":1,\"step\":100,\"loss\":1.9,\"top1\":30.0,\"top5\":80.0,"
    "\"epoch_time_s\":41.0}\n"
    "{\"type\":\"val_ema\",\"epoch\":1,\"top1\":31.0,\"top5\":81.0}\n"
    "{\"type\":\"train\",\"epoch\":2,\"step\":150,\"loss\":nan,\"top1\":25.0,\"lr\":0.06}\n"
    /* a resumed run redoes step 150 and 200, and epoch 2 */
    "{\"type\":\"config\",\"config\":{\"model\":\"resnet20\"}}\n"
    "{\"type\":\"train\",\"epoch\":2,\"step\":150,\"loss\":1.5,\"top1\":40.0,\"lr\":0.06}\n"
    "{\"type\":\"train\",\"epoch\":2,\"step\":200,\"loss\":1.25,\"top1\":45.0,\"lr\":0.08}\n"
    "{\"type\":\"val\",\"epoch\":2,\"step\":200,\"loss\":1.0,\"top1\":50.0,\"top5\":90.0}\n"
    "{\"type\":\"checkpoint\",\"what\":[1,{\"x\":null}],\"ok\":true}\n"
    "{\"type\":\"done\",\"best_top1\":50.0,\"seconds\":12.5}";

TEST(run_log_parses_good_lines) {
    visc_run_log log;
    CHECK(visc_run_log_parse(&log, good_log, strlen(good_log), "log.jsonl") == 0);
    CHECK(log.records == 11); /* the unknown "checkpoint" type is skipped */
    CHECK(strcmp(log.model, "resnet20") == 0 && strcmp(log.dataset, "cifar10") == 0 &&
          strcmp(log.opt, "sgd") == 0);
    double steps[] = {50, 100, 150, 200}, loss[] = {2.5, 2.0, 1.5, 1.25};
    CHECK(log.train_loss.n == 4);
    if (log.train_loss.n == 4) {
        for (int i = 0; i < 4; i++) {
            CHECK(log.train_loss.x[i] == steps[i]);
            CHECK(log.train_loss.y[i] == loss[i]); /* step 150: the resumed value, not nan */
        }
    }
    CHECK(log.lr.n == 4 && log.lr.y[3] == 0.08);
    CHECK(log.train_top1.n == 4);
    CHECK(log.train_top1_epoch.n == 2 && log.train_top1_epoch.y[0] == 20.0 &&
          log.train_top1_epoch.y[1] == 45.0);
    CHECK(log.val_top1.n == 2 && log.val_top1.x[1] == 2 && log.val_top1.y[1] == 50.0);
    CHECK(log.val_top5.n == 2 && log.val_top5.y[0] == 80.0);
    CHECK(log.val_loss.n == 2 && log.val_loss.x[0] == 100 && log.val_loss.y[1] == 1.0);
    CHECK(log.ema_top1.n == 1 && log.ema_top1.y[0] == 31.0);
    visc_run_log_free(&log);
    CHECK(log.train_loss.x == NULL && log.records == 0);

    /* a diverged run writes nan: it is kept (and drawn as a gap), not an error */
    const char *nan_log = "{\"type\":\"train\",\"step\":1,\"loss\":-nan,\"lr\":inf}\n";
    CHECK(visc_run_log_parse(&log, nan_log, strlen(nan_log), "x") == 0);
    CHECK(log.train_loss.n == 1 && isnan(log.train_loss.y[0]) && isinf(log.lr.y[0]));
    visc_run_log_free(&log);
    CHECK(visc_run_log_parse(&log, "", 0, "x") == 0 && log.records == 0);
    visc_run_log_free(&log);
}

TEST(run_log_reports_bad_lines_with_their_number) {
    static const struct {
        const char *text;
        const char *want; /* in the message */
    } bad[] = {
        {"not json\n", "src: line 2: not a JSON object"},
        {"{\"type\":\"train\",\"step\":5}\n", "src: line 2: train record without \"loss\""},
        {"{\"type\":\"train\",\"loss\":5}\n", "train record without \"step\""},
        {"{\"type\":\"train\",\"step\":1.5,\"loss\":1}\n", "\"step\" is not a whole number"},
        {"{\"type\":\"train\",\"step\":-1,\"loss\":1}\n", "\"step\" is not a whole number"},
        {"{\"type\":\"train\",\"step\":1e300,\"loss\":1}\n", "\"step\" is not a whole number"},
        {"{\"type\":\"train\",\"step\":5,\"loss\":\"x\"}\n", "\"loss\" is not a number"},
        {"{\"type\":\"train\",\"step\":5,\"loss\":{}}\n", "\"loss\" is not a number"},
        {"{\"type\":\"train\",\"step\":5,\"loss\":1.2.3}\n", "bad value"},
        {"{\"type\":\"train\",\"step\":0x10,\"loss\":1}\n", "bad number"},
        {"{\"type\":\"train\",\"st", "unterminated string"},
        {"{\"type\":\"train\",\"step\":5,", "line cut off"},
        {"{\"type\":\"train\",\"step\":5,\"loss\":", "line cut off"},
        {"{\"step\":1}\n", "no \"type\""},
        {"{\"type\":3}\n", "\"type\" is not a string"},
        {"{\"type\":\"val\",\"epoch\":1,\"top1\":5} x\n", "text after the closing '}'"},
        {"{\"type\":\"val\",\"top1\":5}\n", "val record without \"epoch\""},
        {"{\"type\":\"val_ema\",\"epoch\":1}\n", "val record without \"top1\""},
        {"{\"type\" \"val\"}\n", "expected ':'"},
        {"{\"type\":\"val\" \"epoch\":1}\n", "expected ',' or '}'"},
        {"{\"type\":\"val\",}\n", "expected a \"key\""},
        {"{\"type\":\"a\\qb\"}\n", "bad escape"},
        {"{\"type\":\"a\\u12\"}\n", "bad \\u escape"},
        {"{\"type\":\"done\",\"x\":[1,2}\n", "expected ',' or ']'"},
        {"{\"type\":\"done\",\"x\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}\n",
         "nested too deeply"},
        {"{\"type\":\"done\",\"x\":\"a\tb\"}\n", "control character"},
        {"{\"type\":\"done\"}\n\x01\x02\x03\n", "src: line 3: not a JSON object"},
    };
    const char *first = "{\"type\":\"train\",\"epoch\":1,\"step\":50,\"loss\":2.5}\n";
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "%s%s", first, bad[i].text);
        visc_run_log log;
        int rc = visc_run_log_parse(&log, text, strlen(text), "src");
        CHECK_MSG(rc == -1 && strstr(visc_last_error(), bad[i].want),
                  "%s -> rc %d, '%s' (wanted '%s')", bad[i].text, rc, visc_last_error(),
                  bad[i].want);
        CHECK(strncmp(visc_last_error(), "src: line ", 10) == 0);
        CHECK(log.train_loss.n == 0 && log.train_loss.x == NULL && log.records == 0);
    }
    /* a NUL byte inside a line (not a text file) */
    static const char nul[] = "{\"type\":\"done\"}\n{\"type\":\0\"done\"}\n";
    visc_run_log log;
    CHECK(visc_run_log_parse(&log, nul, sizeof nul - 1, "src") == -1);
    CHECK(strstr(visc_last_error(), "line 2: NUL byte") != NULL);
}

TEST(run_log_load_errors) {
    char dir[256], path[300];
    visc_run_log log;
    snprintf(dir, sizeof dir, "%s/loaderr", temp_dir());
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/log.jsonl", dir);
    CHECK(visc_run_log_load(&log, path) == -1);
    CHECK(strstr(visc_last_error(), "log.jsonl: cannot read: No such file") != NULL);
    write_text(path, "");
    CHECK(visc_run_log_load(&log, path) == -1 && strstr(visc_last_error(), "empty log"));
    write_text(path, "\n  \n");
    CHECK(visc_run_log_load(&log, path) == -1 && strstr(visc_last_error(), "empty log"));
    write_text(path, "{\"type\":\"something_else\"}\n");
    CHECK(visc_run_log_load(&log, path) == -1 && strstr(visc_last_error(), "no visc records"));
    CHECK(visc_run_log_load(&log, dir) == -1); /* a directory */
    /* a run that has only logged its config has nothing to draw yet */
    write_text(path, "{\"type\":\"config\",\"config\":{\"model\":\"resnet20\"}}\n");
    CHECK(visc_run_log_load(&log, path) == 0 && log.records == 1);
    visc_run_log_free(&log);
    CHECK(visc_plot_run(dir, NULL) == -1);
    CHECK(strstr(visc_last_error(), "log.jsonl: no train or val records yet") != NULL);
    write_text(path, "{\"type\":\"train\",\"step\":1,\"loss\":1}\n{\"type\":\"train\"\n");
    CHECK(visc_plot_run(dir, NULL) == -1);
    char want[400];
    snprintf(want, sizeof want, "%s: line 2: ", path);
    CHECK_MSG(strstr(visc_last_error(), want) != NULL, "%s", visc_last_error());
}

/* ---- end to end ---- */

/* A 12-epoch run with a resume after epoch 5 that redoes steps. */
static void write_synthetic_log(const char *path) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "{\"type\":\"config\",\"config\":{\"model\":\"resnet20\",\"dataset\":\"cifar10\","
               "\"opt\":\"sgd\",\"ema\":{\"decay\":0.999}}}\n");
    const int spe = 100, epochs = 12;
    for (int e = 1; e <= epochs; e++) {
        for (int s = 20; s <= spe; s += 20) {
            int step = (e - 1) * spe + s;
            double loss = 2.3 * exp(-step / 300.0) + 0.05, lr = 0.1 * (1 - step / 1200.0);
            fprintf(f,
                    "{\"type\":\"train\",\"epoch\":%d,\"step\":%d,\"loss\":%.6f,\"top1\":%.4f,"
                    "\"lr\":%.6g,\"img_per_s\":1400.0}\n",
                    e, step, loss, 100 - 80 * exp(-step / 250.0), lr);
        }
        fprintf(f,
                "{\"type\":\"val\",\"epoch\":%d,\"step\":%d,\"loss\":%.6f,\"top1\":%.4f,"
                "\"top5\":99.0,\"epoch_time_s\":41.0}\n",
                e, e * spe, 2.0 * exp(-e * spe / 300.0) + 0.25, 95 - 70 * exp(-e * spe / 250.0));
        fprintf(f, "{\"type\":\"val_ema\",\"epoch\":%d,\"top1\":%.4f,\"top5\":99.5}\n", e,
                95.5 - 75 * exp(-e * spe / 200.0));
        if (e == 5) /* the resumed run appends a config and redoes some steps */
            fprintf(f, "{\"type\":\"config\",\"config\":{\"model\":\"resnet20\"}}\n"
                       "{\"type\":\"train\",\"epoch\":5,\"step\":480,\"loss\":0.3,\"top1\":90,"
                       "\"lr\":0.06}\n");
    }
    fprintf(f, "{\"type\":\"done\",\"best_top1\":94.9,\"seconds\":1234.0}\n");
    fclose(f);
}

TEST(plot_run_end_to_end) {
    char dir[256], path[300], png_path[300];
    snprintf(dir, sizeof dir, "%s/run", temp_dir());
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/log.jsonl", dir);
    write_synthetic_log(path);
    double t0 = visc_now();
    CHECK_MSG(visc_plot_run(dir, NULL) == 0, "%s", visc_last_error());
    double dt = visc_now() - t0;
    snprintf(png_path, sizeof png_path, "%s/curves.png", dir);
    size_t n;
    uint8_t *png = visc_test_read_file(png_path, &n), *rgb = NULL;
    CHECK(png != NULL);
    int w = 0, h = 0;
    const char *why = png ? png_decode(png, n, &w, &h, &rgb) : "no file";
    CHECK_MSG(why == NULL, "curves.png: %s", why);
    CHECK(w >= 1000 && h >= 300);
    if (rgb) {
        size_t px = (size_t)w * h;
        int white = count_color(rgb, px, (visc_rgb){255, 255, 255});
        /* mostly white background, and every curve colour is on it */
        CHECK((double)white / (double)px > 0.6);
        CHECK(count_color(rgb, px, (visc_rgb){31, 119, 180}) > 200);  /* train (blue) */
        CHECK(count_color(rgb, px, (visc_rgb){255, 127, 14}) > 200);  /* val (orange) */
        CHECK(count_color(rgb, px, (visc_rgb){44, 160, 44}) > 100);   /* val EMA (green) */
        CHECK(count_color(rgb, px, (visc_rgb){148, 103, 189}) > 200); /* lr (purple) */
    }
    CHECK(count_files(dir, ".tmp.") == 0);
    CHECK_MSG(dt < 2.0, "plotting took %.2fs", dt);
    free(rgb);
    free(png);

    /* an explicit path, and the forced scales */
    snprintf(png_path, sizeof png_path, "%s/other.png", temp_dir());
    CHECK(visc_plot_run_opts(dir, png_path, 1) == 0);
    CHECK(visc_plot_run_opts(dir, png_path, 0) == 0);
    png = visc_test_read_file(png_path, &n);
    CHECK(png && png_decode(png, n, &w, &h, &rgb) == NULL);
    free(rgb);
    free(png);
}

TEST(plot_run_survives_odd_but_valid_logs) {
    static const char *logs[] = {
        /* one point of everything */
        "{\"type\":\"train\",\"epoch\":1,\"step\":1,\"loss\":1,\"top1\":50,\"lr\":0.1}\n"
        "{\"type\":\"val\",\"epoch\":1,\"step\":1,\"loss\":1,\"top1\":50}\n",
        /* only validation; a constant; nan and inf; zero and negative losses on a log axis */
        "{\"type\":\"val\",\"epoch\":3,\"top1\":10}\n{\"type\":\"val\",\"epoch\":4,\"top1\":10}\n",
        "{\"type\":\"train\",\"step\":1,\"loss\":nan}\n{\"type\":\"train\",\"step\":2,\"loss\":inf}"
        "\n",
        "{\"type\":\"train\",\"step\":1,\"loss\":0}\n{\"type\":\"train\",\"step\":2,\"loss\":-5,"
        "\"lr\":1e300}\n{\"type\":\"train\",\"step\":3,\"loss\":1e-300,\"lr\":-1e300}\n",
        /* huge step numbers */
        "{\"type\":\"train\",\"step\":0,\"loss\":1}\n"
        "{\"type\":\"train\",\"step\":999999999999999,\"loss\":2}\n",
    };
    char dir[256], path[300];
    snprintf(dir, sizeof dir, "%s/odd", temp_dir());
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/log.jsonl", dir);
    for (size_t i = 0; i < sizeof logs / sizeof logs[0]; i++) {
        write_text(path, logs[i]);
        for (int lg = -1; lg <= 1; lg++)
            CHECK_MSG(visc_plot_run_opts(dir, NULL, lg) == 0, "log %zu (log %d): %s", i, lg,
                      visc_last_error());
    }
}
