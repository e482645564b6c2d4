/*
 * proto_i.h - the stratad wire protocol (version 7), shared by the daemon, the
 * client library and stratactl.  docs/protocol.md says the same in prose.
 *
 * Transport: a unix seqpacket socket.  Every message is a 16-byte header and a
 * payload; integers are little-endian; file descriptors travel as SCM_RIGHTS
 * ancillary data on the message that names them.
 *
 *   off size field
 *     0    4 magic     0x41525453 ("STRA")
 *     4    2 version   7
 *     6    2 type      enum proto_type
 *     8    4 length    payload bytes that follow (<= PROTO_MAX_PAYLOAD)
 *    12    4 reserved  0
 *
 * A session (uffd client, i.e. an engine):
 *
 *   client -> HELLO    role=1, declared_bytes, model name
 *   daemon -> MODEL    (+ memfd) file size, map size, unit count, slots
 *   daemon -> SLOTS    (+ the slots memfd) only when MODEL says n_slots > 0
 *   client    mmap(memfd, PROT_READ, MAP_SHARED); uffd; register MISSING|MINOR
 *   client -> REGISTER (+ uffd) base address, length
 *   daemon    maps the resident and loaded units into the client
 *   daemon -> READY
 *   client -> DECLARE  declared_bytes (optional, any number of times: the
 *                      engine knows its KV cache size only after reading the
 *                      model's header through the mapping)
 *   daemon -> REMAP    ranges of the client's mapping to map again, each from
 *                      the slots memfd or from the model's memfd (streamed
 *                      layers are read into reused slots: see residency.c)
 *   client -> REMAPPED once it has (registered with its uffd, in place)
 *   client -> PASS     decode passes since the last PASS and their time (at
 *                      most about ten a second): what the speed predictor
 *                      learns the engine's compute time from (predict.c)
 *   client -> ROUTE    a mixture of experts' layer: the experts its router
 *                      picked for the pass, before it reads them, so the
 *                      daemon reads the missing ones at once (experts.c)
 *   client -> HINT     the experts a mixture of experts' next layer will
 *                      likely route to (a lookahead), while it computes this
 *                      one: the daemon reads ahead what room allows
 *   ... the daemon writes nothing else unless it drops the client (ERROR);
 *   EOF on either side ends the session.
 *
 * A control session (stratactl):
 *
 *   client -> HELLO    role=2
 *   client -> STATUS_REQ  format (0 text, 1 JSON)
 *   daemon -> STATUS   text
 *   (repeat STATUS_REQ as often as wanted)
 *
 * Any malformed message (bad magic/version/type, length out of range, payload
 * inconsistent with its type, a message out of order, a missing or extra file
 * descriptor) makes the daemon send ERROR, when it still can, and close the
 * connection.  The daemon never trusts a length or an address from the peer.
 */
#ifndef STRATA_PROTO_I_H
#define STRATA_PROTO_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROTO_MAGIC 0x41525453u
#define PROTO_VERSION 8
#define PROTO_HDR_SIZE 16
#define PROTO_MAX_PAYLOAD (1u << 20)
#define PROTO_MAX_NAME 4096

enum proto_type {
	PROTO_HELLO = 1,
	PROTO_MODEL = 2,
	PROTO_REGISTER = 3,
	PROTO_READY = 4,
	PROTO_STATUS_REQ = 5,
	PROTO_STATUS = 6,
	PROTO_ERROR = 7,
	PROTO_DECLARE = 8,
	PROTO_SLOTS = 9,
	PROTO_REMAP = 10,
	PROTO_REMAPPED = 11,
	PROTO_PASS = 12,
	PROTO_ROUTE = 13,
	PROTO_HINT = 14,
};

enum proto_role {
	PROTO_ROLE_UFFD = 1,
	PROTO_ROLE_CONTROL = 2,
};

/*
 * HELLO payload (>= 16 bytes):
 *    0  4 role            enum proto_role
 *    4  4 name_len        bytes of model name (0 for control; <= PROTO_MAX_NAME)
 *    8  8 declared_bytes  memory the client itself needs (KV cache, buffers)
 *   16  name_len bytes    model: a path (matched by its real path) or the
 *                         file name of a served model
 */
#define PROTO_HELLO_FIXED 16

/*
 * MODEL payload (64 bytes), with one fd: the model's memfd (mapped PROT_READ;
 * it cannot be a read-only descriptor, see on_hello in server.c).
 *    0  8 file_size   bytes of the GGUF file (the engine's region size)
 *    8  8 map_size    file_size rounded up to the page size (the memfd size)
 *   16  4 n_units     residency units (layers + 1)
 *   20  4 page_size
 *   24  8 model_id    the daemon's index of the model
 *   32  8 slots_size  bytes of the slots memfd (0: none, no SLOTS follows)
 *   40  8 engine_room  what this engine may declare and take no resident layer
 *                     (the mode's room for engines less what the others
 *                     declared); UINT64_MAX: no budget
 *   48  8 engine_limit the most it may declare at all (the budget less the
 *                     models' minimums and the others' declarations)
 *   56  4 flags       PROTO_MODEL_HINTS; other bits 0
 *   60  4 reserved    0
 */
#define PROTO_MODEL_SIZE 64
/* flags: the daemon reads experts ahead on HINT, so the engine should send
 * them; without it (stratad --no-lookahead), a HINT is only scored and the
 * engine need not compute its guess */
#define PROTO_MODEL_HINTS 1u

/* SLOTS payload (0 bytes), with one fd: the memfd of the streaming slots,
 * slots_size bytes, mapped by REMAP only. */

/*
 * REMAP payload (8 + 24 * n bytes, n >= 1):
 *    0  4 seq         echoed by REMAPPED
 *    4  4 n           ranges
 *    8  24 * n        off, len, from: map [base + off, base + off + len) again,
 *                     from the slots memfd at `from`, or, with from =
 *                     PROTO_FROM_MODEL, from the model's memfd at off; page
 *                     aligned, inside the model and the slots
 */
#define PROTO_REMAP_FIXED 8
#define PROTO_REMAP_RANGE 24
#define PROTO_REMAP_MAX 64
#define PROTO_FROM_MODEL UINT64_MAX

/* REMAPPED payload (4 bytes): seq of the REMAP done. */
#define PROTO_REMAPPED_SIZE 4

/*
 * REGISTER payload (16 bytes), with one fd: the client's userfaultfd, already
 * registered over [base, base + length) for MISSING | MINOR.
 *    0  8 base
 *    8  8 length      must equal map_size
 */
#define PROTO_REGISTER_SIZE 16

/* READY payload (8 bytes):
 *    0  4 resident_units  units mapped into the client up front
 *    4  4 reserved */
#define PROTO_READY_SIZE 8

/* STATUS_REQ payload (4 bytes): 0 = text, 1 = JSON.
 * STATUS payload: that text, not NUL-terminated. */
#define PROTO_STATUS_REQ_SIZE 4

/* DECLARE payload (16 bytes):
 *    0  8 declared_bytes  replaces the value from HELLO
 *    8  8 kv_bytes        of which its KV cache (shown in the status) */
#define PROTO_DECLARE_SIZE 16

/* PASS payload (32 + 4 * n_layers bytes):
 *    0  4 tokens      one-token decode passes timed (the predictor's)
 *    4  4 n_layers    0, or the model's layer count
 *    8  8 wall_ns     those passes' wall time, waiting on faults included
 *   16  4 outside_us  the engine's CPU time in them outside the layers
 *   20  4 passes      every decode pass since the last PASS, speculative
 *                     ones (several positions) included
 *   24  4 produced    the tokens those passes produced
 *   28  4 reserved    0
 *   32  4 each        per layer, the engine's CPU time in it, microseconds */
#define PROTO_PASS_FIXED 32

/* ROUTE payload (8 + 4 * n bytes, 1 <= n <= PROTO_ROUTE_MAX):
 *    0  4 layer       the layer about to read its experts
 *    4  4 n           experts
 *    8  4 each        expert index, each < the model's experts per layer,
 *                     each once.  Sent only for a model with expert units. */
#define PROTO_ROUTE_FIXED 8
#define PROTO_ROUTE_MAX 1024

/* HINT payload: as ROUTE's (the same checks), the experts the layer will
 * likely route to, guessed before its router ran.  Nothing is pinned beyond
 * the client's next ROUTE; decoded into u.route. */

/* ERROR payload (>= 4 bytes):
 *    0  4 errno   positive errno value
 *    4  ...       message, UTF-8, not NUL-terminated */

struct proto_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint32_t length;
	uint32_t reserved;
};
_Static_assert(sizeof(struct proto_hdr) == PROTO_HDR_SIZE, "wire header");

/* One message as proto_decode() found it: the header's type and length, the
 * payload (pointing into the caller's buffer) and its fields by type. */
struct proto_msg {
	uint16_t type;
	uint32_t len;
	const uint8_t *pl;
	union {
		struct { uint32_t role, name_len; uint64_t declared; const char *name; } hello;
		struct {
			uint64_t file_size, map_size, model_id, slots_size, engine_room, engine_limit;
			uint32_t n_units, page_size, flags;
		} model;
		struct { uint64_t base, length; } reg;
		struct { uint32_t resident_units; } ready;
		struct { bool json; } status_req;
		struct { int err; const char *text; uint32_t text_len; } error;
		struct { uint64_t declared_bytes, kv_bytes; } declare;
		struct { uint32_t seq, n; } remap;
		struct { uint32_t seq; } remapped;
		struct {
			uint32_t tokens, n_layers, outside_us, passes, produced;
			uint64_t wall_ns;
			const uint8_t *layer_us; /* n_layers u32 */
		} pass;
		struct {
			uint32_t layer, n;
			const uint8_t *experts; /* n u32 */
		} route;
	} u;
};

/* One range of a REMAP. */
struct proto_range {
	uint64_t off, len, from;
};

/*
 * Check the n bytes of one received datagram (proto.c): header, known type,
 * the payload's size for its type, the lengths and counts it carries.  0 and
 * *m filled, or -EPROTO with a reason for the log in *why.  Which message may
 * come when, and the file descriptors, are the caller's to check.
 */
int proto_decode(const uint8_t *buf, size_t n, struct proto_msg *m, const char **why);
/* Range i (< u.remap.n) of a decoded REMAP. */
void proto_remap_range(const struct proto_msg *m, uint32_t i, struct proto_range *r);
/* Whether a REMAP range lies inside a mapping of map_size bytes and, unless it
 * is from the model, the slots memfd of slots_size bytes; page aligned. */
bool proto_range_ok(const struct proto_range *r, uint64_t map_size, uint64_t slots_size,
		    uint64_t page);
/* Whether a MODEL's file and map sizes are possible with this page size. */
bool proto_model_ok(uint64_t file_size, uint64_t map_size, uint64_t page);

/* Send one message (header + payload, and pass_fd unless it is -1) without
 * blocking; 0 or -EIO. */
int proto_send(int fd, uint16_t type, const void *payload, uint32_t len, int pass_fd);

static inline uint64_t proto_get_u64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static inline uint32_t proto_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void proto_put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline void proto_put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

#endif
