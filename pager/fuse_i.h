/*
 * fuse_i.h - the FUSE front end's state, shared by fuse.c (the mount, its
 * requests and reads) and fuse_store.c (what goes into and out of the page
 * cache: the notifier thread and the streamer).  Not installed.
 */
#ifndef STRATA_FUSE_I_H
#define STRATA_FUSE_I_H

#define FUSE_USE_VERSION 35
#include "server_i.h"

#include <fuse_lowlevel.h>
#include <limits.h>
#include <pthread.h>

struct job;

struct pager_fuse {
	struct pager *p;
	struct fuse_session *se;
	struct fuse_buf buf;
	char *dir;
	uint8_t *slot[PAGER_FUSE_SLOTS]; /* staging: the streamer's, page-aligned */
	bool slot_busy[PAGER_FUSE_SLOTS];
	unsigned stage_reads;            /* staging reads on the ring */
	/* a slot whose read is in, until its store is done: model and range */
	struct model *slot_m[PAGER_FUSE_SLOTS];
	uint64_t slot_off[PAGER_FUSE_SLOTS], slot_len[PAGER_FUSE_SLOTS];
	unsigned direct_reads;           /* reads of the file itself on the ring */
	/* the notifier thread: todo and done under mu; jobs and efd the loop's */
	pthread_t thread;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct job *todo, *done;
	bool quit;
	unsigned jobs; /* queued and not yet collected */
	int efd;
	pid_t guard; /* the guardian process (see fuse.c) */
};

/* fuse.c */
/* A read waiting for its units needs unit u (it must stay in the memfd). */
bool pager_fuse_waits_for(const struct model *m, unsigned u);

/* fuse_store.c */
/* The mount's side of a policy step (the consumer's advance). */
void pager_fuse_advance(struct model *m);
/* A staging read (IO_STAGE) completed. */
void pager_fuse_staged(struct io_tag *tag, int err, uint64_t bytes, bool last);
#define SPARSE_JOB UINT_MAX /* a job's unit: the token embedding */
void pager_fuse_drop_sparse(struct model *m);
void *pager_fuse_notifier(void *arg);
void pager_fuse_collect(struct pager_fuse *f);

#endif
