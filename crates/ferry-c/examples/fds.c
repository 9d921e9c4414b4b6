/*
 * ferry from C: descriptors as cargo between two processes.
 *
 * The process forks before touching ferry. The parent (sender) makes a sealed memfd,
 * an eventfd, a pipe and a socket pair after the fork (so the child cannot have
 * inherited them), and sends one message carrying the memfd, the eventfd, the pipe's
 * write end and one socket; the child (receiver) checks each kind with ferry_fd_kind,
 * reads the memfd, signals the eventfd, writes the pipe and the socket through its own
 * duplicates, and closes them; the parent reads what the child did. Then the parent
 * sends a message carrying the eventfd alone to a receiver that accepts only memfds
 * (FERRY_EFD_REFUSED), and one with more descriptors than the receiver's array holds
 * (FERRY_ETOO_MANY_FDS); and tries one past FERRY_MAX_FDS itself. Both sides count
 * their open descriptors (/proc/self/fd) before and after: exit status 0 means every
 * check held and nothing leaked.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "example.h"

static int fd_count(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

#define EXPECT(cond)                                                         \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
            return 1;                                                        \
        }                                                                    \
    } while (0)

static int receiver(const char *group_name, int id_fd, int done_fd) {
    FerryGroup *group;
    FerryDomain *domain;
    FerryReceiver *rx;
    char id[32];
    CHECK(ferry_group_open(group_name, &group));
    CHECK(ferry_group_join(group, &domain));
    CHECK(ferry_domain_id(domain, id, sizeof id));
    if (write(id_fd, id, sizeof id) != (ssize_t)sizeof id) return 2;
    CHECK(ferry_domain_accept(domain, 10000, &rx));
    int base = fd_count();

    FerryMsg *msg;
    int fds[FERRY_MAX_FDS];
    size_t n = 0;
    CHECK(ferry_recv_fds(rx, 10000, 0, &msg, fds, FERRY_MAX_FDS, &n));
    EXPECT(n == 4);
    EXPECT(fd_count() == base + 4);
    EXPECT(ferry_fd_kind(fds[0]) == FERRY_FD_MEMFD);
    EXPECT(ferry_fd_kind(fds[1]) == FERRY_FD_EVENTFD);
    EXPECT(ferry_fd_kind(fds[2]) == FERRY_FD_PIPE);
    EXPECT(ferry_fd_kind(fds[3]) == FERRY_FD_SOCKET);
    char text[32] = {0};
    EXPECT(pread(fds[0], text, sizeof text - 1, 0) == 11 && strcmp(text, "memfd-cargo") == 0);
    EXPECT(fcntl(fds[0], F_GET_SEALS) & F_SEAL_WRITE);
    uint64_t five = 5;
    EXPECT(write(fds[1], &five, sizeof five) == sizeof five);
    EXPECT(write(fds[2], "pong", 4) == 4);
    EXPECT(write(fds[3], "sock", 4) == 4);
    for (size_t i = 0; i < n; i++) close(fds[i]); /* ours to close */
    ferry_msg_release(msg);
    EXPECT(fd_count() == base);

    /* The eventfd alone, to a receiver that accepts only memfds. */
    EXPECT(ferry_recv_fds(rx, 10000, FERRY_FD_MEMFD, &msg, fds, FERRY_MAX_FDS, &n) ==
           FERRY_EFD_REFUSED);
    EXPECT(strstr(ferry_last_error(), "eventfd") != NULL);
    /* Two descriptors, and room for one. */
    EXPECT(ferry_recv_fds(rx, 10000, 0, &msg, fds, 1, &n) == FERRY_ETOO_MANY_FDS);
    EXPECT(fd_count() == base);
    char ok = 1;
    if (write(done_fd, &ok, 1) != 1) return 2;
    ferry_receiver_close(rx);
    ferry_domain_close(domain);
    ferry_group_close(group);
    return 0;
}

static int sender(const char *group_name, int id_fd, int done_fd) {
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

    int memfd = memfd_create("c-cargo", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT(memfd >= 0 && write(memfd, "memfd-cargo", 11) == 11);
    EXPECT(fcntl(memfd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW) == 0);
    int efd = eventfd(0, EFD_CLOEXEC);
    int p[2], s[2];
    EXPECT(efd >= 0 && pipe2(p, O_CLOEXEC) == 0);
    EXPECT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, s) == 0);
    int base = fd_count();

    uint64_t sum;
    FerryMsg *msg = make_message(path, 64, 1, &sum);
    int over[FERRY_MAX_FDS + 1];
    for (size_t i = 0; i <= FERRY_MAX_FDS; i++) over[i] = memfd;
    EXPECT(ferry_send_fds(tx, msg, over, FERRY_MAX_FDS + 1, 10000) == FERRY_ETOO_MANY_FDS);
    EXPECT(fd_count() == base);
    int cargo[4] = {memfd, efd, p[1], s[1]};
    CHECK(ferry_send_fds(tx, msg, cargo, 4, 10000));
    uint64_t got = 0;
    char text[5] = {0};
    EXPECT(read(efd, &got, sizeof got) == sizeof got && got == 5);
    EXPECT(read(p[0], text, 4) == 4 && strcmp(text, "pong") == 0);
    EXPECT(read(s[0], text, 4) == 4 && strcmp(text, "sock") == 0);
    CHECK(ferry_send_fds(tx, msg, &efd, 1, 10000));
    CHECK(ferry_send_fds(tx, msg, cargo, 2, 10000));
    char ok;
    if (read(done_fd, &ok, 1) != 1) return 2;
    /* Every message was released (the refused ones too): our copies are closed. */
    size_t in_flight = ferry_sender_in_flight(tx);
    int now = fd_count();
    ferry_msg_release(msg);
    ferry_sender_close(tx);
    ferry_path_close(path);
    ferry_domain_close(domain);
    ferry_group_close(group);
    close(memfd);
    close(efd);
    close(p[0]);
    close(p[1]);
    close(s[0]);
    close(s[1]);
    printf("%zu in flight, %d descriptors (%d before)\n", in_flight, now, base);
    return in_flight == 0 && now == base ? 0 : 1;
}

int main(void) {
    char group_name[64];
    snprintf(group_name, sizeof group_name, "c-example-fds-%d", (int)getpid());
    int id_pipe[2], done_pipe[2];
    if (pipe(id_pipe) || pipe(done_pipe)) return 2;
    pid_t child = fork();
    if (child < 0) return 2;
    if (child == 0) {
        close(id_pipe[0]);
        close(done_pipe[0]);
        _exit(receiver(group_name, id_pipe[1], done_pipe[1]));
    }
    close(id_pipe[1]);
    close(done_pipe[1]);
    int rc = sender(group_name, id_pipe[0], done_pipe[0]);
    int status;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "receiver failed (status %d)\n", status);
        rc = 1;
    }
    printf("%s\n", rc == 0 ? "ok" : "FAILED");
    return rc;
}
