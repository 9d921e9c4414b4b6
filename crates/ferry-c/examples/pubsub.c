/*
 * ferry from C: publish-subscribe, one publisher process and two subscriber
 * processes, checked with checksums.
 *
 *   cc -O2 -Icrates/ferry-c/include crates/ferry-c/examples/pubsub.c \
 *      -Ltarget/release -lferry_c -Wl,-rpath,$PWD/target/release -o pubsub
 *   ./pubsub [messages]
 *
 * The process forks two subscribers before touching ferry. The parent offers the
 * service "frames" (a queue of 4 per subscriber, blocking when one is full) and waits
 * for both subscribers; each child opens the group, joins, subscribes (which waits for
 * the service to be offered), reads every fragment of every message in place and
 * writes each message's length and checksum to its own pipe. The parent writes each
 * even message straight into an fbuf, freezes it, publishes the one message to both
 * subscribers and releases its own handle; each odd one it writes into a loan and
 * sends that to both (and takes one more loan that it discards unsent). Then it
 * compares both subscribers' checksums with its own. Exit status 0 means every checksum matched, every message reached both
 * subscribers, each saw the end of the service, and every fbuf came back to the path.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "example.h"

#define SUBSCRIBERS 2
#define SERVICE "frames"

static size_t message_size(int i) { return 4096 + (size_t)i * 29 * 1024 + (size_t)i % 7; }

static int subscriber(const char *group_name, int sums_fd, int count) {
    FerryGroup *group;
    FerryDomain *domain;
    FerrySubscriber *sub;
    CHECK(ferry_group_open(group_name, &group));
    CHECK(ferry_group_join(group, &domain));
    CHECK(ferry_subscriber_open(domain, SERVICE, 10000, &sub));
    for (int i = 0; i < count; i++) {
        FerryMsg *msg;
        CHECK(ferry_subscriber_recv(sub, 10000, &msg));
        uint64_t rec[2] = {ferry_msg_len(msg), msg_checksum(msg)};
        ferry_msg_release(msg); /* our hold on the fbuf goes back to the publisher */
        if (write(sums_fd, rec, sizeof rec) != (ssize_t)sizeof rec) return 2;
    }
    /* Nothing more comes: the publisher withdraws the service after the last message. */
    FerryMsg *extra = NULL;
    int rc = ferry_subscriber_recv(sub, 10000, &extra);
    if (rc == FERRY_OK) {
        fprintf(stderr, "subscriber: a message after the last one (%zu bytes)\n",
                ferry_msg_len(extra));
        ferry_msg_release(extra);
        return 1;
    }
    if (rc != FERRY_EDISCONNECTED && rc != FERRY_EPEER_GONE) {
        fprintf(stderr, "subscriber: expected the end of the service, got %d: %s\n", rc,
                ferry_last_error());
        return 1;
    }
    ferry_subscriber_close(sub);
    ferry_domain_close(domain);
    ferry_group_close(group);
    return 0;
}

static int publisher(const char *group_name, const int *sums_fds, int count) {
    FerryGroup *group;
    FerryDomain *domain;
    FerryPath *path;
    FerryPublisher *pub;
    CHECK(ferry_group_open(group_name, &group));
    CHECK(ferry_group_join(group, &domain));
    CHECK(ferry_domain_path(domain, 0, &path));
    CHECK(ferry_publisher_offer(domain, SERVICE, 4, 1, &pub));
    CHECK(ferry_publisher_wait(pub, SUBSCRIBERS, 10000));

    uint64_t *sums = calloc((size_t)count, sizeof *sums);
    int bad = 0;
    for (int i = 0; i < count; i++) {
        size_t delivered = 0;
        if (i % 2) {
            /* a loan: written once in place, published to both subscribers */
            FerryLoan *loan;
            CHECK(ferry_publisher_loan(pub, path, message_size(i), &loan));
            delivered = send_loaned(loan, message_size(i), (uint64_t)i, &sums[i]);
            /* a loan given back unsent: nothing is published, the fbuf is back */
            CHECK(ferry_publisher_loan(pub, path, 4096, &loan));
            fill(ferry_loan_data(loan), 4096, ~(uint64_t)i);
            ferry_loan_discard(loan);
        } else {
            /* written in place, then frozen */
            FerryMsg *msg = make_message(path, message_size(i), (uint64_t)i, &sums[i]);
            CHECK(ferry_publish(pub, msg, 10000, &delivered));
            ferry_msg_release(msg); /* ours; each subscriber holds its own */
        }
        if (delivered != SUBSCRIBERS) {
            fprintf(stderr, "message %d reached %zu subscribers\n", i, delivered);
            bad++;
        }
    }
    for (int s = 0; s < SUBSCRIBERS; s++) {
        for (int i = 0; i < count; i++) {
            uint64_t rec[2];
            if (read(sums_fds[s], rec, sizeof rec) != (ssize_t)sizeof rec) return 2;
            if (rec[0] != message_size(i) || rec[1] != sums[i]) {
                fprintf(stderr,
                        "subscriber %d, message %d: sent %zu bytes sum %016llx, "
                        "received %llu bytes sum %016llx\n",
                        s, i, message_size(i), (unsigned long long)sums[i],
                        (unsigned long long)rec[0], (unsigned long long)rec[1]);
                bad++;
            }
        }
    }
    /* Both subscribers released everything before reporting its checksum; the
     * releases reach the path when the publisher's domain collects them (closing the
     * publisher does), so look for a while rather than once. */
    ferry_publisher_close(pub);
    size_t outstanding = ferry_path_outstanding(path);
    for (int tries = 0; outstanding != 0 && tries < 1000; tries++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        outstanding = ferry_path_outstanding(path);
    }
    ferry_path_close(path);
    ferry_domain_close(domain);
    ferry_group_close(group);
    free(sums);
    printf("%d messages to %d subscribers, %d mismatches, %zu bytes outstanding\n", count,
           SUBSCRIBERS, bad, outstanding);
    return bad == 0 && outstanding == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 50;
    char group_name[64];
    snprintf(group_name, sizeof group_name, "c-example-ps-%d", (int)getpid());
    int sums_fds[SUBSCRIBERS];
    pid_t children[SUBSCRIBERS];
    for (int s = 0; s < SUBSCRIBERS; s++) {
        int fds[2];
        if (pipe(fds)) return 2;
        children[s] = fork();
        if (children[s] < 0) return 2;
        if (children[s] == 0) {
            close(fds[0]);
            for (int o = 0; o < s; o++) close(sums_fds[o]);
            _exit(subscriber(group_name, fds[1], count));
        }
        close(fds[1]);
        sums_fds[s] = fds[0];
    }
    int rc = publisher(group_name, sums_fds, count);
    for (int s = 0; s < SUBSCRIBERS; s++) {
        int status = 0;
        close(sums_fds[s]);
        if (waitpid(children[s], &status, 0) != children[s] || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            fprintf(stderr, "subscriber %d failed (status %d)\n", s, status);
            rc = 1;
        }
    }
    printf("%s\n", rc == 0 ? "ok" : "FAILED");
    return rc;
}
