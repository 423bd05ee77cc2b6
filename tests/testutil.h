/* Minimal test harness: seeded RNG (seed printed, override with QL_TEST_SEED),
 * checks that count and report, and a closing "N passed, N failed" line. */
#ifndef QL_TESTUTIL_H
#define QL_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>

#include "qlinear.h"

extern int tu_passed, tu_failed;
extern uint64_t tu_seed;

void tu_init(const char *name);  /* picks and prints the seed */
int tu_finish(void);             /* prints the summary; returns the exit code */
uint64_t tu_next(void);          /* 64 random bits */
double tu_uniform(void);         /* [0, 1) */
double tu_gauss(void);           /* N(0, 1) */
int64_t tu_range(int64_t lo, int64_t hi); /* [lo, hi] */
void tu_fill_gauss(ql_dtype dt, void *p, int64_t n, double sigma);
void tu_check(int ok, const char *file, int line, const char *fmt, ...);

/* The ISAs this CPU runs, the generic one first, then from the oldest up
 * (the registry's order reversed): walk it instead of listing ISAs, so a
 * new ISA is tested without a test edit. Returns the count (<= 32). */
int tu_isas(ql_isa out[32]);

#define CHECK(cond, ...) tu_check(!!(cond), __FILE__, __LINE__, __VA_ARGS__)
#define CHECK_OK(expr) do { ql_status s_ = (expr); tu_check(s_ == QL_OK, __FILE__, __LINE__, "%s -> %s: %s", #expr, ql_status_string(s_), ql_last_error()); } while (0)

#endif
