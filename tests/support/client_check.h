/* Criterion checks of libdquant-client calls, shared by the tests that drive a real dquantd
 * through the client (tests/client): OK and FAILS name the call, its code and the client's last
 * message; stat_counter and stat_gauge read one STATS value or fail the test. */
#ifndef DQTEST_CLIENT_CHECK_H
#define DQTEST_CLIENT_CHECK_H

#include <criterion/criterion.h>
#include <stdint.h>

#include "dquant/client.h"

#define OK(c, expr)                                                                                       \
    do {                                                                                                  \
        int ok_rc_ = (expr);                                                                              \
        cr_assert_eq(ok_rc_, 0, "%s -> %s: %s", #expr, dqc_err_name(ok_rc_), c ? dqc_last_error(c) : ""); \
    } while (0)

#define FAILS(c, want, expr)                                                                                      \
    do {                                                                                                          \
        int f_rc_ = (expr);                                                                                       \
        cr_assert_eq(f_rc_, (want), "%s -> %s (expected %s): %s", #expr, dqc_err_name(f_rc_), dqc_err_name(want), \
                     dqc_last_error(c));                                                                          \
    } while (0)

static inline uint64_t stat_counter(dqc_client *c, const char *name)
{
    dqc_stats_result s = {0};
    OK(c, dqc_stats(c, &s));
    uint64_t v = 0;
    cr_assert_eq(dqc_stats_counter(&s, name, &v), 0, "no counter %s", name);
    dqc_stats_result_free(&s);
    return v;
}

static inline double stat_gauge(dqc_client *c, const char *name)
{
    dqc_stats_result s = {0};
    OK(c, dqc_stats(c, &s));
    double v = 0;
    cr_assert_eq(dqc_stats_gauge(&s, name, &v), 0, "no gauge %s", name);
    dqc_stats_result_free(&s);
    return v;
}

#endif
