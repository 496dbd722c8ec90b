/* The tar header walk of `pack-dataset index` (packer/tools/index_scan.py), for a shard in memory.
 *
 * A plain C library (no Python headers): setup.py builds it as the optional extension
 * packer.tools._tarwalk, and index_scan.py loads it with ctypes by its path. Without it the scan
 * walks the same headers in Python; with it, Python still reads every member's bytes (CRC-32, the
 * field checks) but no header.
 *
 * It takes only the common header, and leaves every other one to the Python walk, which handles it
 * exactly as it would without this library: tw_walk stops there (TW_SLOW) and says where. Taken: a
 * ustar/GNU header whose size is 11 octal digits and a NUL, whose checksum is 6 octal digits, a NUL
 * and a NUL or space, whose checksum is right (unsigned sum), and whose member lies inside the
 * buffer; of those, regular files ('0', NUL, '7') are recorded and other kinds (folders, links)
 * stepped over. Left to Python: GNU long names ('L') and pax records ('x', 'g') with the member they
 * describe, base-256 or space-padded numbers, a wrong checksum (Python's walk reports it where it
 * reports any), a member running past the end, and fewer than 512 bytes left.
 */
#include <stdint.h>
#include <string.h>

#define BLOCK 512
#define TW_END 0  /* the end-of-archive block (512 zero bytes) is at *pos */
#define TW_FULL 1 /* cap members recorded; go on from *pos */
#define TW_SLOW 2 /* the header at *pos is the Python walk's */

int tw_version(void) { return 1; }

static int octal(const uint8_t *p, int n, int64_t *out) {
    int64_t v = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '7')
            return 0;
        v = v * 8 + (p[i] - '0');
    }
    *out = v;
    return 1;
}

static int zero_block(const uint8_t *h) {
    static const uint8_t zero[BLOCK];
    return memcmp(h, zero, BLOCK) == 0;
}

/* Walk the headers of buf[0:len) from *pos. For each regular file: heads[k] = its header's
 * position, sizes[k] = its size, name_lens[k] = the length of its name in the header's first 100
 * bytes (up to the first NUL), or -1 where a ustar prefix (bytes 345..500) comes before it. Returns
 * TW_END, TW_FULL or TW_SLOW; *pos is then the position of the header it stopped at, *count the
 * members recorded. */
int tw_walk(const uint8_t *buf, int64_t len, int64_t *pos_io, int64_t cap, int64_t *heads, int64_t *sizes,
            int32_t *name_lens, int64_t *count) {
    int64_t pos = *pos_io, n = 0;
    int status;
    for (;;) {
        if (pos < 0 || pos > len - BLOCK) {
            status = TW_SLOW;
            break;
        }
        const uint8_t *h = buf + pos;
        if (h[0] == 0 && zero_block(h)) {
            status = TW_END;
            break;
        }
        if (n >= cap) {
            status = TW_FULL;
            break;
        }
        int64_t size, stated;
        if (h[135] != 0 || h[154] != 0 || (h[155] != 0 && h[155] != ' ') || !octal(h + 124, 11, &size) ||
            !octal(h + 148, 6, &stated)) {
            status = TW_SLOW;
            break;
        }
        int64_t sum = 8 * ' ';
        for (int i = 0; i < 148; i++)
            sum += h[i];
        for (int i = 156; i < BLOCK; i++)
            sum += h[i];
        uint8_t kind = h[156];
        int64_t at = pos + BLOCK;
        if (sum != stated || kind == 'L' || kind == 'x' || kind == 'g' || size > len - at) {
            status = TW_SLOW;
            break;
        }
        if (kind == '0' || kind == 0 || kind == '7') {
            int32_t name_len;
            if (h[345] != 0 && memcmp(h + 257, "ustar", 5) == 0) {
                name_len = -1;
            } else {
                const uint8_t *nul = memchr(h, 0, 100);
                name_len = nul == NULL ? 100 : (int32_t)(nul - h);
            }
            heads[n] = pos;
            sizes[n] = size;
            name_lens[n] = name_len;
            n++;
        }
        pos = at + (size + BLOCK - 1) / BLOCK * BLOCK;
    }
    *pos_io = pos;
    *count = n;
    return status;
}
