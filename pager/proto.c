/*
 * proto.c - decode and check one message of the stratad wire protocol
 * (proto_i.h), with no socket and no state: the daemon (server.c) and the
 * client (client.c) both receive a datagram, hand its bytes here, and act on
 * the fields only if this says the message is well formed.  The fuzzing
 * harnesses (tests/fuzz/) call the same functions with arbitrary bytes.
 *
 * What is checked here is everything a message says about itself: header,
 * type, the payload's size for its type, lengths and counts inside the
 * payload.  What depends on a session (which message may come now, whether a
 * range lies inside this client's mapping) is the caller's, with the range
 * check below for REMAP.
 *
 * Pure functions; any thread.
 */
#include "proto_i.h"
#include "pager.h"

#include <errno.h>
#include <stddef.h>

static int bad(const char **why, const char *what)
{
	if (why)
		*why = what;
	return -EPROTO;
}

static int payload(struct proto_msg *m, const char **why)
{
	const uint8_t *pl = m->pl;
	uint32_t len = m->len;

	switch (m->type) {
	case PROTO_HELLO:
		if (len < PROTO_HELLO_FIXED)
			return bad(why, "short HELLO");
		m->u.hello.role = proto_get_u32(pl);
		m->u.hello.name_len = proto_get_u32(pl + 4);
		m->u.hello.declared = proto_get_u64(pl + 8);
		m->u.hello.name = (const char *)pl + PROTO_HELLO_FIXED;
		if (m->u.hello.name_len > PROTO_MAX_NAME ||
		    m->u.hello.name_len != len - PROTO_HELLO_FIXED)
			return bad(why, "HELLO name length does not match the message");
		return 0;
	case PROTO_MODEL:
		if (len != PROTO_MODEL_SIZE)
			return bad(why, "malformed MODEL");
		m->u.model.file_size = proto_get_u64(pl);
		m->u.model.map_size = proto_get_u64(pl + 8);
		m->u.model.n_units = proto_get_u32(pl + 16);
		m->u.model.page_size = proto_get_u32(pl + 20);
		m->u.model.model_id = proto_get_u64(pl + 24);
		m->u.model.slots_size = proto_get_u64(pl + 32);
		m->u.model.engine_room = proto_get_u64(pl + 40);
		m->u.model.engine_limit = proto_get_u64(pl + 48);
		m->u.model.flags = proto_get_u32(pl + 56);
		if (m->u.model.flags & ~PROTO_MODEL_HINTS || proto_get_u32(pl + 60))
			return bad(why, "MODEL with unknown flags");
		return 0;
	case PROTO_REGISTER:
		if (len != PROTO_REGISTER_SIZE)
			return bad(why, "malformed REGISTER");
		m->u.reg.base = proto_get_u64(pl);
		m->u.reg.length = proto_get_u64(pl + 8);
		return 0;
	case PROTO_READY:
		if (len != PROTO_READY_SIZE)
			return bad(why, "malformed READY");
		m->u.ready.resident_units = proto_get_u32(pl);
		return 0;
	case PROTO_STATUS_REQ:
		if (len != PROTO_STATUS_REQ_SIZE || proto_get_u32(pl) > 1)
			return bad(why, "malformed STATUS_REQ");
		m->u.status_req.json = proto_get_u32(pl) == 1;
		return 0;
	case PROTO_STATUS:
		return 0;
	case PROTO_ERROR: {
		uint32_t e;

		if (len < 4)
			return bad(why, "malformed ERROR");
		e = proto_get_u32(pl);
		m->u.error.err = e >= 1 && e <= 4095 ? (int)e : EPROTO;
		m->u.error.text = (const char *)pl + 4;
		m->u.error.text_len = len - 4;
		return 0;
	}
	case PROTO_DECLARE:
		if (len != PROTO_DECLARE_SIZE)
			return bad(why, "malformed DECLARE");
		m->u.declare.declared_bytes = proto_get_u64(pl);
		m->u.declare.kv_bytes = proto_get_u64(pl + 8);
		return 0;
	case PROTO_SLOTS:
		if (len != 0)
			return bad(why, "malformed SLOTS");
		return 0;
	case PROTO_REMAP: {
		uint32_t n;

		if (len < PROTO_REMAP_FIXED)
			return bad(why, "short REMAP");
		n = proto_get_u32(pl + 4);
		if (n == 0 || n > PROTO_REMAP_MAX ||
		    len != PROTO_REMAP_FIXED + (uint64_t)n * PROTO_REMAP_RANGE)
			return bad(why, "REMAP range count does not match the message");
		m->u.remap.seq = proto_get_u32(pl);
		m->u.remap.n = n;
		return 0;
	}
	case PROTO_REMAPPED:
		if (len != PROTO_REMAPPED_SIZE)
			return bad(why, "malformed REMAPPED");
		m->u.remapped.seq = proto_get_u32(pl);
		return 0;
	case PROTO_PASS: {
		uint32_t nl;

		if (len < PROTO_PASS_FIXED)
			return bad(why, "short PASS");
		nl = proto_get_u32(pl + 4);
		if (nl > PAGER_PASS_MAX_LAYERS || len != PROTO_PASS_FIXED + 4 * (uint64_t)nl)
			return bad(why, "PASS layer count does not match the message");
		m->u.pass.tokens = proto_get_u32(pl);
		m->u.pass.n_layers = nl;
		m->u.pass.wall_ns = proto_get_u64(pl + 8);
		m->u.pass.outside_us = proto_get_u32(pl + 16);
		m->u.pass.passes = proto_get_u32(pl + 20);
		m->u.pass.produced = proto_get_u32(pl + 24);
		m->u.pass.layer_us = pl + PROTO_PASS_FIXED;
		return 0;
	}
	case PROTO_ROUTE:
	case PROTO_HINT: {
		uint32_t n;

		if (len < PROTO_ROUTE_FIXED)
			return bad(why, m->type == PROTO_HINT ? "short HINT" : "short ROUTE");
		n = proto_get_u32(pl + 4);
		if (n == 0 || n > PROTO_ROUTE_MAX ||
		    len != PROTO_ROUTE_FIXED + 4 * (uint64_t)n)
			return bad(why, m->type == PROTO_HINT ?
						"HINT expert count does not match the message" :
						"ROUTE expert count does not match the message");
		m->u.route.layer = proto_get_u32(pl);
		m->u.route.n = n;
		m->u.route.experts = pl + PROTO_ROUTE_FIXED;
		return 0;
	}
	default:
		return bad(why, "unknown message type");
	}
}

int proto_decode(const uint8_t *buf, size_t n, struct proto_msg *m, const char **why)
{
	*m = (struct proto_msg){ 0 };
	if (n < PROTO_HDR_SIZE || proto_get_u32(buf) != PROTO_MAGIC ||
	    (buf[4] | buf[5] << 8) != PROTO_VERSION || proto_get_u32(buf + 12) != 0)
		return bad(why, "malformed message header (protocol version 7 expected)");
	m->type = (uint16_t)(buf[6] | buf[7] << 8);
	m->len = proto_get_u32(buf + 8);
	if (m->len != n - PROTO_HDR_SIZE || m->len > PROTO_MAX_PAYLOAD)
		return bad(why, "message length does not match the bytes sent");
	m->pl = buf + PROTO_HDR_SIZE;
	return payload(m, why);
}

void proto_remap_range(const struct proto_msg *m, uint32_t i, struct proto_range *r)
{
	const uint8_t *p = m->pl + PROTO_REMAP_FIXED + (size_t)i * PROTO_REMAP_RANGE;

	r->off = proto_get_u64(p);
	r->len = proto_get_u64(p + 8);
	r->from = proto_get_u64(p + 16);
}

bool proto_range_ok(const struct proto_range *r, uint64_t map_size, uint64_t slots_size,
		    uint64_t page)
{
	if (!page || !r->len || r->off % page || r->len % page || r->off > map_size ||
	    r->len > map_size - r->off)
		return false;
	if (r->from == PROTO_FROM_MODEL)
		return true;
	return slots_size && r->from % page == 0 && r->from <= slots_size &&
	       r->len <= slots_size - r->from;
}

bool proto_model_ok(uint64_t file_size, uint64_t map_size, uint64_t page)
{
	return file_size != 0 && file_size <= map_size && map_size <= (uint64_t)SIZE_MAX &&
	       page && map_size % page == 0 && map_size - file_size < page;
}
