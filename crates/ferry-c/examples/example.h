/*
 * What the C examples share: a check that exits on a failed ferry call, the FNV-1a
 * checksum both sides compute, and a deterministic fill for message contents.
 */
#ifndef FERRY_EXAMPLE_H
#define FERRY_EXAMPLE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ferry.h"

#define CHECK(call)                                                              \
    do {                                                                         \
        int rc_ = (call);                                                        \
        if (rc_ != FERRY_OK) {                                                   \
            fprintf(stderr, "%s:%d: %s -> %d: %s\n", __FILE__, __LINE__, #call,  \
                    rc_, ferry_last_error());                                    \
            exit(2);                                                             \
        }                                                                        \
    } while (0)

static inline uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static const uint64_t FNV_START = 0xcbf29ce484222325ULL;

/* The checksum of a received message, read in place (the sender's pages, mapped
 * read-only here): fragment by fragment, no copy. */
static inline uint64_t msg_checksum(FerryMsg *msg) {
    uint64_t h = FNV_START;
    size_t n = ferry_msg_fragment_count(msg);
    for (size_t f = 0; f < n; f++) {
        const uint8_t *data;
        size_t len;
        CHECK(ferry_msg_fragment(msg, f, &data, &len));
        h = fnv1a(h, data, len);
    }
    return h;
}

/* xorshift bytes from `seed`: the same message on both sides without sending it twice. */
static inline void fill(uint8_t *p, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

/* Writes message `seed` of `n` bytes straight into a fresh fbuf of `path` (its write
 * phase), stores its checksum in `*sum` and freezes it: the buffer is consumed, the
 * message returned is the caller's to release. */
static inline FerryMsg *make_message(FerryPath *path, size_t n, uint64_t seed, uint64_t *sum) {
    FerryBuf *buf;
    CHECK(ferry_path_alloc(path, n, &buf));
    uint8_t *p = ferry_buf_data(buf);
    fill(p, n, seed);
    *sum = fnv1a(FNV_START, p, n);
    return ferry_buf_freeze(buf);
}

/* Writes message `seed` of `n` bytes straight into a loan (the fbuf a sender or a
 * publisher lent, with its descriptor made at the loan), stores its checksum in `*sum`,
 * then sends it to the loan's receiver or subscribers: the loan is consumed. Returns
 * how many it reached. */
static inline size_t send_loaned(FerryLoan *loan, size_t n, uint64_t seed, uint64_t *sum) {
    if (ferry_loan_len(loan) != n) {
        fprintf(stderr, "a loan of %zu bytes, not %zu\n", ferry_loan_len(loan), n);
        exit(2);
    }
    uint8_t *p = ferry_loan_data(loan);
    fill(p, n, seed);
    *sum = fnv1a(FNV_START, p, n);
    size_t delivered = 0;
    CHECK(ferry_loan_send(loan, 10000, &delivered));
    return delivered;
}

#endif
