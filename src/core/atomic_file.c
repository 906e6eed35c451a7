/* atomic_file.c — files written whole or not at all: a temporary file in
 * the same folder, fsync, rename over the target, fsync of the folder. A
 * process killed mid-write leaves the previous file as it was. */
#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

bool ts_atomic_open(ts_atomic_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->tmp, sizeof f->tmp, "%s.tmp.%ld", path, (long)getpid());
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    f->ok = f->fd >= 0;
    f->err = f->ok ? 0 : errno;
    return f->ok;
}

bool ts_atomic_write(ts_atomic_file *f, const void *p, size_t n) {
    const char *c = p;
    while (f->ok && n) {
        ssize_t w = write(f->fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            f->ok = false, f->err = w < 0 ? errno : EIO;
            break;
        }
        c += w, n -= (size_t)w;
    }
    return f->ok;
}

bool ts_atomic_commit(ts_atomic_file *f, bool keep) {
    if (f->fd < 0)
        return false;
    if (keep && f->ok && fsync(f->fd) != 0)
        f->ok = false, f->err = errno;
    if (close(f->fd) != 0 && f->ok)
        f->ok = false, f->err = errno;
    f->fd = -1;
    if (keep && f->ok && rename(f->tmp, f->path) != 0)
        f->ok = false, f->err = errno;
    if (!keep || !f->ok) {
        unlink(f->tmp);
        return false;
    }
    char dcopy[4096]; /* make the rename durable */
    snprintf(dcopy, sizeof dcopy, "%s", f->path);
    int dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0)
        fsync(dfd), close(dfd);
    return true;
}

ts_status ts_copy_file(ts_ctx *ctx, const char *from, const char *to) {
    FILE *f = fopen(from, "rb");
    if (!f)
        return ts_set_error(ctx, TS_ERR_IO, "cannot read %s: %s", from,
                            strerror(errno));
    ts_atomic_file af;
    bool ok = ts_atomic_open(&af, to);
    char buf[1 << 16];
    size_t k;
    while (ok && (k = fread(buf, 1, sizeof buf, f)) > 0)
        ok = ts_atomic_write(&af, buf, k);
    ok = ok && !ferror(f);
    fclose(f);
    if (!ts_atomic_commit(&af, ok))
        return ts_set_error(ctx, TS_ERR_IO, "cannot write %s: %s", to,
                            strerror(af.err ? af.err : EIO));
    return TS_OK;
}
