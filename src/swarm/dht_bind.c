/* dht_bind.c: binds OpenDHT's sockets to the address the user chose (see
 * dht_bind.h for why this interposes bind(2)). */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "dht_bind.h"
#include "visc/core.h"

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

static _Thread_local int scope_family; /* 0: no scope open on this thread */
static _Thread_local struct in_addr scope_v4;
static _Thread_local struct in6_addr scope_v6;

int visc_dht_bind_scope_begin(const char *host) {
    scope_family = 0;
    if (!host || !*host || strcmp(host, "*") == 0 || strcmp(host, "0.0.0.0") == 0) return 0;
    if (strcmp(host, "localhost") == 0) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &scope_v4) == 1) scope_family = AF_INET;
    else if (inet_pton(AF_INET6, host, &scope_v6) == 1) scope_family = AF_INET6;
    else return visc_set_error("dht: '%s' is not an IPv4 or IPv6 address to bind to", host);
    return 0;
}

void visc_dht_bind_scope_end(void) { scope_family = 0; }

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn libc_bind;
    if (!libc_bind) libc_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (!libc_bind) {
        errno = ENOSYS;
        return -1;
    }
    if (!scope_family || !addr || (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
        return libc_bind(fd, addr, len);
    if (addr->sa_family != scope_family) {
        errno = EADDRNOTAVAIL; /* the other family: OpenDHT goes on without it */
        return -1;
    }
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY)) a.sin_addr = scope_v4;
        return libc_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
    if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) a.sin6_addr = scope_v6;
        return libc_bind(fd, (const struct sockaddr *)&a, sizeof a);
    }
    return libc_bind(fd, addr, len);
}
