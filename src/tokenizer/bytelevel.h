/* bytelevel.h — GPT-2's byte-level alphabet, shared by the tokenizer and
 * its trainer: every byte as a visible character, and GPT-2's
 * pre-tokenizer pattern. */
#ifndef TS_BYTELEVEL_H
#define TS_BYTELEVEL_H

#include <stdint.h>

#define TS_GPT2_PATTERN                                                        \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "                            \
    "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* bytes_to_unicode: printable bytes map to themselves, the rest to code
 * points from 256 up */
static inline void ts_byte_level_map(uint32_t byte_to_cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable =
            (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        byte_to_cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

/* cp as UTF-8 into o (room for 4); the byte count */
static inline int ts_put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80)
        return o[0] = (char)cp, 1;
    if (cp < 0x800)
        return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)),
               2;
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | ((cp >> 6) & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | ((cp >> 12) & 63));
    o[2] = (char)(0x80 | ((cp >> 6) & 63)), o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

#endif
