/* A minimal strict JSON reader (eval_json.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dquant/error.h"
#include "eval_data.h"
#include "eval_json.h"

typedef struct json_parser {
    const char *s;
    size_t len, pos;
    char *err;
    size_t errlen;
    int rc;
} json_parser;

static int fail(json_parser *p, const char *why)
{
    if (p->rc == DQ_OK)
        p->rc = eval_fail(p->err, p->errlen, DQ_CORRUPT, "JSON: %s at byte %zu", why, p->pos);
    return p->rc;
}

static void skip_ws(json_parser *p)
{
    while (p->pos < p->len &&
           (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

static int literal(json_parser *p, const char *word)
{
    const size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0)
        return fail(p, "unexpected character");
    p->pos += n;
    return DQ_OK;
}

static int hex4(json_parser *p, uint32_t *out)
{
    if (p->len - p->pos < 4)
        return fail(p, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        const char c = p->s[p->pos++];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return fail(p, "bad \\u escape");
    }
    *out = v;
    return DQ_OK;
}

/* A string at p->pos (the opening quote), decoded into a new buffer. */
static int parse_string(json_parser *p, char **out, size_t *outlen)
{
    p->pos++; /* the quote */
    /* decoded text is never longer than the source */
    size_t end = p->pos;
    while (end < p->len && p->s[end] != '"')
        end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->len)
        return fail(p, "unterminated string");
    char *buf = malloc(end - p->pos + 1);
    if (!buf)
        return p->rc = DQ_NOMEM;
    size_t n = 0;
    while (p->s[p->pos] != '"') {
        const unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) {
            free(buf);
            return fail(p, "control character in string");
        }
        if (c != '\\') {
            buf[n++] = (char)c;
            p->pos++;
            continue;
        }
        p->pos++;
        const char e = p->s[p->pos++];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            buf[n++] = map[simple - "\"\\/bfnrt"];
            continue;
        }
        if (e != 'u') {
            free(buf);
            return fail(p, "bad escape");
        }
        uint32_t cp;
        if (hex4(p, &cp) != DQ_OK)
            goto bad;
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail(p, "unpaired low surrogate");
            goto bad;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t lo;
            if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                fail(p, "unpaired high surrogate");
                goto bad;
            }
            p->pos += 2;
            if (hex4(p, &lo) != DQ_OK)
                goto bad;
            if (lo < 0xDC00 || lo > 0xDFFF) {
                fail(p, "unpaired high surrogate");
                goto bad;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        if (cp == 0) {
            fail(p, "\\u0000 in string");
            goto bad;
        }
        /* \uXXXX is 6 source bytes, its UTF-8 at most 4 (a pair: 12 → 4) */
        if (cp < 0x80) {
            buf[n++] = (char)cp;
        } else if (cp < 0x800) {
            buf[n++] = (char)(0xC0 | (cp >> 6));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            buf[n++] = (char)(0xE0 | (cp >> 12));
            buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            buf[n++] = (char)(0xF0 | (cp >> 18));
            buf[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    p->pos++; /* the closing quote */
    buf[n] = 0;
    *out = buf;
    *outlen = n;
    return DQ_OK;
bad:
    free(buf);
    return p->rc;
}

static int parse_number(json_parser *p, double *out)
{
    const size_t start = p->pos;
    size_t i = p->pos;
    if (i < p->len && p->s[i] == '-')
        i++;
    if (i >= p->len || p->s[i] < '0' || p->s[i] > '9')
        return fail(p, "bad number");
    if (p->s[i] == '0')
        i++;
    else
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
            i++;
    if (i < p->len && p->s[i] == '.') {
        i++;
        if (i >= p->len || p->s[i] < '0' || p->s[i] > '9')
            return fail(p, "bad fraction");
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
            i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        i++;
        if (i < p->len && (p->s[i] == '+' || p->s[i] == '-'))
            i++;
        if (i >= p->len || p->s[i] < '0' || p->s[i] > '9')
            return fail(p, "bad exponent");
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9')
            i++;
    }
    char tmp[64];
    if (i - start >= sizeof tmp)
        return fail(p, "number too long");
    memcpy(tmp, p->s + start, i - start);
    tmp[i - start] = 0;
    *out = strtod(tmp, NULL);
    if (!isfinite(*out))
        return fail(p, "number out of range");
    p->pos = i;
    return DQ_OK;
}

static int append(json_parser *p, eval_json *j, char *key, eval_json *item)
{
    if ((j->len & (j->len - 1)) == 0) { /* grow at powers of two */
        const size_t cap = j->len ? 2 * j->len : 1;
        eval_json **items = realloc(j->items, cap * sizeof *items);
        if (items)
            j->items = items;
        char **keys = j->type == EVAL_JSON_OBJECT ? realloc(j->keys, cap * sizeof *keys) : NULL;
        if (keys)
            j->keys = keys;
        if (!items || (j->type == EVAL_JSON_OBJECT && !keys)) {
            free(key);
            eval_json_free(item);
            return p->rc = DQ_NOMEM;
        }
    }
    if (key)
        j->keys[j->len] = key;
    j->items[j->len++] = item;
    return DQ_OK;
}

static int parse_value(json_parser *p, int depth, eval_json **out)
{
    skip_ws(p);
    if (p->pos >= p->len)
        return fail(p, "unexpected end");
    if (depth > EVAL_JSON_MAX_DEPTH)
        return fail(p, "nested too deeply");
    eval_json *j = calloc(1, sizeof *j);
    if (!j)
        return p->rc = DQ_NOMEM;
    *out = j;
    const char c = p->s[p->pos];
    if (c == 'n') {
        j->type = EVAL_JSON_NULL;
        return literal(p, "null");
    }
    if (c == 't' || c == 'f') {
        j->type = EVAL_JSON_BOOL;
        j->boolean = c == 't';
        return literal(p, c == 't' ? "true" : "false");
    }
    if (c == '"') {
        j->type = EVAL_JSON_STRING;
        return parse_string(p, &j->str, &j->len);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        j->type = EVAL_JSON_NUMBER;
        return parse_number(p, &j->number);
    }
    if (c != '[' && c != '{')
        return fail(p, "unexpected character");
    const int object = c == '{';
    j->type = object ? EVAL_JSON_OBJECT : EVAL_JSON_ARRAY;
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == (object ? '}' : ']')) {
        p->pos++;
        return DQ_OK;
    }
    for (;;) {
        char *key = NULL;
        size_t klen;
        if (object) {
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != '"')
                return fail(p, "expected a member name");
            if (parse_string(p, &key, &klen) != DQ_OK)
                return p->rc;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') {
                free(key);
                return fail(p, "expected ':'");
            }
            p->pos++;
        }
        eval_json *item = NULL;
        if (parse_value(p, depth + 1, &item) != DQ_OK) {
            free(key);
            eval_json_free(item);
            return p->rc;
        }
        if (append(p, j, key, item) != DQ_OK)
            return p->rc;
        skip_ws(p);
        if (p->pos >= p->len)
            return fail(p, "unexpected end");
        if (p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->s[p->pos] != (object ? '}' : ']'))
            return fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
        p->pos++;
        return DQ_OK;
    }
}

int eval_json_parse(const char *text, size_t len, eval_json **out, char *err, size_t errlen)
{
    json_parser p = {.s = text, .len = len, .err = err, .errlen = errlen, .rc = DQ_OK};
    eval_json *j = NULL;
    *out = NULL;
    if (parse_value(&p, 0, &j) == DQ_OK) {
        skip_ws(&p);
        if (p.pos != p.len)
            fail(&p, "trailing characters");
    }
    if (p.rc != DQ_OK) {
        if (p.rc == DQ_NOMEM)
            eval_fail(err, errlen, DQ_NOMEM, "JSON: out of memory");
        eval_json_free(j);
        return p.rc;
    }
    *out = j;
    return DQ_OK;
}

void eval_json_free(eval_json *j)
{
    if (!j)
        return;
    for (size_t i = 0; i < j->len && j->items; i++) {
        eval_json_free(j->items[i]);
        if (j->keys)
            free(j->keys[i]);
    }
    free(j->items);
    free(j->keys);
    free(j->str);
    free(j);
}

const eval_json *eval_json_get(const eval_json *obj, const char *key)
{
    const eval_json *found = NULL;
    if (obj && obj->type == EVAL_JSON_OBJECT)
        for (size_t i = 0; i < obj->len; i++)
            if (strcmp(obj->keys[i], key) == 0)
                found = obj->items[i];
    return found;
}

int eval_json_u64(const eval_json *obj, const char *key, uint64_t *out)
{
    const eval_json *v = eval_json_get(obj, key);
    if (!v || v->type != EVAL_JSON_NUMBER || v->number < 0 || v->number > 9007199254740992.0 ||
        v->number != floor(v->number))
        return -1;
    *out = (uint64_t)v->number;
    return 0;
}
