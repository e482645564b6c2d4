/*
 * repack.h - Q4_0 matrices of a GGUF image to Q4_0_R16, in place.
 *
 * The offline step behind tools/strata-repack (the engine itself never
 * repacks: its memory is the file's pages).  Q4_0_R16 (quant.h) has Q4_0's
 * sizes, so a repacked model is the same bytes count with the same offsets:
 * the repackable tensors' type fields rewritten and their data reordered.
 * Repackable: 2-D Q4_0 with a multiple of 16 rows, not token_embd.weight
 * (read one row at a time).
 */
#ifndef STRATA_REPACK_H
#define STRATA_REPACK_H

#include "engine.h"
#include "gguf.h"

#include <stddef.h>
#include <stdint.h>

/* eng_n_repackable() is in engine.h */

/* Repack the len-byte GGUF image at img where it lies.  Returns 0 and
 * *n_tensors, *n_bytes (0 if nothing was repackable), or -EINVAL/-ENOTSUP/
 * -ENOMEM with a one-line reason in err (the image is then unchanged, or,
 * after -ENOMEM, partly repacked: the caller discards it). */
int eng_repack_r16(uint8_t *img, size_t len, uint64_t *n_tensors, uint64_t *n_bytes, char *err,
		   size_t errlen);

#endif
