/* Host emulation of the version-2 device code (rans2_cuda.cuh with rans_cuda.cuh's reader, the
 * codec's table repack, the encoder's pair_argmin) against libdquant. */
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include "rans2_cuda.cuh"
#include "dquant/profile.h"
#include "dquant/codec.h"
extern "C" {
#include "drift.h"
}
#include "extract_codec.inc"
#include "extract_argmin.inc"
#include "extract_pair_assign.inc"

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd()
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)rs;
}
static double unif()
{
    return (rnd() >> 8) / 16777216.0;
}
static double normal()
{
    double u = unif() + 1e-12, v = unif();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static long checks, fails;
static void ck(bool ok, const char *what, int a, int b)
{
    checks++;
    if (!ok && fails++ < 20)
        printf("FAIL %s (%d %d)\n", what, a, b);
}

/* the kernel's decode of one container (decompress/transcode): levels, verdict */
static bool dev_decode(const dqcu_dtab &dt, const uint8_t *cont, uint32_t C, uint32_t n, uint8_t *lev)
{
    dqcu_rans_in in;
    uint32_t x = dqcu_rans_open(in, cont, C);
    const bool valid = x >= DQCU_RANS_L && x < (DQCU_RANS_L << 8);
    for (uint32_t j = 0; j < n; j += 4) {
        const uint32_t q = valid ? dqcu_dec_quad<true>(x, dt, in) : 0u;
        memcpy(lev + j, &q, 4);
    }
    return dqcu_dec_bad(valid, x, in, cont, C);
}

static void run(const dq_profile *p, int trials)
{
    dq_codec *c;
    if (dq_codec_create(p, NULL, &c)) {
        printf("codec\n");
        exit(2);
    }
    const uint32_t n = c->n;
    for (int k = 0; k < 2; k++) {
        const dq__kind_tables *kt = &c->kt[k];
        const uint32_t M = kt->levels, C = kt->container;
        static dqcu_rans2_kind t;
        kind_tab2(kt, &t);
        static unsigned char smem[DQCU_RANS2_TOTAL * 6];
        dqcu_kind_tab dummy;
        const dqcu_dtab dt = dqcu_dec_stage(true, smem, dummy, &t);
        std::vector<uint8_t> lev(n), got(n), ref(n), scratch(n);
        for (int tr = 0; tr < trials; tr++) {
            /* levels: from f (fits mostly) or uniform */
            const bool uni = tr % 4 == 3;
            for (uint32_t i = 0; i < n; i++) {
                if (uni) {
                    lev[i] = (uint8_t)(rnd() % M);
                    continue;
                }
                uint32_t z = rnd() % 256, m = 0, cum = 0;
                while (cum + p->freq[k][m] <= z) {
                    cum += p->freq[k][m];
                    m++;
                }
                lev[i] = (uint8_t)m;
            }
            const uint32_t off = rnd() % 4;
            /* exact-size buffer: 4 bytes of s/o before the container (ASan sees reads past it) */
            uint8_t *buf = (uint8_t *)malloc(off + 4 + C);
            uint8_t *rec = buf + off, *cont = rec + 4;
            for (uint32_t i = 0; i < off + 4; i++)
                buf[i] = (uint8_t)rnd();
            const uint32_t used = dq__rans2_encode(&kt->enc2, lev.data(), n, scratch.data(), cont, C);
            if (used <= C) {
                /* the device encoder step: same container */
                std::vector<uint8_t> em;
                uint32_t x = DQCU_RANS_L;
                uint8_t b2[2];
                for (uint32_t i = n / 2; i-- > 0;) {
                    uint32_t kk = dqcu_enc_step(x, t.enc[lev[2 * i] * M + lev[2 * i + 1]], b2);
                    for (uint32_t j = 0; j < kk; j++)
                        em.push_back(b2[j]);
                }
                bool same = 4 + em.size() == used && cont[0] == (uint8_t)x && cont[1] == (uint8_t)(x >> 8) &&
                            cont[2] == (uint8_t)(x >> 16) && cont[3] == (uint8_t)(x >> 24);
                for (size_t j = 0; same && j < em.size(); j++)
                    same = cont[4 + j] == em[em.size() - 1 - j];
                ck(same, "encode", tr, k);
                /* the encoder kernel's in-place pass over a level row */
                std::vector<uint8_t> row(lev);
                uint32_t pp = 0;
                const uint32_t st = rans2_row(t, M, row.data(), n, &pp);
                ck(st == x && n - pp == em.size() && memcmp(row.data() + pp, cont + 4, n - pp) == 0, "rans2_row", tr,
                   k);
            }
            /* corruptions after the valid ones */
            const int mode = tr % 6;
            if (used > C || mode == 1) {
                for (uint32_t i = 0; i < C; i++)
                    cont[i] = (uint8_t)rnd();
            } else if (mode == 2) {
                cont[rnd() % C] ^= (uint8_t)(1u << (rnd() % 8));
            } else if (mode == 3) {
                cont[C - 1] ^= 0x5a;
            } else if (mode == 4) {
                for (uint32_t i = 4 + rnd() % (C - 4); i < C; i++)
                    cont[i] = 0;
            }
            const int rc = dq__rans2_decode(&kt->dec2, cont, C, n, ref.data());
            const bool bad = dev_decode(dt, cont, C, n, got.data());
            ck(bad == (rc != 0), "verdict", rc, bad);
            ck(memcmp(got.data(), ref.data(), n) == 0, "levels", mode, k);
            free(buf);
        }
        /* pair_argmin vs lib's pair_assign */
        std::vector<float> xs(n);
        std::vector<uint8_t> la(n);
        for (int tr = 0; tr < trials / 4; tr++) {
            const double sig = pow(10.0, -2 + 3 * unif());
            for (uint32_t i = 0; i < n; i++)
                xs[i] = (float)(sig * normal());
            if (tr % 5 == 0)
                for (uint32_t i = 0; i < n; i += 3)
                    xs[i] = xs[i / 2]; /* ties */
            float mn = xs[0], mx = xs[0];
            for (float v : xs) {
                mn = v < mn ? v : mn;
                mx = v > mx ? v : mx;
            }
            const float s = (mx - mn) / (float)(M - 1), o = mn;
            const float lam = (float)(sig * sig * pow(2.0, -12 + 16 * unif()));
            const int64_t cost = pair_assign(kt, xs.data(), n, s, o, lam, la.data());
            float lrmin = INFINITY;
            for (uint32_t q = 0; q < M * M; q++)
                lrmin = fminf(lrmin, lam * t.cost[q]);
            int64_t mc = 0;
            bool same = true;
            for (uint32_t i = 0; i < n; i += 2) {
                const uint32_t arg = pair_argmin(t, M, s, o, lam, lrmin, xs[i], xs[i + 1]);
                mc += t.cost_q16[arg];
                same &= arg / M == la[i] && arg % M == la[i + 1];
            }
            ck(same && mc == cost, "pair_argmin", tr, k);
        }
        printf("%s kind %d: M=%u C=%u n=%u\n", p->name, k, M, C, n);
    }
    dq_codec_free(c);
}

int main(void)
{
    dq_profile p;
    const char *names[] = {"dq226p", "dq196p"};
    const uint32_t shapes[][2] = {{8, 128}, {2, 128}, {1, 32}};
    for (auto nm : names)
        for (auto &sh : shapes) {
            if (dq_profile_builtin(nm, sh[0], sh[1], &p)) {
                printf("builtin %s\n", nm);
                return 2;
            }
            run(&p, 400);
        }
    for (int r = 0; r < 12; r++) {
        dq_profile_params pp;
        dq_profile_params_default(&pp);
        pp.kv_heads = 1 + rnd() % 4;
        pp.head_dim = 32u << (rnd() % 3);
        pp.levels[0] = 2 + rnd() % 31;
        pp.levels[1] = 2 + rnd() % 31;
        pp.format_version = DQ_FORMAT_VERSION_PAIRS;
        const double nn = (double)pp.kv_heads * pp.head_dim;
        for (int k = 0; k < 2; k++)
            pp.container_bytes[k] = (uint32_t)((0.3 + 4 * unif()) * nn / 8 + 8);
        int rc;
        for (int t = 0; (rc = dq_profile_make(&pp, &p)) == DQ_CONTAINER_TOO_SMALL && t < 10000; t++)
            for (int k = 0; k < 2; k++)
                pp.container_bytes[k] += 1 + pp.container_bytes[k] / 64;
        if (rc) {
            printf("make %d\n", rc);
            return 2;
        }
        run(&p, 200);
    }
    printf("emulation: %ld checks, %ld failed\n", checks, fails);
    return fails != 0;
}
