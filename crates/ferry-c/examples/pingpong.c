/*
 * ferry from C: a sender and a receiver process, checked with checksums.
 *
 * From the repository's root (the README quotes these lines, and
 * tests/run_example.sh runs them as written):
 *
 *   cargo build --release -p ferry-c
 *   cc -O2 -Icrates/ferry-c/include crates/ferry-c/examples/pingpong.c \
 *      -Ltarget/release -lferry_c -Wl,-rpath,$PWD/target/release -o pingpong
 *   ./pingpong 50
 *
 * (The argument is the number of messages, 50 by default.)
 *
 * (CHECK, the checksum and the fill are in example.h.) The process forks before
 * touching ferry. The child joins the group, passes its
 * domain id to the parent through a pipe, accepts a channel and receives; it reads
 * every fragment in place (no copy) and sends the checksums back through a second
 * pipe. The parent joins, connects, writes each message straight into an fbuf,
 * freezes and sends it, and compares checksums. Then both leave; exit status 0 means
 * every checksum matched and every fbuf came back to the sender's path.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "example.h"

static size_t message_size(int i) { return 1000 + (size_t)i * 37 * 1024; }

static int receiver(const char *group_name, int id_fd, int sums_fd, int count) {
    FerryGroup *group;
    FerryDomain *domain;
    FerryReceiver *rx;
    char id[32];
    CHECK(ferry_group_open(group_name, &group));
    CHECK(ferry_group_join(group, &domain));
    CHECK(ferry_domain_id(domain, id, sizeof id));
    if (write(id_fd, id, sizeof id) != (ssize_t)sizeof id) return 2;
    CHECK(ferry_domain_accept(domain, 10000, &rx));
    for (int i = 0; i < count; i++) {
        FerryMsg *msg;
        CHECK(ferry_recv(rx, 10000, &msg));
        uint64_t rec[2] = {ferry_msg_len(msg), msg_checksum(msg)};
        ferry_msg_release(msg); /* the fbuf goes back to the sender */
        if (write(sums_fd, rec, sizeof rec) != (ssize_t)sizeof rec) return 2;
    }
    /* The sender closes its end after the last message. */
    FerryMsg *none = NULL;
    int rc = ferry_recv(rx, 10000, &none);
    if (rc != FERRY_EDISCONNECTED) {
        fprintf(stderr, "receiver: expected FERRY_EDISCONNECTED, got %d\n", rc);
        return 1;
    }
    ferry_receiver_close(rx);
    ferry_domain_close(domain);
    ferry_group_close(group);
    return 0;
}

static int sender(const char *group_name, int id_fd, int sums_fd, int count) {
    FerryGroup *group;
    FerryDomain *domain;
    FerryPath *path;
    FerrySender *tx;
    char peer[32];
    CHECK(ferry_group_open(group_name, &group));
    CHECK(ferry_group_join(group, &domain));
    CHECK(ferry_domain_path(domain, 0, &path));
    if (read(id_fd, peer, sizeof peer) != (ssize_t)sizeof peer) return 2;
    CHECK(ferry_domain_connect(domain, peer, 10000, &tx));

    uint64_t *sums = calloc((size_t)count, sizeof *sums);
    for (int i = 0; i < count; i++) {
        if (i % 2) {
            /* a loan: the fbuf and its place in the ring taken first, the message
             * written in place, then sent with one store */
            FerryLoan *loan;
            CHECK(ferry_sender_loan(tx, path, message_size(i), 10000, &loan));
            send_loaned(loan, message_size(i), (uint64_t)i, &sums[i]);
            /* a loan given back unsent: nothing is sent, the fbuf is back at once */
            CHECK(ferry_sender_loan(tx, path, 4096, 10000, &loan));
            fill(ferry_loan_data(loan), 4096, ~(uint64_t)i);
            ferry_loan_discard(loan);
            continue;
        }
        /* written in place, then frozen */
        FerryMsg *msg = make_message(path, message_size(i), (uint64_t)i, &sums[i]);
        CHECK(ferry_send(tx, msg, 10000));
        ferry_msg_release(msg); /* ours; the receiver holds its own */
    }
    int bad = 0;
    for (int i = 0; i < count; i++) {
        uint64_t rec[2];
        if (read(sums_fd, rec, sizeof rec) != (ssize_t)sizeof rec) return 2;
        if (rec[0] != message_size(i) || rec[1] != sums[i]) {
            fprintf(stderr, "message %d: sent %zu bytes sum %016llx, received %llu bytes sum %016llx\n",
                    i, message_size(i), (unsigned long long)sums[i], (unsigned long long)rec[0],
                    (unsigned long long)rec[1]);
            bad++;
        }
    }
    /* Every release has arrived once the receiver reported every checksum. */
    size_t in_flight = ferry_sender_in_flight(tx);
    size_t outstanding = ferry_path_outstanding(path);
    ferry_sender_close(tx);
    ferry_path_close(path);
    ferry_domain_close(domain);
    ferry_group_close(group);
    free(sums);
    printf("%d messages, %d checksum mismatches, %zu in flight, %zu bytes outstanding\n",
           count, bad, in_flight, outstanding);
    return bad == 0 && in_flight == 0 && outstanding == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 50;
    char group_name[64];
    snprintf(group_name, sizeof group_name, "c-example-%d", (int)getpid());
    int id_pipe[2], sums_pipe[2];
    if (pipe(id_pipe) || pipe(sums_pipe)) return 2;
    pid_t child = fork();
    if (child < 0) return 2;
    if (child == 0) {
        close(id_pipe[0]);
        close(sums_pipe[0]);
        _exit(receiver(group_name, id_pipe[1], sums_pipe[1], count));
    }
    close(id_pipe[1]);
    close(sums_pipe[1]);
    int rc = sender(group_name, id_pipe[0], sums_pipe[0], count);
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "receiver failed (status %d)\n", status);
        rc = 1;
    }
    printf("%s\n", rc == 0 ? "ok" : "FAILED");
    return rc;
}
