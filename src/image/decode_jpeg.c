/* decode_jpeg.c: JPEG -> 8-bit RGB through libjpeg-turbo's libjpeg API.
 *
 * Settings match PIL's (which links the same libjpeg-turbo): ISLOW IDCT and
 * fancy upsampling, the library defaults, so full-resolution pixels equal
 * PIL's; with scale_denom > 1 they equal PIL's Image.draft() reduced decode.
 *
 * Errors: libjpeg reports fatal errors through error_exit, which must not
 * return; ours longjmps back to the decode call, which frees everything.
 * A warning that the data ended early (JWRN_JPEG_EOF: the memory source
 * then feeds a fake EOI and libjpeg would hand out grey rows) is an error
 * too, since PIL refuses truncated files; other warnings are tolerated
 * like PIL does. A progress monitor caps the number of scans, so a crafted
 * progressive file cannot keep the decoder busy for minutes.
 *
 * Region decoding: columns through jpeg_crop_scanline, rows above through
 * jpeg_skip_scanlines, rows below by stopping early (jpeg_abort_decompress)
 * or, with whole_file, by skipping them too. The reply covers exactly the
 * region rounded out to whole scaled pixels, and its pixels equal those of
 * a full decode at the same scale.
 *
 * Scales: 1/s as PIL's draft(), or any M/8 (libjpeg-turbo's scaled IDCTs:
 * an 8x8 block becomes M x M pixels). Fast mode (visc_decode_options.fast)
 * trades PIL's pixels for speed: JDCT_IFAST (16-bit arithmetic, used at
 * 8/8; libjpeg picks its scaled ISLOW routines for other sizes) and plain
 * chroma replication instead of fancy (triangle) upsampling. */
#include <setjmp.h>
#include <stdio.h> /* jpeglib.h needs FILE */
#include <stdlib.h>
#include <string.h>

#include <jerror.h>
#include <jpeglib.h>

#include "visc/core.h"
#include "visc/image.h"

/* Real progressive files have about 10 scans; libjpeg-turbo's own fuzzers
 * stop at 500. */
#define MAX_SCANS 1000

typedef struct {
    struct jpeg_error_mgr pub; /* first: libjpeg casts cinfo->err to this */
    struct jpeg_progress_mgr progress;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX + 64];
    /* Owned by the decode in progress; freed after a longjmp. */
    uint8_t *pixels, *row;
} jpeg_state;

static _Noreturn void fail(j_common_ptr cinfo, const char *prefix) {
    jpeg_state *st = (jpeg_state *)cinfo->err;
    char text[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, text);
    snprintf(st->message, sizeof st->message, "%s%s", prefix, text);
    longjmp(st->jump, 1);
}

static _Noreturn void fail_with(j_common_ptr cinfo, const char *message) {
    jpeg_state *st = (jpeg_state *)cinfo->err;
    snprintf(st->message, sizeof st->message, "%s", message);
    longjmp(st->jump, 1);
}

static void on_error_exit(j_common_ptr cinfo) { fail(cinfo, "JPEG: "); }

static void on_emit_message(j_common_ptr cinfo, int level) {
    if (level >= 0) return; /* trace messages */
    if (cinfo->err->msg_code == JWRN_JPEG_EOF) fail(cinfo, "truncated JPEG: ");
    cinfo->err->num_warnings++;
}

static void on_progress(j_common_ptr cinfo) {
    jpeg_state *st = (jpeg_state *)cinfo->err;
    const j_decompress_ptr d = (j_decompress_ptr)cinfo;
    if (cinfo->is_decompressor && d->input_scan_number > MAX_SCANS) {
        snprintf(st->message, sizeof st->message, "JPEG: more than %d scans (corrupt file?)",
                 MAX_SCANS);
        longjmp(st->jump, 1);
    }
}

/* Hooks our error manager and the memory source; the caller has set up
 * st->jump. */
static void open_jpeg(struct jpeg_decompress_struct *cinfo, jpeg_state *st, const uint8_t *buf,
                      size_t size) {
    cinfo->err = jpeg_std_error(&st->pub);
    st->pub.error_exit = on_error_exit;
    st->pub.emit_message = on_emit_message;
    jpeg_create_decompress(cinfo);
    st->progress.progress_monitor = on_progress;
    cinfo->progress = &st->progress;
    jpeg_mem_src(cinfo, buf, (unsigned long)size);
    jpeg_read_header(cinfo, TRUE);
}

int visc_jpeg_info(const uint8_t *buf, size_t size, int *width, int *height) {
    struct jpeg_decompress_struct cinfo;
    jpeg_state st;
    memset(&st, 0, sizeof st);
    if (setjmp(st.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return visc_set_error("%s", st.message);
    }
    open_jpeg(&cinfo, &st, buf, size);
    *width = (int)cinfo.image_width;
    *height = (int)cinfo.image_height;
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

/* PIL opens every 4-channel JPEG as Adobe-style inverted CMYK ("CMYK;I")
 * and converts with Convert.c's cmyk2rgb: with c, m, y, k the inverted
 * values, nk = 255 - k and r = nk - c * nk / 255 (rounded as MULDIV255). */
static inline uint8_t muldiv255(int a, int b) {
    int t = a * b + 128;
    return (uint8_t)(((t >> 8) + t) >> 8);
}

static void cmyk_to_rgb(uint8_t *rgb, const uint8_t *cmyk, int width) {
    for (int i = 0; i < width; i++) {
        int nk = cmyk[4 * i + 3]; /* = 255 - inverted k */
        for (int c = 0; c < 3; c++)
            rgb[3 * i + c] = (uint8_t)(nk - muldiv255(255 - cmyk[4 * i + c], nk));
    }
}

int visc_jpeg_decode(const uint8_t *buf, size_t size, const visc_decode_request *req,
                     visc_decoded *out) {
    if (!req) return visc_jpeg_decode_ex(buf, size, NULL, out);
    int d = req->scale_denom ? req->scale_denom : 1;
    if (d != 1 && d != 2 && d != 4 && d != 8) {
        memset(out, 0, sizeof *out);
        return visc_set_error("decode request: scale_denom %d is not 1, 2, 4 or 8", d);
    }
    visc_decode_options opt = {req->region, 1, d, 0, 0, NULL, 0};
    return visc_jpeg_decode_ex(buf, size, &opt, out);
}

int visc_jpeg_decode_ex(const uint8_t *buf, size_t size, const visc_decode_options *opt,
                        visc_decoded *out) {
    struct jpeg_decompress_struct cinfo;
    jpeg_state st;
    memset(&st, 0, sizeof st);
    memset(out, 0, sizeof *out);
    if (setjmp(st.jump)) {
        jpeg_destroy_decompress(&cinfo);
        free(st.pixels);
        free(st.row);
        return visc_set_error("%s", st.message);
    }
    open_jpeg(&cinfo, &st, buf, size);
    const int src_w = (int)cinfo.image_width, src_h = (int)cinfo.image_height;
    visc_rect region;
    int num, s; /* the scale is num / s in lowest terms */
    if (visc_image_check_size("JPEG", src_w, src_h) ||
        visc_image_plan_ex(opt, src_w, src_h, &region, &num, &s)) {
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    int cmyk = 0;
    switch (cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE: /* libjpeg-turbo replicates gray into RGB, as convert('RGB') */
    case JCS_YCbCr:
    case JCS_RGB: cinfo.out_color_space = JCS_RGB; break;
    case JCS_CMYK:
    case JCS_YCCK: /* libjpeg turns YCCK into CMYK; the RGB step is PIL's */
        cinfo.out_color_space = JCS_CMYK;
        cmyk = 1;
        break;
    default:
        jpeg_destroy_decompress(&cinfo);
        return visc_set_error("JPEG: unsupported color space (%d components)",
                              cinfo.num_components);
    }
    const int fast = opt && opt->fast;
    cinfo.dct_method = fast ? JDCT_IFAST : JDCT_ISLOW;
    cinfo.do_fancy_upsampling = fast ? FALSE : TRUE;
    cinfo.scale_num = (unsigned)num;
    cinfo.scale_denom = (unsigned)s;
    jpeg_start_decompress(&cinfo);

    /* The region in output (scaled) pixels: [x0, x1) x [y0, y1), rounded
     * outwards to multiples of num, so it covers every requested source
     * pixel and starts on a whole source pixel: output pixel i stands for
     * source [i * s / num, (i + 1) * s / num). libjpeg's output size is
     * ceil(source * num / s), as the arithmetic in image.h says. */
    const int out_w = (int)cinfo.output_width, out_h = (int)cinfo.output_height;
    const int x0 = region.x / s * num, y0 = region.y / s * num;
    int x1 = (region.x + region.w + s - 1) / s * num, y1 = (region.y + region.h + s - 1) / s * num;
    if (x1 > out_w) x1 = out_w;
    if (y1 > out_h) y1 = out_h;
    const int w = x1 - x0, h = y1 - y0;
    VISC_ASSERT(w > 0 && h > 0);

    /* Columns [dx0, dx0 + dw) are decoded. jpeg_crop_scanline moves the
     * left edge to an iMCU boundary, and fancy upsampling replicates chroma
     * at the edges of the crop, so the crop's outer columns differ from a
     * full decode by a few levels. Decoding one iMCU more on each side and
     * keeping only [x0, x1) makes every returned pixel equal the full
     * decode's. */
    int dx0 = 0, dw = out_w;
    if (x0 > 0 || x1 < out_w) {
        const int margin = cinfo.max_h_samp_factor * cinfo.min_DCT_scaled_size;
        JDIMENSION xoff = (JDIMENSION)(x0 > margin ? x0 - margin : 0);
        JDIMENSION end = (JDIMENSION)(x1 < out_w - margin ? x1 + margin : out_w);
        JDIMENSION cw = end - xoff;
        jpeg_crop_scanline(&cinfo, &xoff, &cw);
        dx0 = (int)xoff;
        dw = (int)cw;
        VISC_ASSERT(dx0 <= x0 && dx0 + dw >= x1 && dw == (int)cinfo.output_width);
    }
    if (y0 > 0 && (int)jpeg_skip_scanlines(&cinfo, (JDIMENSION)y0) != y0)
        fail_with((j_common_ptr)&cinfo, "truncated JPEG: rows missing above the region");

    /* Rows go straight into the image when nothing needs converting or
     * cutting, or into the caller's buffer whole (the image is then the
     * part [x0, x1) of each row); otherwise through one row buffer. */
    const int channels = cmyk ? 4 : 3;
    const size_t wide = (size_t)dw * 3;
    const int borrow = !cmyk && opt && opt->into && opt->into_size / wide >= (size_t)h;
    const int direct = borrow || (!cmyk && dw == w);
    uint8_t *pixels = borrow ? opt->into : NULL;
    if (!borrow) pixels = st.pixels = visc_malloc((size_t)w * h * 3, "decoded JPEG");
    const size_t stride = borrow ? wide : (size_t)w * 3;
    if (!direct) st.row = visc_malloc((size_t)dw * channels, "JPEG row");
    for (int y = 0; y < h; y++) {
        uint8_t *dst = pixels + (size_t)y * stride;
        JSAMPROW row = direct ? dst : st.row;
        if (jpeg_read_scanlines(&cinfo, &row, 1) != 1)
            fail_with((j_common_ptr)&cinfo, "truncated JPEG: scanline missing");
        if (direct) continue;
        const uint8_t *src = st.row + (size_t)(x0 - dx0) * channels;
        if (cmyk) cmyk_to_rgb(dst, src, w);
        else memcpy(dst, src, (size_t)w * 3);
    }
    /* A full decode reads on to the EOI marker, so a file cut after the
     * last scanline's data is still reported as truncated. whole_file does
     * the same below the region: skipping still reads (entropy-decodes)
     * the data, without the IDCT, upsampling and colour conversion. */
    /* whole_file reads on only where that can change the answer. A
     * single-scan file whose bytes end with the EOI marker cannot run out
     * of data below the region (the entropy decoder meets EOI there at the
     * latest), and what else the rows below can hold, corrupt entropy
     * data, libjpeg only warns about: reading them would accept the file
     * too. The one case told apart only by reading is a stray marker
     * segment after the scan (a full decode refuses an unexpected second
     * SOS). A multi-scan (progressive) file was read whole by
     * jpeg_start_decompress already. */
    const int ends_eoi = size >= 2 && buf[size - 2] == 0xFF && buf[size - 1] == 0xD9;
    const int whole = opt && opt->whole_file && (jpeg_has_multiple_scans(&cinfo) || !ends_eoi);
    if (y1 < out_h && whole) {
        /* libjpeg-turbo's skip to the last row marks the input finished
         * without reading it; the last row is read, so the data is too. */
        const int skip = out_h - y1 - 1;
        if (skip > 0 && (int)jpeg_skip_scanlines(&cinfo, (JDIMENSION)skip) != skip)
            fail_with((j_common_ptr)&cinfo, "truncated JPEG: rows missing below the region");
        if (!st.row) st.row = visc_malloc((size_t)dw * channels, "JPEG row");
        JSAMPROW row = st.row;
        if (jpeg_read_scanlines(&cinfo, &row, 1) != 1)
            fail_with((j_common_ptr)&cinfo, "truncated JPEG: scanline missing");
    }
    if (y1 == out_h || whole) jpeg_finish_decompress(&cinfo); /* up to EOI */
    else jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    free(st.row);

    out->image = borrow ? (visc_image){pixels + (size_t)(x0 - dx0) * 3, w, h, (int)wide}
                        : (visc_image){st.pixels, w, h, 3 * w};
    out->borrowed = borrow;
    out->scale_num = num;
    out->scale_denom = s;
    out->source_width = src_w;
    out->source_height = src_h;
    /* Output pixel i stands for source pixels [i*s/num, (i+1)*s/num),
     * clipped; x0 and y0 are multiples of num, x1 and y1 too unless they
     * are the edge. 64 bits: x1 * s may pass INT_MAX for a huge image. */
    const int64_t ex = (int64_t)x1 * s / num, ey = (int64_t)y1 * s / num;
    const int cx1 = ex < src_w ? (int)ex : src_w, cy1 = ey < src_h ? (int)ey : src_h;
    const int cx0 = x0 / num * s, cy0 = y0 / num * s;
    out->covers = (visc_rect){cx0, cy0, cx1 - cx0, cy1 - cy0};
    return 0;
}
