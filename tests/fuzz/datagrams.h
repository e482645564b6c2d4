/*
 * datagrams.h - the protocol harnesses' input: datagrams, each a u16
 * little-endian length and that many bytes (fewer at the end of the input).
 *
 * next_datagram() copies the next one to a heap buffer of exactly its size,
 * so that the sanitizers catch a read past it, and moves *at past it;
 * NULL when the input is used up.  The caller frees the buffer.
 */
#ifndef STRATA_FUZZ_DATAGRAMS_H
#define STRATA_FUZZ_DATAGRAMS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint8_t *next_datagram(const uint8_t *data, size_t size, size_t *at, size_t *len)
{
	size_t n;
	uint8_t *dg;

	if (*at + 2 > size)
		return NULL;
	n = (size_t)(data[*at] | data[*at + 1] << 8);
	*at += 2;
	if (n > size - *at)
		n = size - *at;
	dg = malloc(n ? n : 1);
	if (!dg)
		abort();
	memcpy(dg, data + *at, n);
	*at += n;
	*len = n;
	return dg;
}

#endif
