/*
 * check.h - the C tests' one assertion: CHECK(cond, fmt, ...) prints
 * "FAIL file:line: message" and counts the failure; main returns non-zero
 * when `failures` is.
 */
#ifndef STRATA_TESTS_CHECK_H
#define STRATA_TESTS_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                                  \
	do {                                                              \
		if (!(cond)) {                                            \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);       \
			printf(__VA_ARGS__);                              \
			printf("\n");                                     \
			failures++;                                       \
		}                                                         \
	} while (0)

#endif
