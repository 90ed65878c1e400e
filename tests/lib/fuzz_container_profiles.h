/* The profiles the container fuzzer decodes against, shared with its corpus generator: the first
 * input byte picks one (bits 0-6, modulo the count) and the kind (bit 7). */
#ifndef FUZZ_CONTAINER_PROFILES_H
#define FUZZ_CONTAINER_PROFILES_H

#include "dquant/dquant.h"

#define FUZZ_NPROFILES 6

static inline int fuzz_profile(int i, dq_profile *out)
{
    static const struct {
        const char *builtin;
        uint32_t kv_heads, head_dim, C[2], M[2];
    } t[FUZZ_NPROFILES] = {
        {"dq226", 8, 128, {0, 0}, {0, 0}}, {"dq196", 8, 128, {0, 0}, {0, 0}}, {"dq226", 2, 128, {0, 0}, {0, 0}},
        {"dq196", 1, 16, {0, 0}, {0, 0}},  {NULL, 1, 2, {6, 6}, {8, 6}},      {NULL, 4, 16, {40, 12}, {32, 2}},
    };
    if (t[i].builtin)
        return dq_profile_builtin(t[i].builtin, t[i].kv_heads, t[i].head_dim, out);
    dq_profile_params pp;
    dq_profile_params_default(&pp);
    pp.kv_heads = t[i].kv_heads;
    pp.head_dim = t[i].head_dim;
    pp.container_bytes[0] = t[i].C[0];
    pp.container_bytes[1] = t[i].C[1];
    pp.levels[0] = t[i].M[0];
    pp.levels[1] = t[i].M[1];
    pp.name = "fuzz";
    return dq_profile_make(&pp, out);
}

#endif
