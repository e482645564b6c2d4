/*
 * server.c - stratad's front: the socket, the protocol and the clients,
 * set-up and tear-down of models, and the epoll loop that drives everything
 * (client messages, their userfaultfds, io_uring completions, signals, the
 * PSI trigger).  What is in memory and why lives in residency.c; the status
 * views in status.c.
 *
 * Every message is hostile: lengths, roles, names, descriptors and addresses
 * are checked before use, and any violation drops that one connection.
 *
 * Threading: one thread runs everything; nothing blocks but the epoll wait.
 */
#include "server_i.h"
#include "proto_i.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- clients and the protocol ----------------------------------------- */

static void send_error(int fd, int err, const char *fmt, ...)
{
	char buf[300];
	va_list ap;
	int n;

	proto_put_u32((uint8_t *)buf, (uint32_t)err);
	va_start(ap, fmt);
	n = vsnprintf(buf + 4, sizeof(buf) - 4, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t)n > sizeof(buf) - 5)
		n = (int)sizeof(buf) - 5;
	proto_send(fd, PROTO_ERROR, buf, 4 + (uint32_t)n, -1);
}

/* End a connection; why NULL means the client left on its own.  An engine
 * is told why before its socket closes (its watchdog prints it). */
void pager_drop_client(struct client *c, const char *why)
{
	if (c->dead)
		return;
	if (why && c->state == C_ACTIVE)
		send_error(c->fd, EIO, "%s", why);
	c->dead = true;
	if (!why && c->state == C_ACTIVE)
		pager_log(PAGER_LOG_NOTICE, "client pid %d detached from %s (%llu faults, %.1f ms waiting)",
			  (int)c->pid, c->m->name, (unsigned long long)c->faults, c->wait_ns / 1e6);
	else if (!why)
		pager_log(PAGER_LOG_INFO, "connection from pid %d closed", (int)c->pid);
	else if (c->state == C_ACTIVE || c->state == C_REGISTER)
		pager_log(PAGER_LOG_NOTICE, "client pid %d (%s) dropped: %s", (int)c->pid,
			  c->m ? c->m->name : "-", why);
	else
		pager_log(PAGER_LOG_INFO, "connection from pid %d dropped: %s", (int)c->pid, why);
	/* The rest happens in reap_dead(), outside any iteration. */
}

static void free_client(struct client *c)
{
	struct pager *p = c->p;
	struct model *m = c->m;

	if (c->fd >= 0) {
		char junk[64];

		epoll_ctl(p->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		/* a close with messages unread resets the connection, and the
		 * client may see that before our last word (ERROR) */
		while (recv(c->fd, junk, sizeof(junk), MSG_DONTWAIT) > 0)
			;
		close(c->fd);
	}
	if (c->uffd >= 0) {
		epoll_ctl(p->epfd, EPOLL_CTL_DEL, c->uffd, NULL);
		close(c->uffd);
	}
	if (m) {
		pager_slots_forget(c);
		pager_experts_forget(c);
		/* forget its waiters */
		for (unsigned u = 0; u < m->lay->n_units; u++) {
			struct waiter **pw = &m->waiters[u];

			while (*pw) {
				if ((*pw)->c == c) {
					struct waiter *w = *pw;
					*pw = w->next;
					free(w);
				} else {
					pw = &(*pw)->next;
				}
			}
		}
		if (c->state == C_ACTIVE || c->state == C_REGISTER)
			m->n_clients--;
	}
	free(c->view);
	free(c->backlog);
	free(c);
	p->n_clients--;
}

static void reap_dead(struct pager *p)
{
	struct client **pc = &p->clients;
	bool any = false;

	while (*pc) {
		struct client *c = *pc;

		if (c->dead) {
			*pc = c->next;
			free_client(c);
			any = true;
		} else {
			pc = &c->next;
		}
	}
	if (any)
		pager_replan(p);
}

static struct model *find_model(struct pager *p, const char *name, size_t len)
{
	char buf[PROTO_MAX_NAME + 1], *real;

	memcpy(buf, name, len);
	buf[len] = '\0';
	real = realpath(buf, NULL);
	for (unsigned i = 0; i < p->n_models; i++) {
		if ((real && !strcmp(real, p->models[i].real)) || !strcmp(buf, p->models[i].name)) {
			free(real);
			return &p->models[i];
		}
	}
	free(real);
	return NULL;
}


static void on_hello(struct client *c, const struct proto_msg *msg)
{
	struct pager *p = c->p;
	uint32_t role = msg->u.hello.role, name_len = msg->u.hello.name_len;
	uint8_t mp[PROTO_MODEL_SIZE];
	struct model *m;

	if (role == PROTO_ROLE_CONTROL) {
		c->state = C_CONTROL;
		return;
	}
	if (role != PROTO_ROLE_UFFD) {
		send_error(c->fd, EPROTO, "unknown role %u", role);
		pager_drop_client(c, "unknown role");
		return;
	}
	c->declared = msg->u.hello.declared;
	m = find_model(p, msg->u.hello.name, name_len);
	if (!m) {
		send_error(c->fd, ENOENT, "model '%.*s' is not served here",
			   (int)(name_len > 200 ? 200 : name_len), msg->u.hello.name);
		pager_drop_client(c, "it asked for a model not served");
		return;
	}
	if (m->changed) {
		send_error(c->fd, ESTALE, "%s changed on disk while served: restart stratad to serve it again",
			   m->name);
		pager_drop_client(c, "it asked for a model whose file changed");
		return;
	}
	/* The client gets the memfd itself: userfaultfd refuses to register
	 * a mapping that could never be writable (VM_MAYWRITE), so a
	 * read-only descriptor will not do, and write seals would also forbid
	 * the punch holes eviction needs.  Clients map it PROT_READ; they are
	 * trusted as far as SO_PEERCRED says (same user, or root). */
	proto_put_u64(mp, m->lay->file_size);
	proto_put_u64(mp + 8, m->lay->map_size);
	proto_put_u32(mp + 16, m->lay->n_units);
	proto_put_u32(mp + 20, (uint32_t)m->lay->page);
	proto_put_u64(mp + 24, m->idx);
	proto_put_u64(mp + 32, m->n_slots * m->slot_size);
	uint64_t room, limit;

	/* (this client is not connected yet: the others' declarations alone) */
	pager_engine_room(p, pager_declared_connected(p), &room, &limit);
	proto_put_u64(mp + 40, room);
	proto_put_u64(mp + 48, limit);
	/* hints are asked for only where they are read on (experts.c) */
	proto_put_u32(mp + 56, p->cfg.lookahead && m->lay->n_experts ? PROTO_MODEL_HINTS : 0);
	proto_put_u32(mp + 60, 0);
	if (proto_send(c->fd, PROTO_MODEL, mp, sizeof(mp), m->memfd) ||
	    (m->n_slots && proto_send(c->fd, PROTO_SLOTS, NULL, 0, m->slotfd)))
		pager_drop_client(c, "cannot send MODEL");
	c->m = m;
	c->state = C_REGISTER;
	m->n_clients++;
}

static void on_register(struct client *c, const struct proto_msg *msg, int fd)
{
	struct pager *p = c->p;
	struct model *m = c->m;
	struct epoll_event ev = { .events = EPOLLIN };
	char link[64], target[64];
	ssize_t n;
	uint8_t ready[PROTO_READY_SIZE] = { 0 };
	unsigned mapped = 0;

	if (fd < 0) {
		pager_drop_client(c, "REGISTER without a file descriptor");
		return;
	}
	/* The descriptor must really be a userfaultfd. */
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n < 0 || (target[n] = '\0', strcmp(target, "anon_inode:[userfaultfd]"))) {
		send_error(c->fd, EINVAL, "REGISTER did not carry a userfaultfd");
		pager_drop_client(c, "REGISTER without a userfaultfd");
		close(fd);
		return;
	}
	c->base = msg->u.reg.base;
	if (c->base % m->lay->page || msg->u.reg.length != m->lay->map_size) {
		send_error(c->fd, EINVAL, "REGISTER range does not match the model");
		pager_drop_client(c, "REGISTER range mismatch");
		close(fd);
		return;
	}
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
		pager_drop_client(c, "cannot make its uffd non-blocking");
		close(fd);
		return;
	}
	c->uffd = fd;
	c->view = calloc(m->lay->n_units, sizeof(*c->view));
	if (!c->view) {
		pager_drop_client(c, "out of memory");
		return;
	}
	ev.data.u64 = EV(EV_UFFD, c);
	if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		pager_drop_client(c, "epoll");
		return;
	}
	c->state = C_ACTIVE;
	c->pos = -1;
	if (m->n_clients == 1)
		pager_place(m, c->pid);
	pager_log(PAGER_LOG_NOTICE, "client pid %d attached to %s", (int)c->pid, m->name);
	if (c->declared) { /* HELLO's: re-plans every model */
		pager_declare(c, c->declared);
	} else {
		pager_replan(p);
	}
	for (unsigned u = 0; u < m->lay->n_units && !c->dead; u++)
		if (m->us[u].state == U_LOADED) {
			pager_map_unit(c, u);
			mapped++;
		}
	proto_put_u32(ready, mapped);
	if (!c->dead && proto_send(c->fd, PROTO_READY, ready, sizeof(ready), -1))
		pager_drop_client(c, "cannot send READY");
	if (!c->dead) {
		c->ready = true;
		pager_slots_attach(c); /* after READY: the client's watchdog answers */
	}
}

static void on_status_req(struct client *c, const struct proto_msg *msg)
{
	size_t cap = PROTO_MAX_PAYLOAD, n = 0;
	char *buf;

	buf = malloc(cap);
	if (!buf) {
		pager_drop_client(c, "out of memory");
		return;
	}
	pager_render_status(c->p, msg->u.status_req.json, buf, cap, &n);
	if (proto_send(c->fd, PROTO_STATUS, buf, (uint32_t)n, -1))
		pager_drop_client(c, "cannot send STATUS");
	free(buf);
}

static void on_sock(struct client *c)
{
	/* the largest message a client sends: HELLO with a name, or PASS */
	uint8_t buf[PROTO_HDR_SIZE + PROTO_MAX_NAME + 64];
	_Static_assert(PROTO_ROUTE_FIXED + 4 * PROTO_ROUTE_MAX <= PROTO_MAX_NAME + 64,
		       "a ROUTE fits the buffer");
	_Static_assert(PROTO_PASS_FIXED + 4 * PAGER_PASS_MAX_LAYERS <= PROTO_MAX_NAME + 64,
		       "a PASS fits the receive buffer");
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 4)];
	} cm;
	struct iovec iov = { buf, sizeof(buf) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
			     .msg_controllen = sizeof(cm.b) };
	int fds[4], nfd = 0, fd = -1;
	struct proto_msg msg;
	const char *why = "";
	ssize_t n;

	n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	const int err = n < 0 ? errno : 0;
	if (n < 0 && (err == EAGAIN || err == EINTR))
		return;
	/* A failed recvmsg leaves msg_controllen as it was: the buffer then
	 * holds stack garbage, perhaps an old message's descriptor numbers,
	 * now another client's (closing them dropped an unrelated engine). */
	for (struct cmsghdr *ch = n >= 0 ? CMSG_FIRSTHDR(&mh) : NULL; ch; ch = CMSG_NXTHDR(&mh, ch))
		if (ch->cmsg_level == SOL_SOCKET && ch->cmsg_type == SCM_RIGHTS) {
			size_t k = (ch->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			for (size_t i = 0; i < k && nfd < 4; i++)
				memcpy(&fds[nfd++], CMSG_DATA(ch) + i * sizeof(int), sizeof(int));
		}
	if (n <= 0) {
		for (int i = 0; i < nfd; i++)
			close(fds[i]);
		/* EOF, or ECONNRESET: it closed with messages of ours unread
		 * (an engine that exits with REMAPs queued); either way it left */
		pager_drop_client(c, n == 0 || err == ECONNRESET ? NULL : "read error on its socket");
		return;
	}
	if ((mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || nfd > 1 ||
	    proto_decode(buf, (size_t)n, &msg, &why)) {
		for (int i = 0; i < nfd; i++)
			close(fds[i]);
		if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
			why = "message larger than any a client sends";
		else if (nfd > 1)
			why = "more than one file descriptor";
		send_error(c->fd, EPROTO, "%s", why);
		pager_log(PAGER_LOG_WARNING, "pid %d sent a malformed message: %s", (int)c->pid, why);
		pager_drop_client(c, "it sent a malformed message");
		return;
	}
	if (nfd)
		fd = fds[0];
	if (fd >= 0 && !(c->state == C_REGISTER && msg.type == PROTO_REGISTER)) {
		close(fd);
		pager_log(PAGER_LOG_WARNING, "pid %d sent a file descriptor with message %u",
			  (int)c->pid, msg.type);
		pager_drop_client(c, "it sent a file descriptor where none belongs");
		return;
	}
	switch (c->state) {
	case C_HELLO:
		if (msg.type == PROTO_HELLO)
			on_hello(c, &msg);
		else
			pager_drop_client(c, "it did not start with HELLO");
		break;
	case C_REGISTER:
		if (msg.type == PROTO_REGISTER) {
			on_register(c, &msg, fd);
		} else {
			if (fd >= 0)
				close(fd);
			pager_drop_client(c, "expected REGISTER");
		}
		break;
	case C_CONTROL:
		if (msg.type == PROTO_STATUS_REQ)
			on_status_req(c, &msg);
		else
			pager_drop_client(c, "unexpected message on a control connection");
		break;
	case C_FUSE: /* has no socket */
		break;
	case C_ACTIVE:
		if (msg.type == PROTO_DECLARE) {
			c->kv_bytes = msg.u.declare.kv_bytes;
			pager_declare(c, msg.u.declare.declared_bytes);
		} else if (msg.type == PROTO_PASS) {
			pager_predict_pass(c, msg.u.pass.tokens, msg.u.pass.wall_ns,
					   msg.u.pass.outside_us, msg.u.pass.layer_us,
					   msg.u.pass.n_layers);
			c->passes += msg.u.pass.passes;
			c->produced += msg.u.pass.produced;
		} else if (msg.type == PROTO_REMAPPED) {
			pager_on_remapped(c, msg.u.remapped.seq);
		} else if (msg.type == PROTO_ROUTE) {
			pager_experts_route(c, msg.u.route.layer, msg.u.route.experts,
					    msg.u.route.n);
		} else if (msg.type == PROTO_HINT) {
			pager_experts_hint(c, msg.u.route.layer, msg.u.route.experts,
					   msg.u.route.n);
		} else {
			pager_drop_client(c, "unexpected message after READY");
		}
		break;
	}
}

/* May this peer connect?  Root, the daemon's own user, and with
 * --allow-group every member of that group (docs/security.md). */
static bool peer_allowed(const struct pager *p, int fd, const struct ucred *cr)
{
	gid_t groups[256];
	socklen_t len = sizeof(groups);

	if (cr->uid == 0 || cr->uid == geteuid())
		return true;
	if (!p->cfg.allow_group)
		return false;
	if (cr->gid == p->allow_gid)
		return true;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
		return false; /* ERANGE: more than 256 groups; refused, not guessed */
	for (size_t i = 0; i < len / sizeof(gid_t); i++)
		if (groups[i] == p->allow_gid)
			return true;
	return false;
}

static void on_accept(struct pager *p)
{
	for (;;) {
		int fd = accept4(p->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct ucred cr;
		socklen_t crl = sizeof(cr);
		struct client *c;
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP };

		if (fd < 0)
			return;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crl) < 0 ||
		    !peer_allowed(p, fd, &cr)) {
			pager_log(PAGER_LOG_WARNING, "refused a connection from uid %d gid %d (pid %d)",
				  (int)cr.uid, (int)cr.gid, (int)cr.pid);
			send_error(fd, EACCES, "this pager serves root, its own user%s only "
				   "(docs/service.md)", p->cfg.allow_group ? " and its group" : "");
			close(fd);
			continue;
		}
		if (p->n_clients >= MAX_CLIENTS) {
			pager_log(PAGER_LOG_WARNING, "refused pid %d: %d clients already",
				  (int)cr.pid, MAX_CLIENTS);
			send_error(fd, EBUSY, "the pager has %d clients already", MAX_CLIENTS);
			close(fd);
			continue;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			continue;
		}
		c->p = p;
		c->fd = fd;
		c->uffd = -1;
		c->pid = cr.pid;
		c->uid = cr.uid;
		c->pos = -1;
		c->route_layer = -1;
		c->hint_layer = -1;
		c->remaps_tail = &c->remaps;
		ev.data.u64 = EV(EV_SOCK, c);
		if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			close(fd);
			free(c);
			continue;
		}
		c->next = p->clients;
		p->clients = c;
		p->n_clients++;
	}
}


/* ---- set-up ----------------------------------------------------------- */

/* "a budget of B is below the M that streaming needs (name: x MiB, ...)" */
static void below_minimum(const struct pager *p, char *err, size_t errlen)
{
	size_t n = (size_t)snprintf(err, errlen,
				    "a budget of %.1f MiB is below the %.1f MiB that streaming needs "
				    "(the other tensors and %u layers of each model%s:",
				    p->cfg.budget / 1048576.0, p->plan.minimum / 1048576.0,
				    p->window + 1, p->cfg.fuse_dir ? ", the mount's buffers" : "");

	for (unsigned i = 0; i < p->n_models && n < errlen; i++)
		n += (size_t)snprintf(err + n, errlen - n, "%s %s %.1f MiB", i ? "," : "",
				      p->models[i].name, p->plan_models[i].minimum / 1048576.0);
	if (n < errlen)
		snprintf(err + n, errlen - n, "; a smaller --window needs less)");
}

static int open_model(struct pager *p, struct model *m, const char *path, char *err,
		      size_t errlen)
{
	struct stat st;
	void *img;
	int rc, fd;
	const char *slash;

	m->p = p;
	m->fd = m->memfd = m->slotfd = -1;
	m->path = strdup(path);
	m->real = realpath(path, NULL);
	slash = strrchr(path, '/');
	m->name = strdup(slash ? slash + 1 : path);
	if (!m->path || !m->real || !m->name) {
		snprintf(err, errlen, "%s: %s", path, strerror(m->real ? ENOMEM : errno));
		return -ENOENT;
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		rc = fd < 0 ? -errno : -EINVAL;
		snprintf(err, errlen, "%s: %s", path, fd < 0 ? strerror(errno) : "not a regular file");
		if (fd >= 0)
			close(fd);
		return rc;
	}
	/* Parse the header through a temporary mapping, then drop those pages
	 * from the page cache: the model's memory is the memfd, nothing else. */
	img = st.st_size ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
	if (img == MAP_FAILED) {
		snprintf(err, errlen, "%s: %s", path, st.st_size ? strerror(errno) : "empty file");
		close(fd);
		return -EINVAL;
	}
	rc = pager_layout_build(img, (size_t)st.st_size, p->page, true, &m->lay, err, errlen);
	munmap(img, (size_t)st.st_size);
	posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	if (rc) {
		char tmp[256];

		snprintf(tmp, sizeof(tmp), "%s", err);
		snprintf(err, errlen, "%s: %s", path, tmp);
		return rc;
	}
	m->fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (m->fd < 0) {
		snprintf(err, errlen, "%s: cannot open with O_DIRECT: %s", path, strerror(errno));
		return -errno;
	}
	/* the file parsed above, unless it changed in between */
	if (fstat(m->fd, &m->file_st) < 0 || m->file_st.st_size != st.st_size) {
		snprintf(err, errlen, "%s: the file changed while it was opened", path);
		return -ESTALE;
	}
	m->memfd = memfd_create(m->name, MFD_CLOEXEC);
	if (m->memfd < 0 || ftruncate(m->memfd, (off_t)m->lay->map_size) < 0) {
		snprintf(err, errlen, "%s: memfd: %s", path, strerror(errno));
		return -errno;
	}
	m->map = mmap(NULL, m->lay->map_size, PROT_READ | PROT_WRITE, MAP_SHARED, m->memfd, 0);
	if (m->map == MAP_FAILED) {
		m->map = NULL;
		snprintf(err, errlen, "%s: mapping the memfd: %s", path, strerror(errno));
		return -errno;
	}
	m->node = -1;
	pager_place(m, getpid()); /* until a client says where it runs */
	m->us = calloc(m->lay->n_units, sizeof(*m->us));
	m->waiters = calloc(m->lay->n_units, sizeof(*m->waiters));
	if (!m->us || !m->waiters || pager_plan_init(m) || pager_experts_init(m)) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	rc = pager_slots_create(m);
	if (rc) {
		snprintf(err, errlen, "%s: streaming slots: %s", path, strerror(-rc));
		return rc;
	}
	return 0;
}

static void close_model(struct model *m)
{
	if (m->map)
		munmap(m->map, m->lay->map_size);
	if (m->memfd >= 0)
		close(m->memfd);
	if (m->fd >= 0)
		close(m->fd);
	for (unsigned u = 0; m->waiters && u < m->lay->n_units; u++)
		while (m->waiters[u]) {
			struct waiter *w = m->waiters[u];
			m->waiters[u] = w->next;
			free(w);
		}
	free(m->waiters);
	if (m->us)
		pager_slots_destroy(m);
	free(m->us);
	free(m->rank);
	free(m->plan_tps);
	pager_experts_destroy(m);
	pager_layout_destroy(m->lay);
	free(m->path);
	free(m->real);
	free(m->name);
}

/* Bind the socket; a leftover from a crashed daemon is replaced, a live
 * daemon's is not. */
static int bind_socket(struct pager *p, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	if (strlen(p->cfg.socket_path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "socket path is longer than %zu bytes", sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, p->cfg.socket_path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -errno;
	}
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno == EADDRINUSE) {
		int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		bool live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0;

		if (probe >= 0)
			close(probe);
		if (live) {
			snprintf(err, errlen, "%s: another stratad is serving this socket",
				 sa.sun_path);
			close(fd);
			return -EADDRINUSE;
		}
		pager_log(PAGER_LOG_NOTICE, "%s: removing a stale socket (no daemon behind it)",
			  sa.sun_path);
		unlink(sa.sun_path);
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			errno = 0;
	}
	if (errno && access(sa.sun_path, F_OK) != 0) {
		snprintf(err, errlen, "%s: bind: %s", sa.sun_path, strerror(errno));
		close(fd);
		return -errno;
	}
	/* Connecting takes write permission on the socket: the daemon's user
	 * alone, or its group too with --allow-group (whatever the umask) */
	if ((p->cfg.allow_group && chown(sa.sun_path, (uid_t)-1, p->allow_gid) < 0) ||
	    chmod(sa.sun_path, p->cfg.allow_group ? 0660 : 0600) < 0) {
		snprintf(err, errlen, "%s: %s: %s", sa.sun_path,
			 p->cfg.allow_group ? "giving the socket to the group" : "chmod",
			 strerror(errno));
		close(fd);
		unlink(sa.sun_path);
		return -errno;
	}
	if (listen(fd, 64) < 0) {
		snprintf(err, errlen, "%s: listen: %s", sa.sun_path, strerror(errno));
		close(fd);
		return -errno;
	}
	p->lfd = fd;
	p->sock_path = strdup(sa.sun_path);
	return 0;
}

static int watch(struct pager *p, int fd, uint32_t events, uint64_t data)
{
	struct epoll_event ev = { .events = events, .data.u64 = data };

	return epoll_ctl(p->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

/*
 * The reader's request size and queue depth: as measured for the device the
 * largest model is on (probe.c: remembered per device, measured again with
 * --probe-io), with what the command line sets taking precedence.  Small
 * models cannot tell the device from its caches: they get the defaults.
 */
static void choose_io(struct pager *p)
{
	const struct model *big = &p->models[0];
	struct pio_params probed;
	struct pio_device dev;
	int rc;

	p->io_params = (struct pio_params){ .chunk = PIO_DEFAULT_CHUNK, .depth = PIO_DEFAULT_DEPTH,
					    .source = PIO_DEFAULT };
	if (p->cfg.io_cache)
		snprintf(p->io_cache, sizeof(p->io_cache), "%s", p->cfg.io_cache);
	else
		pio_cache_default(p->io_cache, sizeof(p->io_cache));
	for (unsigned i = 1; i < p->n_models; i++)
		if (p->models[i].lay->file_size > big->lay->file_size)
			big = &p->models[i];
	if (p->cfg.io_chunk && p->cfg.io_depth) {
		p->io_why = "set on the command line";
	} else if ((rc = pio_device_of(big->fd, &dev))) {
		p->io_why = "the model's device is unknown";
	} else if (!p->cfg.probe_io && pio_cache_lookup(p->io_cache, &dev, &probed) == 0) {
		p->io_params = probed;
	} else {
		pager_log(PAGER_LOG_NOTICE,
			  "measuring how the storage under %s reads fastest (once per device)",
			  big->name);
		rc = pio_probe(big->fd, big->lay->file_size, &probed);
		if (rc == -EFBIG) {
			p->io_why = "the models are too small to measure the device";
		} else if (rc) {
			pager_log_errno(PAGER_LOG_WARNING, rc, "measuring the storage");
			p->io_why = "measuring the device failed";
		} else {
			p->io_params = probed;
			rc = pio_cache_store(p->io_cache, &dev, &probed);
			if (rc)
				pager_log_errno(PAGER_LOG_WARNING, rc, "%s: cannot remember the measurement",
						p->io_cache);
		}
	}
	if (p->cfg.io_chunk) {
		p->io_params.chunk = p->cfg.io_chunk;
		p->io_params.source = PIO_SET;
	}
	if (p->cfg.io_depth) {
		p->io_params.depth = p->cfg.io_depth;
		p->io_params.source = PIO_SET;
	}
	if (p->io_params.gbps > 0 && p->io_params.source != PIO_SET)
		pager_log(PAGER_LOG_NOTICE, "reads: %g MiB requests, %u in flight (%.2f GB/s, %s)",
			  p->io_params.chunk / 1048576.0, p->io_params.depth, p->io_params.gbps,
			  p->io_params.source == PIO_PROBED ? "measured now"
							    : "measured before; --probe-io measures again");
	else
		pager_log(PAGER_LOG_NOTICE, "reads: %g MiB requests, %u in flight (%s)",
			  p->io_params.chunk / 1048576.0, p->io_params.depth,
			  p->io_why ? p->io_why : "set on the command line");
}

int pager_create(const struct pager_config *cfg, struct pager **out, char *err, size_t errlen)
{
	struct pager *p = calloc(1, sizeof(*p));
	sigset_t mask;
	int rc;

	*out = NULL;
	if (!p) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	p->cfg = *cfg;
	p->consumers[p->n_consumers++] = &pager_uffd_ops;
	if (cfg->fuse_dir)
		p->consumers[p->n_consumers++] = &pager_fuse_ops;
	p->window = cfg->window ? cfg->window : DEFAULT_WINDOW;
	p->page = (uint64_t)sysconf(_SC_PAGESIZE);
	p->epfd = p->lfd = p->sfd = p->pressure.fd = -1;
	if (!cfg->n_models) {
		snprintf(err, errlen, "no model to serve");
		free(p);
		return -EINVAL;
	}
	if (cfg->allow_group) {
		struct group *g = getgrnam(cfg->allow_group);

		if (!g) {
			snprintf(err, errlen, "--allow-group: no group '%s'", cfg->allow_group);
			free(p);
			return -EINVAL;
		}
		p->allow_gid = g->gr_gid;
	}
	if (cfg->mode && plan_mode_parse(cfg->mode, &p->plan.mode)) {
		snprintf(err, errlen, "unknown mode '%s' (speed, balanced or context)", cfg->mode);
		free(p);
		return -EINVAL;
	}
	p->models = calloc(cfg->n_models, sizeof(*p->models));
	p->plan_models = calloc(cfg->n_models, sizeof(*p->plan_models));
	if (!p->models || !p->plan_models) {
		free(p->models);
		free(p->plan_models);
		free(p);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (unsigned i = 0; i < cfg->n_models; i++) {
		p->models[i].idx = i;
		rc = open_model(p, &p->models[i], cfg->models[i], err, errlen);
		p->n_models = i + 1;
		if (rc)
			goto fail;
	}
	if (cfg->budget_auto) {
		rc = pager_budget_measure(p, &p->budget);
		if (rc) {
			snprintf(err, errlen, "no budget given, and MemAvailable could not be read: %s",
				 strerror(-rc));
			goto fail;
		}
		p->cfg.budget = p->budget.bytes;
	} else {
		p->budget.source = cfg->budget ? BUDGET_GIVEN : BUDGET_NONE;
		p->budget.bytes = cfg->budget;
	}
	choose_io(p);
	p->epfd = epoll_create1(EPOLL_CLOEXEC);
	rc = pio_create(p->io_params.depth, p->io_params.chunk, &p->io);
	if (p->epfd < 0 || rc) {
		snprintf(err, errlen, "io_uring: %s", strerror(rc ? -rc : errno));
		goto fail;
	}
	/* one arena, if any model has experts */
	for (unsigned i = 0; i < p->n_models && !pio_bounce_bytes(p->io); i++)
		if (p->models[i].lay->n_experts && (rc = pio_bounce(p->io, PAGER_BOUNCE_BYTES))) {
			snprintf(err, errlen, "the reader's buffer: %s", strerror(-rc));
			goto fail;
		}
	rc = bind_socket(p, err, errlen);
	if (rc)
		goto fail;
	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGUSR1);
	sigaddset(&mask, SIGUSR2);
	sigaddset(&mask, SIGALRM);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	p->sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	rc = cfg->no_pressure ? 0 : pager_pressure_open(p);
	if (rc)
		pager_log_errno(PAGER_LOG_NOTICE, rc,
				"no PSI memory trigger on %s: memory pressure is not watched",
				p->pressure.path);
	if ((rc = watch(p, p->lfd, EPOLLIN, EV(EV_LISTEN, p))) ||
	    (rc = watch(p, p->sfd, EPOLLIN, EV(EV_SIGNAL, p))) ||
	    (rc = watch(p, pio_fd(p->io), EPOLLIN, EV(EV_IO, p))) ||
	    (p->pressure.fd >= 0 &&
	     (rc = watch(p, p->pressure.fd, EPOLLPRI, EV(EV_PSI, p))))) {
		snprintf(err, errlen, "epoll: %s", strerror(-rc));
		goto fail;
	}
	if (cfg->fuse_dir) {
		rc = pager_fuse_start(p, cfg->fuse_dir, err, errlen);
		if (rc)
			goto fail;
	}
	pager_plan(p);
	if (p->cfg.budget && p->cfg.budget < p->plan.minimum) {
		below_minimum(p, err, errlen);
		rc = -EINVAL;
		goto fail;
	}
	pager_replan(p);
	for (unsigned i = 0; i < p->n_models; i++) {
		if (!p->cfg.populate) {
			pager_slots_advise(&p->models[i]);
			continue;
		}
		rc = pager_slots_populate(&p->models[i]);
		if (rc) {
			snprintf(err, errlen, "%s: --populate: making the expert cache's pages: %s",
				 p->models[i].name, strerror(-rc));
			goto fail;
		}
	}
	for (unsigned i = 0; i < p->n_models; i++) {
		struct model *m = &p->models[i];

		pager_log(PAGER_LOG_NOTICE,
			  "serving %s: %.1f MiB, %u layers (largest %.1f MiB), %u planned resident",
			  m->name, m->lay->file_size / 1048576.0, m->lay->n_layers,
			  m->lay->max_layer_bytes / 1048576.0, m->n_resident);
	}
	*out = p;
	return 0;
fail:
	pager_destroy(p);
	return rc ? rc : -EINVAL;
}

int pager_run(struct pager *p)
{
	struct epoll_event evs[32];

	/* pager_on_tick, through the signalfd */
	const struct itimerval tick = { { 0, PAGER_TICK_MS * 1000 }, { 0, PAGER_TICK_MS * 1000 } };

	pager_log(PAGER_LOG_NOTICE, "listening on %s (budget %.1f MiB, window %u)", p->sock_path,
		  p->cfg.budget / 1048576.0, p->window);
	if (setitimer(ITIMER_REAL, &tick, NULL))
		pager_log_errno(PAGER_LOG_WARNING, errno, "setitimer: no pressure relief, no budget "
				"following");
	while (!p->stop) {
		int n = epoll_wait(p->epfd, evs, 32, -1);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			pager_log_errno(PAGER_LOG_ERR, errno, "epoll_wait");
			return -errno;
		}
		for (int i = 0; i < n; i++) {
			uint64_t d = evs[i].data.u64;

			switch (EV_KIND(d)) {
			case EV_LISTEN:
				on_accept(p);
				break;
			case EV_SIGNAL: {
				struct signalfd_siginfo si;

				if (read(p->sfd, &si, sizeof(si)) != sizeof(si))
					break;
				if (si.ssi_signo == SIGALRM) {
					pager_on_tick(p);
				} else if (si.ssi_signo == SIGUSR1) {
					pager_on_pressure(p, "SIGUSR1", true);
				} else if (si.ssi_signo == SIGUSR2) {
					pager_on_restore(p);
				} else {
					pager_log(PAGER_LOG_NOTICE, "%s: shutting down",
						  strsignal((int)si.ssi_signo));
					p->stop = true;
				}
				break;
			}
			case EV_FUSE:
				pager_fuse_event(p, EV_PTR(d));
				break;
			case EV_IO:
				pio_reap(p->io, pager_io_done, p);
				break;
			case EV_PSI:
				pager_on_pressure(p, "memory pressure", false);
				break;
			case EV_SOCK: {
				struct client *c = EV_PTR(d);

				if (!c->dead)
					on_sock(c);
				break;
			}
			case EV_UFFD: {
				struct client *c = EV_PTR(d);

				if (!c->dead)
					pager_on_uffd(c);
				break;
			}
			}
		}
		/* faults read while a CONTINUE drained a uffd (residency.c) */
		for (struct client *c = p->clients; c; c = c->next)
			if (c->n_backlog && !c->dead)
				pager_on_uffd(c);
		reap_dead(p);
	}
	return 0;
}

void pager_destroy(struct pager *p)
{
	if (!p)
		return;
	while (p->clients) {
		struct client *c = p->clients;

		p->clients = c->next;
		free_client(c);
	}
	pager_fuse_stop(p);
	pio_destroy(p->io); /* waits for reads into the models' memory */
	for (unsigned i = 0; i < p->n_models; i++)
		close_model(&p->models[i]);
	free(p->models);
	free(p->plan_models);
	if (p->lfd >= 0) {
		close(p->lfd);
		unlink(p->sock_path);
	}
	free(p->sock_path);
	if (p->sfd >= 0)
		close(p->sfd);
	pager_pressure_close(p);
	if (p->epfd >= 0)
		close(p->epfd);
	free(p);
}

