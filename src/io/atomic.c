/* atomic.c: files that are either the old version or the complete new one.
 *
 * A crash (or a full disk) in the middle of saving a checkpoint must not
 * destroy the previous checkpoint. So we write "<path>.tmp.<pid>" in the
 * same directory (rename is only atomic within one filesystem), fsync it so
 * the data is on disk before the name points at it, rename it over path,
 * and fsync the directory so the rename itself survives a power loss. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "visc/io.h"

static int write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* fsync of the directory holding path; filesystems that cannot sync a
 * directory (EINVAL) have nothing more to make durable. */
static int sync_parent_dir(const char *path) {
    char *dir = visc_strdup(path);
    char *slash = strrchr(dir, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL)) {
        rc = visc_set_error("cannot sync directory '%s' after writing '%s': %s", dir, path,
                            strerror(errno));
    }
    if (fd >= 0) close(fd);
    free(dir);
    return rc;
}

int visc_write_file_atomic(const char *path, const void *const *parts, const size_t *sizes,
                           int nparts) {
    size_t n = strlen(path) + 32;
    char *tmp = visc_malloc(n, "temporary file name");
    snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());

    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) {
        visc_set_error("cannot write '%s': %s", path, strerror(errno));
        free(tmp);
        return -1;
    }
    const char *step = "write";
    int ok = 1;
    for (int i = 0; i < nparts && ok; i++)
        if (sizes[i] > 0 && write_all(fd, parts[i], sizes[i]) != 0) ok = 0;
    if (ok && fsync(fd) != 0) ok = 0, step = "fsync";
    int saved = errno;
    if (close(fd) != 0 && ok) ok = 0, step = "close", saved = errno;
    if (ok && rename(tmp, path) != 0) ok = 0, step = "rename", saved = errno;
    if (!ok) {
        unlink(tmp);
        visc_set_error("cannot write '%s' (%s failed): %s", path, step, strerror(saved));
        free(tmp);
        return -1;
    }
    free(tmp);
    return sync_parent_dir(path);
}

int visc_mkdirs(const char *path) {
    if (!path[0]) return visc_set_error("cannot create a directory with an empty name");
    char *p = visc_strdup(path);
    int rc = 0;
    /* Create each prefix ending before a '/', then the whole path. */
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != 0) continue;
        char saved = *s;
        *s = 0;
        struct stat st;
        if (mkdir(p, 0777) != 0) {
            int err = errno;
            if (err != EEXIST || stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
                rc =
                    visc_set_error("cannot create directory '%s': %s", p,
                                   err == EEXIST ? "exists and is not a directory" : strerror(err));
                break;
            }
        }
        *s = saved;
        if (saved == 0) break;
        while (s[1] == '/') s++; /* "a//b" */
        if (s[1] == 0) break;    /* trailing slash */
    }
    free(p);
    return rc;
}
