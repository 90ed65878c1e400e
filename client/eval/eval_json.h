/* dquant eval: a minimal strict JSON reader for the two files a model folder needs parsed —
 * config.json and the safetensors header. Not a general library: the whole text is parsed into a
 * tree of at most EVAL_JSON_MAX_DEPTH levels, every read is bounds-checked against the given length,
 * and anything that is not RFC 8259 JSON (trailing commas, comments, bare words, control characters
 * in strings, unpaired surrogates, trailing garbage) is rejected. */
#ifndef DQUANT_EVAL_JSON_H
#define DQUANT_EVAL_JSON_H

#include <stddef.h>
#include <stdint.h>

#define EVAL_JSON_MAX_DEPTH 32

typedef enum eval_json_type {
    EVAL_JSON_NULL,
    EVAL_JSON_BOOL,
    EVAL_JSON_NUMBER,
    EVAL_JSON_STRING,
    EVAL_JSON_ARRAY,
    EVAL_JSON_OBJECT,
} eval_json_type;

typedef struct eval_json eval_json;
struct eval_json {
    eval_json_type type;
    int boolean;
    double number;
    char *str;         /* STRING: the decoded UTF-8 text, NUL-terminated (len bytes, may contain no NUL) */
    size_t len;        /* STRING: bytes; ARRAY/OBJECT: members */
    char **keys;       /* OBJECT: member names (decoded) */
    eval_json **items; /* ARRAY/OBJECT: members */
};

/* Parses text[0..len). Returns 0 with *out (free with eval_json_free), or DQ_CORRUPT with the
 * byte offset and reason in err, or DQ_NOMEM. */
int eval_json_parse(const char *text, size_t len, eval_json **out, char *err, size_t errlen);
void eval_json_free(eval_json *j);

/* The member named key of an object (the last one when repeated), or NULL. */
const eval_json *eval_json_get(const eval_json *obj, const char *key);
/* A number member as a non-negative integer that fits in uint64 exactly: 0, or -1 when absent or
 * not such a number. */
int eval_json_u64(const eval_json *obj, const char *key, uint64_t *out);

#endif
