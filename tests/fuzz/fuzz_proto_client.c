/*
 * fuzz_proto_client.c - libFuzzer harness: the client's side of the wire
 * protocol (what strata --pager does with the daemon's messages).
 *
 * Input: 24 bytes giving a session (map_size, slots_size, page size as u64s:
 * what a MODEL set up), then datagrams as in fuzz_proto_server.c (u16 length,
 * bytes).  Each datagram is decoded with proto_decode() (pager/proto.c), as
 * client.c's recv_msg() and watchdog do, from a buffer of exactly its size;
 * then used as client.c uses it: a MODEL's sizes checked with
 * proto_model_ok(), an ERROR's text formatted, each REMAP range read with
 * proto_remap_range() and checked with proto_range_ok().  A range the check
 * accepts must lie inside the mapping (and the slots), page aligned: the
 * harness checks that itself, independently, with 128-bit arithmetic.
 */
#include "datagrams.h"
#include "proto_i.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t sink;

static void check_range(const struct proto_range *r, uint64_t map, uint64_t slots, uint64_t page)
{
	typedef unsigned __int128 u128;

	if (!proto_range_ok(r, map, slots, page))
		return;
	if (!page || !r->len || r->off % page || r->len % page || (u128)r->off + r->len > map)
		abort();
	if (r->from != PROTO_FROM_MODEL &&
	    (r->from % page || (u128)r->from + r->len > slots))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint64_t map, slots, page;
	size_t i = 24, n;
	uint8_t *dg;

	if (size < 24)
		return 0;
	map = proto_get_u64(data);
	slots = proto_get_u64(data + 8);
	page = proto_get_u64(data + 16);
	while ((dg = next_datagram(data, size, &i, &n))) {
		struct proto_msg m;
		char why[400];

		if (proto_decode(dg, n, &m, NULL) == 0) {
			switch (m.type) {
			case PROTO_MODEL:
				if (proto_model_ok(m.u.model.file_size, m.u.model.map_size, page) &&
				    (m.u.model.file_size == 0 ||
				     m.u.model.file_size > m.u.model.map_size ||
				     m.u.model.map_size % page))
					abort();
				break;
			case PROTO_ERROR:
				if (m.u.error.err <= 0 || m.u.error.err > 4095)
					abort();
				snprintf(why, sizeof(why), "%.*s", (int)m.u.error.text_len,
					 m.u.error.text);
				sink += strlen(why);
				break;
			case PROTO_REMAP:
				if (m.u.remap.n == 0 || m.u.remap.n > PROTO_REMAP_MAX)
					abort();
				for (uint32_t k = 0; k < m.u.remap.n; k++) {
					struct proto_range r;

					proto_remap_range(&m, k, &r);
					check_range(&r, map, slots, page);
				}
				break;
			case PROTO_STATUS:
				for (uint32_t k = 0; k < m.len; k++)
					sink += m.pl[k];
				break;
			default:
				break;
			}
		}
		free(dg);
	}
	return 0;
}
