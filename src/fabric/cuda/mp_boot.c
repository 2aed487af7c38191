/*
 * mp_boot.c - the one-process-per-rank bootstrap: a full mesh of abstract Unix sockets that
 * carries small blobs and file descriptors (mp_boot.h says why and how it is keyed).
 */
#include "fabric/cuda/mp_boot.h"

#include "core/checks.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define BOOT_MAGIC 0x7469646bu /* "tidk" */
/* seq of the hello that opens a connection and of the goodbye that closes it. */
#define SEQ_HELLO UINT32_MAX
#define SEQ_BYE (UINT32_MAX - 1)

typedef struct {
    uint32_t magic;
    uint32_t seq;  /* exchange number; hello: UINT32_MAX */
    uint32_t from; /* sender rank */
    uint32_t bytes;
    uint32_t ranks; /* sender's world size */
    uint32_t has_fd;
} boot_hdr_t;

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static socklen_t address_of(const tide_mp_boot_t *b, int rank, struct sockaddr_un *a) {
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    /* Abstract namespace: a leading NUL, the name is the remaining bytes (no terminator). */
    int k = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "tide.%s.%d", b->name, rank);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)k);
}

/* Wait until fd is readable (or hung up); false at the deadline. */
static bool wait_readable(int fd, int64_t deadline) {
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left < 0) left = 0;
        struct pollfd p = {fd, POLLIN, 0};
        int k = poll(&p, 1, (int)(left > 1000 ? 1000 : left));
        if (k > 0) return true;
        if (k < 0 && errno != EINTR) return true; /* the read reports it */
        if (left == 0) return false;
    }
}

static tide_result_t send_msg(const tide_mp_boot_t *b, int peer, const boot_hdr_t *h,
                              const void *blob, int fd) {
    struct iovec iov[2] = {{(void *)h, sizeof(*h)}, {(void *)blob, h->bytes}};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct msghdr m;
    memset(&m, 0, sizeof(m));
    m.msg_iov = iov;
    m.msg_iovlen = h->bytes > 0 ? 2 : 1;
    if (fd >= 0) {
        memset(&ctl, 0, sizeof(ctl));
        m.msg_control = ctl.buf;
        m.msg_controllen = sizeof(ctl.buf);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    const size_t total = sizeof(*h) + h->bytes;
    ssize_t k;
    do {
        k = sendmsg(b->peer_fd[peer], &m, MSG_NOSIGNAL);
    } while (k < 0 && errno == EINTR);
    /* Small messages into an idle stream socket go in one piece. */
    if (k != (ssize_t)total)
        return TIDE_ERR(TIDE_ERR_TIMEOUT,
                        "cuda mp bootstrap '%s': rank %d could not reach rank %d (%s): it left",
                        b->name, b->rank, peer, k < 0 ? strerror(errno) : "short write");
    return TIDE_SUCCESS;
}

/* Read exactly `bytes` (the first read also takes a passed descriptor). */
static tide_result_t recv_exact(const tide_mp_boot_t *b, int peer, void *buf, size_t bytes,
                                int *fd_out, int64_t deadline) {
    size_t got = 0;
    while (got < bytes) {
        if (!wait_readable(b->peer_fd[peer], deadline))
            return TIDE_ERR(TIDE_ERR_TIMEOUT,
                            "cuda mp bootstrap '%s': rank %d waited past the deadline "
                            "(TIDE_TIMEOUT_MS) for rank %d, which is missing",
                            b->name, b->rank, peer);
        struct iovec iov = {(char *)buf + got, bytes - got};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } ctl;
        struct msghdr m;
        memset(&m, 0, sizeof(m));
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = ctl.buf;
        m.msg_controllen = sizeof(ctl.buf);
        ssize_t k = recvmsg(b->peer_fd[peer], &m, MSG_CMSG_CLOEXEC);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return TIDE_ERR(TIDE_ERR_TIMEOUT,
                            "cuda mp bootstrap '%s': rank %d lost rank %d (%s): its process "
                            "exited",
                            b->name, b->rank, peer, k == 0 ? "connection closed" : strerror(errno));
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c != NULL; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                int fd;
                memcpy(&fd, CMSG_DATA(c), sizeof(int));
                if (fd_out != NULL && *fd_out < 0)
                    *fd_out = fd;
                else
                    close(fd);
            }
        got += (size_t)k;
    }
    return TIDE_SUCCESS;
}

static tide_result_t missing(const tide_mp_boot_t *b) {
    char list[256];
    size_t used = 0;
    list[0] = '\0';
    for (int r = 0; r < b->ranks && used + 12 < sizeof(list); ++r)
        if (r != b->rank && b->peer_fd[r] < 0)
            used += (size_t)snprintf(list + used, sizeof(list) - used, "%s%d", used ? ", " : "", r);
    return TIDE_ERR(TIDE_ERR_TIMEOUT,
                    "cuda mp bootstrap '%s': rank %d of %d: rank(s) %s did not join within "
                    "TIDE_TIMEOUT_MS",
                    b->name, b->rank, b->ranks, list);
}

static tide_result_t connect_lower(tide_mp_boot_t *b, int peer, int64_t deadline) {
    struct sockaddr_un a;
    const socklen_t len = address_of(b, peer, &a);
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp bootstrap: socket: %s", strerror(errno));
        if (connect(fd, (const struct sockaddr *)&a, len) == 0) {
            b->peer_fd[peer] = fd;
            boot_hdr_t h = {BOOT_MAGIC, SEQ_HELLO, (uint32_t)b->rank, 0, (uint32_t)b->ranks, 0};
            return send_msg(b, peer, &h, NULL, -1);
        }
        close(fd);
        if (errno != ECONNREFUSED && errno != ENOENT && errno != EAGAIN && errno != EINTR)
            return TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp bootstrap '%s': connect to rank %d: %s",
                            b->name, peer, strerror(errno));
        if (now_ms() > deadline) return missing(b);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

static tide_result_t accept_higher(tide_mp_boot_t *b, int64_t deadline) {
    for (int left = b->ranks - 1 - b->rank; left > 0; --left) {
        if (!wait_readable(b->listen_fd, deadline)) return missing(b);
        int fd = accept4(b->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                ++left;
                continue;
            }
            return TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp bootstrap: accept: %s", strerror(errno));
        }
        /* The hello names the peer; read it on a temporary slot. */
        const int slot = b->rank; /* own slot is free: use it while reading */
        b->peer_fd[slot] = fd;
        boot_hdr_t h;
        tide_result_t res = recv_exact(b, slot, &h, sizeof(h), NULL, deadline);
        b->peer_fd[slot] = -1;
        if (res != TIDE_SUCCESS) {
            close(fd);
            return res;
        }
        if (h.magic != BOOT_MAGIC || h.seq != SEQ_HELLO || (int)h.ranks != b->ranks ||
            (int)h.from <= b->rank || (int)h.from >= b->ranks || b->peer_fd[h.from] >= 0) {
            close(fd);
            return TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                            "cuda mp bootstrap '%s': rank %d got a hello from rank %u of %u "
                            "(this job has %d ranks; two jobs with one name?)",
                            b->name, b->rank, h.from, h.ranks, b->ranks);
        }
        b->peer_fd[h.from] = fd;
    }
    return TIDE_SUCCESS;
}

tide_result_t tide_mp_boot_open(const char *name, int rank, int ranks, int64_t timeout_ms,
                                tide_mp_boot_t *out) {
    TIDE_ARG_CHECK(name != NULL && strlen(name) >= 1 && strlen(name) <= 64,
                   "cuda mp bootstrap: name must have 1..64 characters");
    TIDE_ARG_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "cuda mp bootstrap: rank %d of %d",
                   rank, ranks);
    tide_mp_boot_t b;
    memset(&b, 0, sizeof(b));
    b.rank = rank;
    b.ranks = ranks;
    b.listen_fd = -1;
    snprintf(b.name, sizeof(b.name), "%s", name);
    b.peer_fd = malloc((size_t)ranks * sizeof(int));
    if (b.peer_fd == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp bootstrap: %d ranks", ranks);
    for (int r = 0; r < ranks; ++r)
        b.peer_fd[r] = -1;
    tide_result_t res = TIDE_SUCCESS;
    const int64_t deadline = now_ms() + timeout_ms;
    b.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (b.listen_fd < 0) {
        res = TIDE_ERR(TIDE_ERR_FABRIC, "cuda mp bootstrap: socket: %s", strerror(errno));
        goto fail;
    }
    struct sockaddr_un a;
    const socklen_t len = address_of(&b, rank, &a);
    if (bind(b.listen_fd, (const struct sockaddr *)&a, len) != 0 ||
        listen(b.listen_fd, ranks) != 0) {
        res = TIDE_ERR(TIDE_ERR_FABRIC,
                       "cuda mp bootstrap: rank %d cannot listen on abstract socket "
                       "'@tide.%s.%d': %s (is another job using the name?)",
                       rank, name, rank, strerror(errno));
        goto fail;
    }
    for (int s = 0; s < rank; ++s)
        TIDE_CHECK_GOTO(connect_lower(&b, s, deadline), res, fail);
    TIDE_CHECK_GOTO(accept_higher(&b, deadline), res, fail);
    /* Nobody connects any more; the name is free for the job's next world. */
    close(b.listen_fd);
    b.listen_fd = -1;
    *out = b;
    return TIDE_SUCCESS;
fail:
    tide_mp_boot_close(&b);
    return res;
}

void tide_mp_boot_close(tide_mp_boot_t *b) {
    if (b->listen_fd >= 0) close(b->listen_fd);
    /* A goodbye first: peers that still wait then tell a rank that left from one that died. */
    const boot_hdr_t bye = {BOOT_MAGIC, SEQ_BYE, (uint32_t)b->rank, 0, (uint32_t)b->ranks, 0};
    if (b->peer_fd != NULL)
        for (int r = 0; r < b->ranks; ++r)
            if (b->peer_fd[r] >= 0) {
                (void)send(b->peer_fd[r], &bye, sizeof(bye), MSG_NOSIGNAL | MSG_DONTWAIT);
                close(b->peer_fd[r]);
            }
    free(b->peer_fd);
    memset(b, 0, sizeof(*b));
    b->listen_fd = -1;
}

tide_result_t tide_mp_boot_allgather(tide_mp_boot_t *b, const void *blob, size_t bytes, int fd,
                                     void *blobs_out, int *fds_out, int64_t timeout_ms) {
    TIDE_ARG_CHECK(bytes <= TIDE_MP_BOOT_MAX_BLOB, "cuda mp bootstrap: blob of %zu bytes", bytes);
    const uint32_t seq = b->seq++;
    const int64_t deadline = now_ms() + timeout_ms;
    boot_hdr_t h = {BOOT_MAGIC, seq, (uint32_t)b->rank, (uint32_t)bytes, (uint32_t)b->ranks,
                    fd >= 0};
    if (fds_out != NULL)
        for (int r = 0; r < b->ranks; ++r)
            fds_out[r] = -1;
    memcpy((uint8_t *)blobs_out + (size_t)b->rank * bytes, blob, bytes);
    tide_result_t res = TIDE_SUCCESS;
    for (int p = 0; p < b->ranks && res == TIDE_SUCCESS; ++p)
        if (p != b->rank) {
            if (b->peer_fd[p] < 0)
                res = TIDE_ERR(TIDE_ERR_TIMEOUT, "cuda mp bootstrap '%s': rank %d left earlier",
                               b->name, p);
            else
                res = send_msg(b, p, &h, blob, fd);
        }
    for (int p = 0; p < b->ranks && res == TIDE_SUCCESS; ++p) {
        if (p == b->rank) continue;
        boot_hdr_t in;
        int got_fd = -1;
        res = recv_exact(b, p, &in, sizeof(in), &got_fd, deadline);
        if (res == TIDE_SUCCESS && in.magic == BOOT_MAGIC && in.seq == SEQ_BYE)
            res = TIDE_ERR(TIDE_ERR_TIMEOUT,
                           "cuda mp bootstrap '%s': rank %d waited for rank %d, which closed "
                           "its world",
                           b->name, b->rank, p);
        if (res == TIDE_SUCCESS &&
            (in.magic != BOOT_MAGIC || in.seq != seq || (int)in.from != p || in.bytes != bytes))
            res = TIDE_ERR(TIDE_ERR_INTERNAL,
                           "cuda mp bootstrap '%s': rank %d expected exchange %u of %zu bytes "
                           "from rank %d, got exchange %u of %u bytes from rank %u",
                           b->name, b->rank, seq, bytes, p, in.seq, in.bytes, in.from);
        if (res == TIDE_SUCCESS && bytes > 0)
            res = recv_exact(b, p, (uint8_t *)blobs_out + (size_t)p * bytes, bytes, &got_fd,
                             deadline);
        if (got_fd >= 0) {
            if (fds_out != NULL && res == TIDE_SUCCESS)
                fds_out[p] = got_fd;
            else
                close(got_fd);
        }
    }
    if (res != TIDE_SUCCESS && fds_out != NULL)
        for (int r = 0; r < b->ranks; ++r)
            if (fds_out[r] >= 0) {
                close(fds_out[r]);
                fds_out[r] = -1;
            }
    return res;
}

tide_result_t tide_mp_boot_barrier(tide_mp_boot_t *b, uint64_t tag, int64_t timeout_ms) {
    uint64_t *tags = malloc((size_t)b->ranks * sizeof(*tags));
    if (tags == NULL) return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp bootstrap: barrier");
    tide_result_t res = tide_mp_boot_allgather(b, &tag, sizeof(tag), -1, tags, NULL, timeout_ms);
    for (int r = 0; r < b->ranks && res == TIDE_SUCCESS; ++r)
        if (tags[r] != tag)
            res = TIDE_ERR(TIDE_ERR_INVALID_ARGUMENT,
                           "cuda mp bootstrap '%s': rank %d is at step %llx, rank %d at %llx "
                           "(the ranks' collective calls differ)",
                           b->name, r, (unsigned long long)tags[r], b->rank,
                           (unsigned long long)tag);
    free(tags);
    return res;
}

tide_result_t tide_mp_boot_agree(tide_mp_boot_t *b, const tide_mp_rank_info_t *mine,
                                 int64_t timeout_ms, tide_mp_world_info_t *out) {
    tide_mp_rank_info_t *all = calloc((size_t)b->ranks, sizeof(*all));
    if (all == NULL)
        return TIDE_ERR(TIDE_ERR_NO_MEMORY, "cuda mp bootstrap: %d rank records", b->ranks);
    const tide_result_t res =
        tide_mp_boot_allgather(b, mine, sizeof(*mine), -1, all, NULL, timeout_ms);
    if (res == TIDE_SUCCESS) {
        tide_mp_world_info_t d = {-1, -1, -1, TIDE_SUCCESS, {0}};
        memcpy(d.choice0, all[0].choice, sizeof(d.choice0));
        for (int r = 0; r < b->ranks; ++r) {
            if (d.failed < 0 && all[r].status != TIDE_SUCCESS) {
                d.failed = r;
                d.failed_status = all[r].status;
            }
            for (int q = 0; q < r; ++q) {
                if (memcmp(all[q].uuid, all[r].uuid, sizeof(all[r].uuid)) != 0) continue;
                if (d.shared < 0) d.shared = r;
                if (d.timeshared < 0 && !(all[q].mps && all[r].mps)) d.timeshared = r;
            }
        }
        *out = d;
    }
    free(all);
    return res;
}

int tide_mp_boot_dead_peer(tide_mp_boot_t *b) {
    for (int p = 0; p < b->ranks; ++p) {
        if (p == b->rank) continue;
        if (b->peer_fd[p] < 0) return p;
        struct pollfd q = {b->peer_fd[p], POLLIN, 0};
        if (poll(&q, 1, 0) <= 0) continue;
        if (q.revents & (POLLERR | POLLNVAL)) return p;
        boot_hdr_t h;
        ssize_t k = recv(b->peer_fd[p], &h, sizeof(h), MSG_PEEK | MSG_DONTWAIT);
        if (k == (ssize_t)sizeof(h) && h.magic == BOOT_MAGIC && h.seq == SEQ_BYE) {
            /* It closed its world on purpose (after its own fail-stop, say): not the rank that
             * is missing.  A wait for it ends at the deadline instead. */
            continue;
        }
        /* Data waiting is a live peer ahead of us; EOF or an error is a dead one. */
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return p;
    }
    return -1;
}
