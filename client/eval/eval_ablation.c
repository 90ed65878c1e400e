/* Ablation configurations and drift statistics (eval_ablation.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/error.h"
#include "eval_ablation.h"

/* dq226 at n = 1024 */
static const uint32_t g_c1024[2] = {331, 231};
static const uint32_t g_levels[2] = {8, 6};
#define DQ226_ALPHA 1.4f
#define SPLIT_TOTAL 562u

static void add_row(eval_ablation_row *row, const char *panel, uint32_t kv_heads, uint32_t head_dim,
                    const uint32_t c1024[2], double scale, const uint32_t levels[2], float alpha, const char *label)
{
    memset(row, 0, sizeof *row);
    snprintf(row->panel, sizeof row->panel, "%s", panel);
    snprintf(row->codec.label, sizeof row->codec.label, "%s", label);
    row->rc = eval_dq_profile(kv_heads, head_dim, c1024, scale, levels, alpha, label, &row->codec.profile);
    eval_dq_containers(kv_heads, head_dim, c1024, scale, row->containers);
    row->levels[0] = levels[0];
    row->levels[1] = levels[1];
    row->alpha = alpha;
}

int eval_ablation_rows(const char *which, uint32_t kv_heads, uint32_t head_dim, eval_ablation_row **rows, size_t *count)
{
    *rows = NULL;
    *count = 0;
    eval_ablation_row *r = calloc(32, sizeof *r);
    if (!r)
        return DQ_NOMEM;
    size_t c = 0;
    char label[EVAL_LABEL_MAX];
    if (strcmp(which, "levels") == 0) {
        for (uint32_t mk = 4; mk <= 12; mk++) {
            const uint32_t lv[2] = {mk, g_levels[1]};
            snprintf(label, sizeof label, "M %u/%u", lv[0], lv[1]);
            add_row(&r[c++], "levels K", kv_heads, head_dim, g_c1024, 1.0, lv, DQ226_ALPHA, label);
        }
        for (uint32_t mv = 3; mv <= 10; mv++) {
            const uint32_t lv[2] = {g_levels[0], mv};
            snprintf(label, sizeof label, "M %u/%u", lv[0], lv[1]);
            add_row(&r[c++], "levels V", kv_heads, head_dim, g_c1024, 1.0, lv, DQ226_ALPHA, label);
        }
    } else if (strcmp(which, "budget") == 0) {
        for (int i = 7; i <= 15; i++) {
            snprintf(label, sizeof label, "x%.1f", i / 10.0);
            add_row(&r[c++], "budget", kv_heads, head_dim, g_c1024, i / 10.0, g_levels, DQ226_ALPHA, label);
        }
    } else if (strcmp(which, "split") == 0) {
        for (uint32_t ck = 231; ck <= 431; ck += 25) {
            const uint32_t c1024[2] = {ck, SPLIT_TOTAL - ck};
            snprintf(label, sizeof label, "K%u/V%u", c1024[0], c1024[1]);
            add_row(&r[c++], "split", kv_heads, head_dim, c1024, 1.0, g_levels, DQ226_ALPHA, label);
        }
    } else if (strcmp(which, "alpha") == 0) {
        for (int i = 10; i <= 20; i++) {
            snprintf(label, sizeof label, "alpha %.1f", i / 10.0);
            add_row(&r[c++], "alpha", kv_heads, head_dim, g_c1024, 1.0, g_levels, (float)(i / 10.0), label);
        }
    } else {
        free(r);
        return DQ_INVALID_ARGUMENT;
    }
    *rows = r;
    *count = c;
    return DQ_OK;
}

int eval_drift_summary(const eval_result *r, const dq_profile *p, dq_kind kind, eval_drift *out)
{
    memset(out, 0, sizeof *out);
    if (p->codec_type != DQ_CODEC_DQUANT || !r->streams[kind])
        return DQ_INVALID_ARGUMENT;
    const uint32_t M = p->levels[kind], n = p->kv_heads * p->head_dim;
    double model[DQ_MAX_LEVELS];
    int rc = dq_model_probabilities(n, M, model);
    if (rc != DQ_OK)
        return rc;
    uint64_t total = 0;
    for (uint32_t m = 0; m < DQ_MAX_LEVELS; m++)
        total += r->hist[kind][m];
    if (!total)
        return DQ_INVALID_ARGUMENT;
    double h = 0, ce_table = 0, ce_model = 0;
    for (uint32_t m = 0; m < M; m++) {
        if (!r->hist[kind][m])
            continue;
        const double q = (double)r->hist[kind][m] / (double)total;
        h -= q * log2(q);
        ce_table -= q * log2(p->freq[kind][m] / 256.0);
        ce_model -= q * log2(model[m]);
    }
    out->levels = M;
    out->container = p->container_bytes[kind];
    out->moved_fraction = (double)r->symbols_moved[kind] / (double)total;
    out->max_move = r->max_move[kind];
    out->retries = r->retries[kind];
    out->fallbacks = r->fallbacks[kind];
    out->fill = (double)r->payload_bytes[kind] / ((double)r->streams[kind] * p->container_bytes[kind]);
    out->entropy = h;
    out->excess_table = ce_table - h;
    out->excess_model = ce_model - h;
    out->coding_gain = log2((double)M) - h;
    return DQ_OK;
}
