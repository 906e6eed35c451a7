/* glyphs.c — the glyph data set (tessera_train.h): fonts found under a
 * folder, each checked for the 62 characters, and images of them rendered
 * with FreeType at a shift and scale, alone or as seeded batches. Owns the
 * FreeType library handle and the faces; knows nothing of models. */
#define _GNU_SOURCE
#include "tessera_train.h"

#include <ft2build.h>
#include FT_FREETYPE_H

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define EM_PX      26.0 /* the em at scale 1, pixels */
#define MAX_FONTS  512
#define MAX_PATH_L 1024

static const char CLASSES[TS_GLYPHS_CLASSES + 1] =
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

struct ts_glyphs {
    ts_ctx *ctx;
    FT_Library lib;
    int n;
    FT_Face face[MAX_FONTS];
    char *path[MAX_FONTS];
};

int ts_glyphs_class_of(char c) {
    const char *p = c ? strchr(CLASSES, c) : NULL;
    return p ? (int)(p - CLASSES) : -1;
}

char ts_glyphs_char(int cls) {
    return cls >= 0 && cls < TS_GLYPHS_CLASSES ? CLASSES[cls] : 0;
}

int ts_glyphs_num_fonts(const ts_glyphs *g) {
    return g->n;
}

const char *ts_glyphs_font_path(const ts_glyphs *g, int font) {
    return font >= 0 && font < g->n ? g->path[font] : NULL;
}

typedef struct {
    char **v;
    int n, cap;
} path_list;

static bool has_ext(const char *name) {
    size_t n = strlen(name);
    return n > 4 && (!strcasecmp(name + n - 4, ".ttf") ||
                     !strcasecmp(name + n - 4, ".otf"));
}

/* every font file under dir, depth first */
static void scan(const char *dir, path_list *out, int depth) {
    DIR *d = depth < 8 ? opendir(dir) : NULL;
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[MAX_PATH_L];
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p)
            continue;
        struct stat sb;
        if (stat(p, &sb))
            continue;
        if (S_ISDIR(sb.st_mode)) {
            scan(p, out, depth + 1);
        } else if (S_ISREG(sb.st_mode) && has_ext(e->d_name)) {
            if (out->n == out->cap) {
                int cap = out->cap ? 2 * out->cap : 64;
                char **v = realloc(out->v, sizeof *v * (size_t)cap);
                if (!v)
                    continue;
                out->v = v, out->cap = cap;
            }
            char *s = strdup(p);
            if (s)
                out->v[out->n++] = s;
        }
    }
    closedir(d);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* a face that has every class and renders ink for each */
static bool face_usable(FT_Face f) {
    if (!FT_IS_SCALABLE(f))
        return false;
    for (int k = 0; k < TS_GLYPHS_CLASSES; k++)
        if (!FT_Get_Char_Index(f, (FT_ULong)(unsigned char)CLASSES[k]))
            return false;
    return true;
}

void ts_glyphs_close(ts_glyphs *g) {
    if (!g)
        return;
    for (int i = 0; i < g->n; i++) {
        FT_Done_Face(g->face[i]);
        free(g->path[i]);
    }
    if (g->lib)
        FT_Done_FreeType(g->lib);
    free(g);
}

ts_status ts_glyphs_open(ts_ctx *ctx, const char *font_dir_or_null,
                         ts_glyphs **out) {
    *out = NULL;
    const char *dir = font_dir_or_null ? font_dir_or_null : "/usr/share/fonts";
    ts_glyphs *g = calloc(1, sizeof *g);
    if (!g)
        return ts_set_error(ctx, TS_ERR_OOM, "glyphs: out of memory");
    g->ctx = ctx;
    if (FT_Init_FreeType(&g->lib)) {
        free(g);
        return ts_set_error(ctx, TS_ERR_STATE,
                            "glyphs: FreeType failed to initialise");
    }
    path_list pl = {0};
    scan(dir, &pl, 0);
    if (pl.n > 0) /* qsort wants a pointer even for none */
        qsort(pl.v, (size_t)pl.n, sizeof *pl.v, cmp_str);
    for (int i = 0; i < pl.n; i++) {
        FT_Face f;
        if (g->n < MAX_FONTS && !FT_New_Face(g->lib, pl.v[i], 0, &f)) {
            if (face_usable(f)) {
                g->face[g->n] = f;
                g->path[g->n++] = pl.v[i];
                continue;
            }
            FT_Done_Face(f);
        }
        free(pl.v[i]);
    }
    free(pl.v);
    if (!g->n) {
        ts_glyphs_close(g);
        return ts_set_error(ctx, TS_ERR_IO,
                            "glyphs: no .ttf or .otf font with all of 0-9, "
                            "A-Z, a-z under %s (Debian: apt-get install "
                            "fonts-dejavu-core)",
                            dir);
    }
    *out = g;
    return TS_OK;
}

ts_status ts_glyphs_render(ts_glyphs *g, int cls, int font, double dx,
                           double dy, double scale, float *out) {
    const int S = TS_GLYPHS_SIZE;
    if (cls < 0 || cls >= TS_GLYPHS_CLASSES || font < 0 || font >= g->n)
        return ts_set_error(g->ctx, TS_ERR_RANGE,
                            "glyphs: class %d (of %d) or font %d (of %d) out "
                            "of range",
                            cls, TS_GLYPHS_CLASSES, font, g->n);
    if (!(scale >= 0.25 && scale <= 2) || !isfinite(dx) || !isfinite(dy))
        return ts_set_error(g->ctx, TS_ERR_RANGE,
                            "glyphs: scale %g (0.25..2) or shift (%g, %g) out "
                            "of range",
                            scale, dx, dy);
    FT_Face f = g->face[font];
    double em = EM_PX * scale;
    FT_Set_Transform(f, NULL, NULL);
    if (FT_Set_Char_Size(f, 0, (FT_F26Dot6)lround(em * 64), 72, 72) ||
        FT_Load_Char(f, (FT_ULong)(unsigned char)CLASSES[cls],
                     FT_LOAD_NO_HINTING | FT_LOAD_NO_BITMAP))
        return ts_set_error(g->ctx, TS_ERR_IO, "glyphs: %s: cannot load '%c'",
                            g->path[font], CLASSES[cls]);
    /* the pen origin: ink box centred on 16 + dx, baseline at
     * 16 + em / 4 + dy (caps rise ~0.72 em, descenders ~0.22 em) */
    FT_Glyph_Metrics *m = &f->glyph->metrics;
    double cx = ((double)m->horiBearingX + (double)m->width / 2) / 64;
    double ox = S / 2.0 + dx - cx, oy = S / 2.0 + em / 4 + dy;
    double fx = floor(ox), fy = floor(oy);
    FT_Vector delta = {(FT_Pos)lround((ox - fx) * 64),
                       (FT_Pos)lround(-(oy - fy) * 64)};
    FT_Set_Transform(f, NULL, &delta);
    int err =
        FT_Load_Char(f, (FT_ULong)(unsigned char)CLASSES[cls],
                     FT_LOAD_NO_HINTING | FT_LOAD_NO_BITMAP | FT_LOAD_RENDER);
    FT_Set_Transform(f, NULL, NULL);
    if (err)
        return ts_set_error(g->ctx, TS_ERR_IO, "glyphs: %s: cannot render '%c'",
                            g->path[font], CLASSES[cls]);
    FT_Bitmap *b = &f->glyph->bitmap;
    for (int k = 0; k < S * S; k++)
        out[k] = -1.0f;
    int x0 = (int)fx + f->glyph->bitmap_left,
        y0 = (int)fy - f->glyph->bitmap_top;
    for (unsigned r = 0; r < b->rows; r++) {
        int y = y0 + (int)r;
        if (y < 0 || y >= S)
            continue;
        const unsigned char *row = b->buffer + (ptrdiff_t)r * b->pitch;
        for (unsigned c = 0; c < b->width; c++) {
            int x = x0 + (int)c;
            if (x >= 0 && x < S)
                out[y * S + x] = -1.0f + 2.0f * (float)row[c] / 255.0f;
        }
    }
    return TS_OK;
}

/* splitmix64: a sample's numbers from (seed, i) */
static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double unit(uint64_t *s) {
    return (double)(mix(s) >> 11) * 0x1p-53;
}

ts_status ts_glyphs_batch(ts_glyphs *g, uint64_t seed, int n, float *images,
                          int64_t *labels) {
    for (int i = 0; i < n; i++) {
        uint64_t s =
            seed * 0x100000001B3ull ^ ((uint64_t)i + 1) * 0xD6E8FEB86659FD93ull;
        int cls = (int)(mix(&s) % TS_GLYPHS_CLASSES);
        int font = (int)(mix(&s) % (uint64_t)g->n);
        double dx = -2 + 4 * unit(&s), dy = -2 + 4 * unit(&s);
        double scale = 0.85 + 0.3 * unit(&s);
        ts_status st = ts_glyphs_render(g, cls, font, dx, dy, scale,
                                        images + (size_t)i * TS_GLYPHS_SIZE *
                                                     TS_GLYPHS_SIZE);
        if (st)
            return st;
        labels[i] = cls;
    }
    return TS_OK;
}
