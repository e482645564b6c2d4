/*
 * fuzz_proto_server.c - libFuzzer harness: the daemon's side of the wire
 * protocol.  Each input is a sequence of datagrams, as a client would send
 * them on one connection: a u16 length (little-endian), then that many bytes,
 * repeated.  Each datagram is decoded with proto_decode() (pager/proto.c), the
 * function server.c's on_sock() calls on every message it receives, copied
 * first into a buffer of exactly its size so an over-read is seen; then the
 * fields the daemon goes on to use are used the same way: a HELLO's name
 * copied as find_model() does, a PASS's per-layer times read, a ROUTE's
 * or a HINT's experts read.  Any message
 * the decoder accepts must be one the daemon can act on with no further
 * length checks: its length matches its type and the counts inside it.
 */
#include "datagrams.h"
#include "proto_i.h"
#include "pager.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void consume(const struct proto_msg *m)
{
	char name[PROTO_MAX_NAME + 1];

	switch (m->type) {
	case PROTO_HELLO:
		if (m->u.hello.name_len > PROTO_MAX_NAME ||
		    PROTO_HELLO_FIXED + (uint64_t)m->u.hello.name_len != m->len)
			abort();
		memcpy(name, m->u.hello.name, m->u.hello.name_len);
		name[m->u.hello.name_len] = '\0';
		sink += strlen(name);
		break;
	case PROTO_PASS:
		if (m->u.pass.n_layers > PAGER_PASS_MAX_LAYERS)
			abort();
		for (uint32_t l = 0; l < m->u.pass.n_layers; l++)
			sink += proto_get_u32(m->u.pass.layer_us + 4 * l);
		break;
	case PROTO_ROUTE:
	case PROTO_HINT:
		if (!m->u.route.n || m->u.route.n > PROTO_ROUTE_MAX ||
		    PROTO_ROUTE_FIXED + 4 * (uint64_t)m->u.route.n != m->len)
			abort();
		for (uint32_t i = 0; i < m->u.route.n; i++)
			sink += proto_get_u32(m->u.route.experts + 4 * i);
		break;
	case PROTO_REGISTER:
		sink += m->u.reg.base ^ m->u.reg.length;
		break;
	case PROTO_DECLARE:
		sink += m->u.declare.declared_bytes + m->u.declare.kv_bytes;
		break;
	case PROTO_STATUS_REQ:
		sink += m->u.status_req.json;
		break;
	case PROTO_REMAPPED:
		sink += m->u.remapped.seq;
		break;
	default:
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t i = 0, n;
	uint8_t *dg;

	while ((dg = next_datagram(data, size, &i, &n))) {
		struct proto_msg m;
		const char *why = NULL;

		if (proto_decode(dg, n, &m, &why) == 0) {
			if (m.len + (size_t)PROTO_HDR_SIZE != n)
				abort();
			consume(&m);
		} else if (!why || !why[0]) {
			abort(); /* a refusal says why, for the log */
		}
		free(dg);
	}
	return 0;
}
