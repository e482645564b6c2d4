/*
 * client.c - map a model served by stratad, the way mmap(2) would.
 *
 * pager_client_open() connects to the daemon, receives the model's memfd
 * (read-only), maps it PROT_READ/MAP_SHARED, creates a userfaultfd registered
 * over the mapping for MISSING | MINOR faults, passes the uffd to the daemon
 * and waits for READY.  From then on the daemon maps pages in as it reads
 * them, and the engine just reads memory.
 *
 * Pager death is the dangerous case: if the daemon's copy of the uffd closes
 * and ours did too, the kernel would fill faults with zero pages and the
 * engine would compute garbage; if ours stays open, a fault would hang.  So
 * we keep our copy and a watchdog thread polls the socket: EOF (the daemon
 * died or dropped us) calls on_lost, which must end the process.  The poll
 * wakes at once on EOF, well within the one second the engine may take.
 *
 * The watchdog also carries out the daemon's REMAPs: the daemon reads streamed
 * layers into a few reused slots of a second memfd (residency.c), so the
 * range of such a layer must show that slot while the layer is in it, and
 * the model's memfd again afterwards.  Each range is mapped afresh at a
 * spare address, registered with the uffd there, and moved into place with
 * one mremap(MREMAP_FIXED), so an engine thread touching it sees either the
 * old mapping or the new one, registered, and never a slot's stale page.
 * (The uffd asks for UFFD_FEATURE_EVENT_REMAP, without which mremap would
 * drop the registration.)  Such an mremap waits until the daemon has read
 * the event from the uffd: a dead daemon never will.  So the remaps run on a
 * thread of their own, fed by the watchdog, which stays free to see the
 * daemon's EOF or ERROR and end the process.
 */
#include "pager.h"
#include "proto_i.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

struct remap_job {
	struct remap_job *next;
	uint32_t len;
	uint8_t payload[];
};

struct pager_client {
	int sock;
	int uffd;
	int memfd;      /* the model's, kept for REMAPs back to it */
	int slotfd;     /* the streaming slots, -1 without */
	uint64_t slots_size;
	uint64_t engine_room, engine_limit; /* from MODEL: see pager_client_room */
	bool hints;     /* from MODEL: the daemon reads ahead on HINT */
	int stopfd; /* eventfd: tells the watchdog to go quietly */
	void *base;
	size_t map_size;
	pthread_t watchdog;
	bool watching;
	/* REMAPs, from the watchdog to the remapper thread, in order */
	pthread_t remapper;
	bool remapping;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct remap_job *jobs, **jobs_tail;
	bool stopping;
	void (*on_lost)(const char *why);
};

/*
 * Receive one message of `want` type into buf (payload only, up to cap), and
 * at most one fd.  An ERROR from the daemon becomes its message in err.
 */
static int recv_msg(int fd, uint16_t want, uint8_t *buf, uint32_t cap, uint32_t *len,
		    int *pass_fd, char *err, size_t errlen)
{
	uint8_t *raw = malloc(PROTO_HDR_SIZE + PROTO_MAX_PAYLOAD);
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 4)];
	} cm;
	struct iovec iov = { raw, PROTO_HDR_SIZE + PROTO_MAX_PAYLOAD };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
			     .msg_controllen = sizeof(cm.b) };
	int got_fd = -1, rc = 0;
	struct proto_msg msg;
	const char *why = "";
	uint32_t plen;
	ssize_t n;

	if (!raw) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	do
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	/* A daemon that refuses a peer sends ERROR and closes; if our HELLO
	 * was still unread there, the close resets the connection, and the
	 * reset is reported before the message still queued here: read that. */
	if (n < 0 && errno == ECONNRESET)
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	for (struct cmsghdr *ch = CMSG_FIRSTHDR(&mh); n >= 0 && ch; ch = CMSG_NXTHDR(&mh, ch))
		if (ch->cmsg_level == SOL_SOCKET && ch->cmsg_type == SCM_RIGHTS) {
			size_t k = (ch->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			for (size_t i = 0; i < k; i++) {
				int f;

				memcpy(&f, CMSG_DATA(ch) + i * sizeof(int), sizeof(int));
				if (got_fd < 0)
					got_fd = f;
				else
					close(f);
			}
		}
	if (n <= 0) {
		snprintf(err, errlen, "the daemon closed the connection");
		rc = -ECONNRESET;
		goto out;
	}
	if ((mh.msg_flags & MSG_TRUNC) || proto_decode(raw, (size_t)n, &msg, &why)) {
		snprintf(err, errlen, "the daemon sent a malformed message: %s", why);
		rc = -EPROTO;
		goto out;
	}
	plen = msg.len;
	if (msg.type == PROTO_ERROR) {
		snprintf(err, errlen, "%.*s", (int)msg.u.error.text_len, msg.u.error.text);
		rc = -msg.u.error.err;
		goto out;
	}
	if (msg.type != want || plen > cap) {
		snprintf(err, errlen, "unexpected message %u from the daemon", msg.type);
		rc = -EPROTO;
		goto out;
	}
	memcpy(buf, raw + PROTO_HDR_SIZE, plen);
	*len = plen;
	if (pass_fd) {
		*pass_fd = got_fd;
		got_fd = -1;
	}
out:
	if (got_fd >= 0)
		close(got_fd);
	free(raw);
	return rc;
}

/* A send failed: the daemon may have closed the connection after an ERROR
 * saying why (a refused peer).  It sends the ERROR before it closes, so the
 * message, if any, is already queued here when the send sees the close. */
static int send_failed(int fd, char *err, size_t errlen)
{
	struct pollfd pf = { .fd = fd, .events = POLLIN };
	uint8_t none[1];
	uint32_t len;
	int rc;

	if (poll(&pf, 1, 0) == 1 && (pf.revents & POLLIN)) {
		rc = recv_msg(fd, PROTO_ERROR, none, 0, &len, NULL, err, errlen);
		if (rc < 0 && rc != -ECONNRESET)
			return rc; /* err says what the daemon said */
	}
	snprintf(err, errlen, "cannot talk to the pager");
	return -EIO;
}

static int connect_to(const char *path, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "%s: socket path too long", path);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -errno;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;

		snprintf(err, errlen, "cannot reach the pager at %s: %s%s", path, strerror(e),
			 e == ECONNREFUSED ? " (stale socket: is stratad running?)" : "");
		close(fd);
		return -e;
	}
	return fd;
}

static void default_lost(const char *why)
{
	char buf[400];
	int n = snprintf(buf, sizeof(buf), "strata: %s\n", why);

	if (n > 0 && write(STDERR_FILENO, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf)) < 0)
		n = 0;
	_exit(2);
}

/* Map [base + off, + len) again from the slots (from) or the model (from =
 * PROTO_FROM_MODEL), registered with our uffd; see the top of the file. */
static int remap(struct pager_client *c, const struct proto_range *r)
{
	bool model = r->from == PROTO_FROM_MODEL;
	void *tmp, *to;

	if (!proto_range_ok(r, c->map_size, c->slotfd < 0 ? 0 : c->slots_size,
			    (uint64_t)sysconf(_SC_PAGESIZE)))
		return -EPROTO;
	tmp = mmap(NULL, r->len, PROT_READ, MAP_SHARED, model ? c->memfd : c->slotfd,
		   (off_t)(model ? r->off : r->from));
	if (tmp == MAP_FAILED)
		return -errno;
	struct uffdio_register ur = {
		.range = { .start = (uint64_t)(uintptr_t)tmp, .len = r->len },
		.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR,
	};
	if (ioctl(c->uffd, UFFDIO_REGISTER, &ur) < 0) {
		int e = -errno;

		munmap(tmp, r->len);
		return e;
	}
	to = mremap(tmp, r->len, r->len, MREMAP_MAYMOVE | MREMAP_FIXED, (uint8_t *)c->base + r->off);
	if (to == MAP_FAILED) {
		int e = -errno;

		munmap(tmp, r->len);
		return e;
	}
	return 0;
}

/* A REMAP (decoded by the watchdog): carry out every range, then say so.  A
 * failure leaves this process unable to tell which bytes it would read: it
 * ends. */
static void on_remap(struct pager_client *c, const struct proto_msg *m)
{
	uint8_t ack[PROTO_REMAPPED_SIZE];
	static char why[200];

	for (uint32_t i = 0; i < m->u.remap.n; i++) {
		struct proto_range r;
		int rc;

		proto_remap_range(m, i, &r);
		rc = remap(c, &r);
		if (rc) {
			snprintf(why, sizeof(why), "cannot map a streamed layer: %s", strerror(-rc));
			c->on_lost(why);
		}
	}
	proto_put_u32(ack, m->u.remap.seq);
	/* A failed send is a daemon gone or dropping us: the watchdog sees
	 * the socket close, with the daemon's reason if it gave one. */
	proto_send(c->sock, PROTO_REMAPPED, ack, sizeof(ack), -1);
}

static void *remapper(void *arg)
{
	struct pager_client *c = arg;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		struct remap_job *j;

		while (!c->jobs && !c->stopping)
			pthread_cond_wait(&c->cond, &c->lock);
		if (c->stopping)
			break;
		j = c->jobs;
		c->jobs = j->next;
		if (!c->jobs)
			c->jobs_tail = &c->jobs;
		pthread_mutex_unlock(&c->lock);
		struct proto_msg m;

		if (proto_decode(j->payload, j->len, &m, NULL) == 0)
			on_remap(c, &m);

		free(j);
		pthread_mutex_lock(&c->lock);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/* Hand a REMAP (the whole message, decoded once already) to the remapper
 * thread. */
static void queue_remap(struct pager_client *c, const uint8_t *pl, uint32_t len)
{
	struct remap_job *j = malloc(sizeof(*j) + len);

	if (!j)
		c->on_lost("out of memory");
	j->next = NULL;
	j->len = len;
	memcpy(j->payload, pl, len);
	pthread_mutex_lock(&c->lock);
	*c->jobs_tail = j;
	c->jobs_tail = &j->next;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

static void *watchdog(void *arg)
{
	struct pager_client *c = arg;
	struct pollfd pfd[2] = { { c->sock, POLLIN | POLLRDHUP, 0 }, { c->stopfd, POLLIN, 0 } };
	uint8_t buf[PROTO_HDR_SIZE + PROTO_REMAP_FIXED + PROTO_REMAP_MAX * PROTO_REMAP_RANGE + 512];

	for (;;) {
		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			c->on_lost("pager connection lost: cannot watch it");
		}
		if (pfd[1].revents)
			return NULL;
		if (!pfd[0].revents)
			continue;
		/* After READY the daemon sends REMAPs, and ERROR when it
		 * drops us; anything else, and EOF, end the session. */
		ssize_t n = recv(c->sock, buf, sizeof(buf), MSG_DONTWAIT);

		/* ECONNRESET: the daemon closed with our REMAPPEDs unread; it is
		 * reported once, before the messages it sent us still queued
		 * (its ERROR, maybe): read on. */
		if (n < 0 && (errno == EAGAIN || errno == EINTR || errno == ECONNRESET))
			continue;
		if (n > 0) {
			struct proto_msg m;
			const char *bad = "";

			if (proto_decode(buf, (size_t)n, &m, &bad)) {
				static char why[300];

				snprintf(why, sizeof(why), "the pager sent a malformed message: %s", bad);
				c->on_lost(why);
			}
			if (m.type == PROTO_REMAP) {
				queue_remap(c, buf, (uint32_t)n);
				continue;
			}
			if (m.type == PROTO_ERROR) {
				static char why[400];

				snprintf(why, sizeof(why), "the pager dropped this engine: %.*s",
					 (int)m.u.error.text_len, m.u.error.text);
				c->on_lost(why);
			}
			c->on_lost("the pager sent an unexpected message");
		}
		c->on_lost("pager daemon died (its connection closed)");
	}
}

int pager_client_open(const struct pager_client_config *cfg, struct pager_client **out,
		      const void **base, size_t *size, char *err, size_t errlen)
{
	struct pager_client *c = calloc(1, sizeof(*c));
	size_t name_len = strlen(cfg->model);
	uint8_t *hello = NULL, mp[PROTO_MODEL_SIZE], reg[PROTO_REGISTER_SIZE], ready[PROTO_READY_SIZE];
	uint32_t len;
	int memfd = -1, rc;
	uint64_t file_size;

	*out = NULL;
	if (!c) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	c->sock = c->uffd = c->stopfd = c->memfd = c->slotfd = -1;
	c->jobs_tail = &c->jobs;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	c->on_lost = cfg->on_lost ? cfg->on_lost : default_lost;
	if (name_len > PROTO_MAX_NAME) {
		snprintf(err, errlen, "model name too long");
		rc = -ENAMETOOLONG;
		goto fail;
	}
	rc = connect_to(cfg->socket_path, err, errlen);
	if (rc < 0)
		goto fail;
	c->sock = rc;

	hello = malloc(PROTO_HELLO_FIXED + name_len);
	if (!hello) {
		rc = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	proto_put_u32(hello, PROTO_ROLE_UFFD);
	proto_put_u32(hello + 4, (uint32_t)name_len);
	proto_put_u64(hello + 8, cfg->declared_bytes);
	memcpy(hello + PROTO_HELLO_FIXED, cfg->model, name_len);
	rc = proto_send(c->sock, PROTO_HELLO, hello, (uint32_t)(PROTO_HELLO_FIXED + name_len), -1);
	if (rc) {
		rc = send_failed(c->sock, err, errlen);
		goto fail;
	}
	rc = recv_msg(c->sock, PROTO_MODEL, mp, sizeof(mp), &len, &memfd, err, errlen);
	if (rc)
		goto fail;
	if (len != PROTO_MODEL_SIZE || memfd < 0) {
		snprintf(err, errlen, "malformed MODEL message from the daemon");
		rc = -EPROTO;
		goto fail;
	}
	file_size = proto_get_u64(mp);
	c->map_size = proto_get_u64(mp + 8);
	c->slots_size = proto_get_u64(mp + 32);
	c->engine_room = proto_get_u64(mp + 40);
	c->engine_limit = proto_get_u64(mp + 48);
	c->hints = proto_get_u32(mp + 56) & PROTO_MODEL_HINTS;
	if (c->slots_size) {
		uint8_t none[1];

		rc = recv_msg(c->sock, PROTO_SLOTS, none, sizeof(none), &len, &c->slotfd, err, errlen);
		if (rc)
			goto fail;
		if (c->slotfd < 0) {
			snprintf(err, errlen, "malformed SLOTS message from the daemon");
			rc = -EPROTO;
			goto fail;
		}
	}
	if (!proto_model_ok(file_size, c->map_size, (uint64_t)sysconf(_SC_PAGESIZE))) {
		snprintf(err, errlen, "the daemon sent impossible sizes");
		rc = -EPROTO;
		goto fail;
	}
	c->base = mmap(NULL, c->map_size, PROT_READ, MAP_SHARED, memfd, 0);
	c->memfd = memfd;
	memfd = -1;
	if (c->base == MAP_FAILED) {
		c->base = NULL;
		rc = -errno;
		snprintf(err, errlen, "mapping the model: %s", strerror(errno));
		goto fail;
	}

	/* User-mode-only faults are all the engine takes (it reads weights in
	 * user space) and need no privilege; older kernels lack the flag. */
	c->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
	if (c->uffd < 0)
		c->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (c->uffd < 0) {
		rc = -errno;
		snprintf(err, errlen, "userfaultfd: %s", strerror(errno));
		goto fail;
	}
	/* EVENT_REMAP keeps the registration of a range REMAP moves into place */
	struct uffdio_api api = { .api = UFFD_API,
				  .features = UFFD_FEATURE_MINOR_SHMEM | UFFD_FEATURE_EVENT_REMAP };
	if (ioctl(c->uffd, UFFDIO_API, &api) < 0) {
		rc = -errno;
		snprintf(err, errlen, "userfaultfd: no shmem minor faults on this kernel: %s",
			 strerror(errno));
		goto fail;
	}
	struct uffdio_register ur = {
		.range = { .start = (uint64_t)(uintptr_t)c->base, .len = c->map_size },
		.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_MINOR,
	};
	if (ioctl(c->uffd, UFFDIO_REGISTER, &ur) < 0) {
		rc = -errno;
		snprintf(err, errlen, "registering the mapping: %s", strerror(errno));
		goto fail;
	}
	proto_put_u64(reg, (uint64_t)(uintptr_t)c->base);
	proto_put_u64(reg + 8, c->map_size);
	rc = proto_send(c->sock, PROTO_REGISTER, reg, sizeof(reg), c->uffd);
	if (rc) {
		rc = send_failed(c->sock, err, errlen);
		goto fail;
	}
	rc = recv_msg(c->sock, PROTO_READY, ready, sizeof(ready), &len, NULL, err, errlen);
	if (rc)
		goto fail;

	c->stopfd = eventfd(0, EFD_CLOEXEC);
	if (pthread_create(&c->remapper, NULL, remapper, c)) {
		rc = -EAGAIN;
		snprintf(err, errlen, "cannot start the pager's remapping thread");
		goto fail;
	}
	c->remapping = true;
	if (c->stopfd < 0 || pthread_create(&c->watchdog, NULL, watchdog, c)) {
		rc = -EAGAIN;
		snprintf(err, errlen, "cannot start the pager watchdog");
		goto fail;
	}
	c->watching = true;
	free(hello);
	*base = c->base;
	*size = (size_t)file_size;
	*out = c;
	return 0;
fail:
	if (memfd >= 0)
		close(memfd);
	free(hello);
	pager_client_close(c);
	return rc < 0 ? rc : -EPROTO;
}

void pager_client_room(const struct pager_client *c, uint64_t *room, uint64_t *limit)
{
	*room = c->engine_room;
	*limit = c->engine_limit;
}

bool pager_client_wants_hints(const struct pager_client *c)
{
	return c->hints;
}

int pager_client_declare(struct pager_client *c, uint64_t bytes, uint64_t kv_bytes)
{
	uint8_t p[PROTO_DECLARE_SIZE];

	proto_put_u64(p, bytes);
	proto_put_u64(p + 8, kv_bytes);
	return proto_send(c->sock, PROTO_DECLARE, p, sizeof(p), -1);
}

static uint32_t to_us(uint64_t ns)
{
	return ns / 1000 > UINT32_MAX ? UINT32_MAX : (uint32_t)(ns / 1000);
}

int pager_client_report(struct pager_client *c, const struct pager_pass_report *r)
{
	uint8_t p[PROTO_PASS_FIXED + 4 * PAGER_PASS_MAX_LAYERS] = { 0 };
	uint32_t n_layers = r->layer_ns && r->n_layers <= PAGER_PASS_MAX_LAYERS ? r->n_layers : 0;

	proto_put_u32(p, r->tokens);
	proto_put_u32(p + 4, n_layers);
	proto_put_u64(p + 8, r->wall_ns);
	proto_put_u32(p + 16, to_us(r->outside_ns));
	proto_put_u32(p + 20, r->passes);
	proto_put_u32(p + 24, r->produced);
	for (uint32_t l = 0; l < n_layers; l++)
		proto_put_u32(p + PROTO_PASS_FIXED + 4 * l, to_us(r->layer_ns[l]));
	return proto_send(c->sock, PROTO_PASS, p, PROTO_PASS_FIXED + 4 * n_layers, -1);
}

/* A ROUTE or a HINT: the same payload. */
static int send_experts(struct pager_client *c, uint16_t type, uint32_t layer,
			const uint32_t *experts, uint32_t n)
{
	uint8_t p[PROTO_ROUTE_FIXED + 4 * PROTO_ROUTE_MAX];

	_Static_assert(PAGER_ROUTE_MAX == PROTO_ROUTE_MAX, "the client's limit is the wire's");
	if (n == 0 || n > PROTO_ROUTE_MAX)
		return 0;
	proto_put_u32(p, layer);
	proto_put_u32(p + 4, n);
	for (uint32_t i = 0; i < n; i++)
		proto_put_u32(p + PROTO_ROUTE_FIXED + 4 * i, experts[i]);
	return proto_send(c->sock, type, p, PROTO_ROUTE_FIXED + 4 * n, -1);
}

int pager_client_route(struct pager_client *c, uint32_t layer, const uint32_t *experts,
		       uint32_t n)
{
	return send_experts(c, PROTO_ROUTE, layer, experts, n);
}

int pager_client_hint(struct pager_client *c, uint32_t layer, const uint32_t *experts,
		      uint32_t n)
{
	return send_experts(c, PROTO_HINT, layer, experts, n);
}

void pager_client_close(struct pager_client *c)
{
	uint64_t one = 1;

	if (!c)
		return;
	if (c->watching) {
		if (write(c->stopfd, &one, sizeof(one)) == sizeof(one))
			pthread_join(c->watchdog, NULL);
	}
	if (c->remapping) {
		pthread_mutex_lock(&c->lock);
		c->stopping = true;
		pthread_cond_signal(&c->cond);
		pthread_mutex_unlock(&c->lock);
		pthread_join(c->remapper, NULL);
	}
	while (c->jobs) {
		struct remap_job *j = c->jobs;

		c->jobs = j->next;
		free(j);
	}
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	if (c->base)
		munmap(c->base, c->map_size);
	if (c->uffd >= 0)
		close(c->uffd);
	if (c->sock >= 0)
		close(c->sock);
	if (c->stopfd >= 0)
		close(c->stopfd);
	if (c->memfd >= 0)
		close(c->memfd);
	if (c->slotfd >= 0)
		close(c->slotfd);
	free(c);
}

int pager_status_fetch(const char *socket_path, bool json, char **out, size_t *len, char *err,
		       size_t errlen)
{
	uint8_t hello[PROTO_HELLO_FIXED] = { 0 }, req[PROTO_STATUS_REQ_SIZE];
	uint8_t *buf = malloc(PROTO_MAX_PAYLOAD + 1);
	uint32_t n = 0;
	int fd, rc;

	*out = NULL;
	if (!buf) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	fd = connect_to(socket_path, err, errlen);
	if (fd < 0) {
		free(buf);
		return fd;
	}
	proto_put_u32(hello, PROTO_ROLE_CONTROL);
	proto_put_u32(req, json ? 1 : 0);
	if (proto_send(fd, PROTO_HELLO, hello, sizeof(hello), -1) ||
	    proto_send(fd, PROTO_STATUS_REQ, req, sizeof(req), -1)) {
		rc = send_failed(fd, err, errlen);
		goto out;
	}
	rc = recv_msg(fd, PROTO_STATUS, buf, PROTO_MAX_PAYLOAD, &n, NULL, err, errlen);
	if (rc)
		goto out;
	buf[n] = '\0';
	*out = (char *)buf;
	*len = n;
	buf = NULL;
out:
	free(buf);
	close(fd);
	return rc;
}
