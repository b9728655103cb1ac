/* wire.h: the frame types of the swarm protocol (the type byte of a
 * channel frame) and the little-endian helpers every encoder uses. Each
 * message's layout is documented beside its encoder and parser. */
#ifndef VISC_SWARM_WIRE_H
#define VISC_SWARM_WIRE_H

#include <stdint.h>
#include <string.h>

enum {
    VISC_MSG_OPEN = 1, /* {purpose u8, tag[16]} first frame of a connection */
    /* matchmaking (matchmaking.c) */
    VISC_MSG_JOIN = 10,
    VISC_MSG_GROUP = 11,
    VISC_MSG_REJECT = 12,
    /* all-reduce (allreduce.c) */
    VISC_MSG_AR_HELLO = 20,
    VISC_MSG_AR_PART = 21,
    VISC_MSG_AR_RESULT = 22,
    VISC_MSG_AR_DONE = 23,
    VISC_MSG_AR_ABORT = 24,
    /* state download (collaborative training) */
    VISC_MSG_STATE_REQUEST = 30,
    VISC_MSG_STATE_CHUNK = 31,
    VISC_MSG_STATE_HEADER = 32, /* state_sync.h has the layouts of 30-33 */
    VISC_MSG_STATE_REFUSE = 33,
};

static inline void visc_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void visc_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t visc_get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t visc_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static inline void visc_put_f64(uint8_t *p, double d) {
    uint64_t v;
    memcpy(&v, &d, 8);
    visc_put_u64(p, v);
}
static inline double visc_get_f64(const uint8_t *p) {
    uint64_t v = visc_get_u64(p);
    double d;
    memcpy(&d, &v, 8);
    return d;
}

#endif
