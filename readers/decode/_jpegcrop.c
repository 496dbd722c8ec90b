/* Decode one region of a JPEG at a DCT scale of 1/1, 1/2, 1/4 or 1/8, with the system libjpeg-turbo.
 *
 * Loaded by readers/decode/jpegcrop.py through ctypes (a plain shared library: no Python headers needed;
 * ctypes releases the GIL for the call). Built by the package build (setup.py: the optional
 * extension readers.decode._jpegcrop, so no PyInit__jpegcrop; pip install, pip install -e . and the wheel)
 * where a C compiler and jpeglib.h exist; by hand:
 *     cc -O2 -shared -fPIC -o /tmp/_jpegcrop.so readers/decode/_jpegcrop.c -ljpeg  (DATASET_PACKER_JPEGCROP=/tmp/_jpegcrop.so)
 *
 * What it saves against a full decode (libjpeg-turbo >= 1.5 API, Debian's 2.1.5 here):
 *   - rows below the region: not decoded at all, entropy decoding included (the decode stops there);
 *   - rows above it: entropy-decoded only (jpeg_skip_scanlines skips IDCT, upsampling, color);
 *   - columns outside it: entropy-decoded only (jpeg_crop_scanline).
 * The decoder settings are Pillow's and simplejpeg's (accurate integer IDCT, fancy upsampling),
 * so the region's pixels are those of the full decode (readers/decode/jpegcrop.py asks for a margin around
 * the region, where the cropped upsampler sees an edge that the full decode does not).
 *
 * Warnings (corrupt data that libjpeg would patch up) are errors here: the caller then decodes
 * with its usual path, which decides what to do with such data.
 */
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#define JC_ERRLEN 200

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char *errbuf;
} jc_error;

static void jc_error_exit(j_common_ptr cinfo) {
    jc_error *err = (jc_error *)cinfo->err;
    char msg[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, msg);
    snprintf(err->errbuf, JC_ERRLEN, "%s", msg);
    longjmp(err->jump, 1);
}

static void jc_emit_message(j_common_ptr cinfo, int level) {
    if (level < 0) { /* a warning: corrupt data; strict like simplejpeg */
        jc_error_exit(cinfo);
    }
}

/* Version of this interface, checked by the Python side. */
int jc_version(void) { return 4; }

/* Would libjpeg's block smoothing (jdcoefct.c, on by default: do_block_smoothing) apply to this
 * decode? Called after jpeg_start_decompress, which absorbs every scan of a multi-scan file, so
 * coef_bits is final. libjpeg-turbo 2.1.5's smoothing_ok() smooths a progressive file when some
 * component's coefficients 1..9 (SAVED_COEFS) are not fully known (coef_bits != 0: never sent,
 * or successive-approximation bits still missing), provided its DC is known and those quantizers
 * are nonzero. Smoothing reads the neighbouring blocks, which a cropped or skipped decode treats
 * as an edge. This answers yes on a superset (any of coefficients 0..9 of any component not
 * fully known, whatever the quantizers): such files are decoded in full by the caller. */
static int jc_would_smooth(const struct jpeg_decompress_struct *cinfo) {
    int ci, k;
    if (!cinfo->progressive_mode) return 0;
    if (cinfo->coef_bits == NULL) return 1;
    for (ci = 0; ci < cinfo->num_components; ci++) {
        for (k = 0; k < 10; k++) {
            if (cinfo->coef_bits[ci][k] != 0) return 1;
        }
    }
    return 0;
}

/* Decode rows [y0, y1) and columns [x0, x1) (in output pixels at scale 1/denom) of `data` as RGB.
 *
 * `info` gets 6 ints: output height, output width (of the whole image at that scale), the first
 * column written (x0 moved left to an iMCU boundary), the columns written, components of the
 * source (1 gray, 3 color), then the rows written. Pixels go to `out` (capacity `cap` bytes):
 * with `stride` 0 as rows of `info[3] * 3` bytes; otherwise row y0 + r, column x goes to
 * `out + r * stride + x * 3` (a canvas whose column 0 is the image's column 0). Returns 0 on success,
 * 1 when `out` is too small (info is filled), 2 when the JPEG is not one this decodes (CMYK, YCCK,
 * ...), 3 when libjpeg's block smoothing would apply (a progressive file whose scans leave some of
 * the first coefficients unknown: jc_would_smooth), -1 on a libjpeg error or warning (message in
 * `errbuf`, at least 200 bytes).
 */
static int jc_run(struct jpeg_decompress_struct *cinfo, const unsigned char *data, unsigned long size, int denom,
                  int y0, int y1, int x0, int x1, unsigned char *out, size_t cap, size_t canvas_stride, int *info,
                  char *errbuf) {
    int height, width, comps, row;
    JDIMENSION xoff, xw;
    size_t stride;

    jpeg_mem_src(cinfo, data, size);
    jpeg_read_header(cinfo, TRUE);
    if (cinfo->jpeg_color_space == JCS_GRAYSCALE) {
        cinfo->out_color_space = JCS_GRAYSCALE; /* expanded to RGB below, as Pillow's convert does */
    } else if (cinfo->jpeg_color_space == JCS_YCbCr || cinfo->jpeg_color_space == JCS_RGB) {
        cinfo->out_color_space = JCS_RGB;
    } else {
        return 2;
    }
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
        snprintf(errbuf, JC_ERRLEN, "scale denominator %d not in 1, 2, 4, 8", denom);
        return -1;
    }
    cinfo->dct_method = JDCT_ISLOW;
    cinfo->do_fancy_upsampling = TRUE;
    cinfo->scale_num = 1;
    cinfo->scale_denom = (unsigned int)denom;
    jpeg_start_decompress(cinfo);
    if (jc_would_smooth(cinfo)) {
        return 3;
    }
    height = (int)cinfo->output_height;
    width = (int)cinfo->output_width;
    comps = cinfo->output_components;
    if (y0 < 0) y0 = 0;
    if (x0 < 0) x0 = 0;
    if (y1 > height) y1 = height;
    if (x1 > width) x1 = width;
    if (y1 <= y0 || x1 <= x0) {
        snprintf(errbuf, JC_ERRLEN, "empty region rows %d-%d, columns %d-%d of %dx%d", y0, y1, x0, x1, height,
                 width);
        return -1;
    }
    xoff = (JDIMENSION)x0;
    xw = (JDIMENSION)(x1 - x0);
    if (xoff > 0 || (int)xw < width) {
        jpeg_crop_scanline(cinfo, &xoff, &xw);
    }
    info[0] = height;
    info[1] = width;
    info[2] = (int)xoff;
    info[3] = (int)xw;
    info[4] = comps;
    if (canvas_stride) {
        stride = canvas_stride;
        out += (size_t)xoff * 3;
        if ((size_t)(y1 - y0 - 1) * stride + ((size_t)xoff + xw) * 3 > cap || ((size_t)xoff + xw) * 3 > stride) {
            return 1;
        }
    } else {
        stride = (size_t)xw * 3;
        if ((size_t)(y1 - y0) * stride > cap) {
            return 1;
        }
    }
    if (y0 > 0) {
        jpeg_skip_scanlines(cinfo, (JDIMENSION)y0);
    }
    row = 0;
    while ((int)cinfo->output_scanline < y1) {
        JSAMPROW rows[16];
        int want = y1 - (int)cinfo->output_scanline, k, got;
        if (want > 16) want = 16;
        for (k = 0; k < want; k++) rows[k] = out + (size_t)(row + k) * stride;
        got = (int)jpeg_read_scanlines(cinfo, rows, (JDIMENSION)want);
        if (got < 1) {
            snprintf(errbuf, JC_ERRLEN, "no scanline %d", (int)cinfo->output_scanline);
            return -1;
        }
        if (comps == 1) { /* gray to RGB in place, from the right end of each row */
            for (k = 0; k < got; k++) {
                unsigned char *dst = rows[k];
                int x;
                for (x = (int)xw - 1; x >= 0; x--) {
                    unsigned char v = dst[x];
                    dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = v;
                }
            }
        }
        row += got;
        info[5] = row;
    }
    /* The rows below the region are never decoded: the caller destroys the decompressor unfinished. */
    return 0;
}

int jc_decode(const unsigned char *data, unsigned long size, int denom, int y0, int y1, int x0, int x1,
              unsigned char *out, size_t cap, size_t stride, int *info, char *errbuf) {
    struct jpeg_decompress_struct cinfo;
    jc_error jerr;
    int status;

    memset(info, 0, 6 * sizeof(int));
    errbuf[0] = 0;
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = jc_error_exit;
    jerr.pub.emit_message = jc_emit_message;
    jerr.errbuf = errbuf;
    if (setjmp(jerr.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    status = jc_run(&cinfo, data, size, denom, y0, y1, x0, x1, out, cap, stride, info, errbuf);
    jpeg_destroy_decompress(&cinfo);
    return status;
}

/* The frame header of `data`, without decoding: `info` gets 13 ints: height, width, the number of
 * components, libjpeg's J_COLOR_SPACE of the file, progressive (0/1), arithmetic coding (0/1),
 * the restart interval in MCUs, then h and v sampling factors of the first three components
 * (0 where there is none). 0, or -1 on a libjpeg error or warning (message in `errbuf`). */
int jc_header(const unsigned char *data, unsigned long size, int *info, char *errbuf) {
    struct jpeg_decompress_struct cinfo;
    jc_error jerr;
    int ci;

    memset(info, 0, 13 * sizeof(int));
    errbuf[0] = 0;
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = jc_error_exit;
    jerr.pub.emit_message = jc_emit_message;
    jerr.errbuf = errbuf;
    if (setjmp(jerr.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, size);
    jpeg_read_header(&cinfo, TRUE);
    info[0] = (int)cinfo.image_height;
    info[1] = (int)cinfo.image_width;
    info[2] = cinfo.num_components;
    info[3] = (int)cinfo.jpeg_color_space;
    info[4] = cinfo.progressive_mode ? 1 : 0;
    info[5] = cinfo.arith_code ? 1 : 0;
    info[6] = (int)cinfo.restart_interval;
    for (ci = 0; ci < cinfo.num_components && ci < 3; ci++) {
        info[7 + 2 * ci] = cinfo.comp_info[ci].h_samp_factor;
        info[8 + 2 * ci] = cinfo.comp_info[ci].v_samp_factor;
    }
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

/* Encode `pixels` (height x width x comps bytes, comps 1 gray or 3 RGB) as a JPEG with this library,
 * for the self-check of readers/decode/jpegcrop.py (the kinds of file it vouches for: sampling factors,
 * scan scripts, arithmetic coding, restart intervals). `sampling`: h, v for each component (NULL:
 * the library's default). `scans`: `nscans` scans of 9 ints each (components in scan, 4 component
 * indexes, Ss, Se, Ah, Al), NULL for one sequential scan; `progressive` 1 for the library's
 * default progressive script instead. `arith` 1 for arithmetic coding; `restart` > 0 a restart
 * interval of that many MCUs. The JPEG goes to `out` (capacity `cap`), its size to `*outlen`.
 * 0, 1 when `out` is too small (`*outlen` says how big), -1 on an error (message in `errbuf`). */
int jc_encode(const unsigned char *pixels, int height, int width, int comps, int quality, const int *sampling,
              const int *scans, int nscans, int progressive, int arith, int restart, unsigned char *out,
              size_t cap, size_t *outlen, char *errbuf) {
    struct jpeg_compress_struct cinfo;
    jc_error jerr;
    jpeg_scan_info script[64];
    unsigned char *volatile buf = NULL;
    unsigned long len = 0;
    int ci, k, status;

    *outlen = 0;
    errbuf[0] = 0;
    if ((comps != 1 && comps != 3) || nscans < 0 || nscans > 64 || height < 1 || width < 1) {
        snprintf(errbuf, JC_ERRLEN, "bad encode arguments");
        return -1;
    }
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = jc_error_exit;
    jerr.pub.emit_message = jc_emit_message;
    jerr.errbuf = errbuf;
    if (setjmp(jerr.jump)) {
        jpeg_destroy_compress(&cinfo);
        free(buf);
        return -1;
    }
    jpeg_create_compress(&cinfo);
    jpeg_mem_dest(&cinfo, (unsigned char **)&buf, &len);
    cinfo.image_width = (JDIMENSION)width;
    cinfo.image_height = (JDIMENSION)height;
    cinfo.input_components = comps;
    cinfo.in_color_space = comps == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&cinfo);
    jpeg_set_quality(&cinfo, quality, TRUE);
    if (sampling) {
        for (ci = 0; ci < comps; ci++) {
            cinfo.comp_info[ci].h_samp_factor = sampling[2 * ci];
            cinfo.comp_info[ci].v_samp_factor = sampling[2 * ci + 1];
        }
    }
    if (progressive) jpeg_simple_progression(&cinfo);
    if (scans && nscans > 0) {
        for (k = 0; k < nscans; k++) {
            const int *sc = scans + 9 * k;
            script[k].comps_in_scan = sc[0];
            for (ci = 0; ci < 4; ci++) script[k].component_index[ci] = sc[1 + ci];
            script[k].Ss = sc[5];
            script[k].Se = sc[6];
            script[k].Ah = sc[7];
            script[k].Al = sc[8];
        }
        cinfo.scan_info = script;
        cinfo.num_scans = nscans;
    }
    cinfo.arith_code = arith ? TRUE : FALSE;
    if (restart > 0) cinfo.restart_interval = (unsigned int)restart;
    jpeg_start_compress(&cinfo, TRUE);
    while (cinfo.next_scanline < cinfo.image_height) {
        JSAMPROW row = (JSAMPROW)(pixels + (size_t)cinfo.next_scanline * (size_t)width * (size_t)comps);
        jpeg_write_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_compress(&cinfo);
    jpeg_destroy_compress(&cinfo);
    *outlen = (size_t)len;
    status = 1;
    if ((size_t)len <= cap) {
        memcpy(out, buf, len);
        status = 0;
    }
    free(buf);
    return status;
}

/* Entropy-decode the whole JPEG and nothing else (jpeg_read_coefficients): the part of a decode no
 * region can skip above its last row. For benchmarks/bench_decode.py's profile. 0, or -1 (errbuf). */
int jc_entropy_only(const unsigned char *data, unsigned long size, char *errbuf) {
    struct jpeg_decompress_struct cinfo;
    jc_error jerr;

    errbuf[0] = 0;
    cinfo.err = jpeg_std_error(&jerr.pub);
    jerr.pub.error_exit = jc_error_exit;
    jerr.pub.emit_message = jc_emit_message;
    jerr.errbuf = errbuf;
    if (setjmp(jerr.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, size);
    jpeg_read_header(&cinfo, TRUE);
    jpeg_read_coefficients(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    return 0;
}
