/*
 * The limits file: parser and writer of the text format defined in tessera_shim.h. The shim reads
 * it once per process; the driver writes it through the same code (cffi), so what one side
 * writes is exactly what the other accepts.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fail.h"
#include "tessera_shim.h"

/* A GPU UUID as drivers print it: a "GPU-" or "MIG-" prefix, then hex digits and dashes. */
static bool valid_uuid(const char *s, size_t n)
{
    if (n < 5 || n >= TESSERA_UUID_MAX)
        return false;
    if (strncmp(s, "GPU-", 4) != 0 && strncmp(s, "MIG-", 4) != 0)
        return false;
    for (size_t i = 4; i < n; i++) {
        char c = s[i];
        bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
        if (!hex && c != '-')
            return false;
    }
    return true;
}

/* A decimal unsigned integer with no sign, no leading zeros but "0", no overflow. */
static bool parse_u64(const char *s, size_t n, uint64_t *out)
{
    if (n == 0 || n > 20 || (n > 1 && s[0] == '0'))
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* Split `line` (length n) into at most `max` space/tab separated words. */
static int split(const char *line, size_t n, const char **words, size_t *lens, int max)
{
    int count = 0;
    size_t i = 0;
    while (i < n) {
        while (i < n && (line[i] == ' ' || line[i] == '\t'))
            i++;
        if (i == n)
            break;
        size_t start = i;
        while (i < n && line[i] != ' ' && line[i] != '\t')
            i++;
        if (count == max)
            return max + 1;
        words[count] = line + start;
        lens[count] = i - start;
        count++;
    }
    return count;
}

/* "key=value": the value of `key`, or NULL. */
static const char *value_of(const char *word, size_t n, const char *key, size_t *vlen)
{
    size_t k = strlen(key);
    if (n <= k + 1 || strncmp(word, key, k) != 0 || word[k] != '=')
        return NULL;
    *vlen = n - k - 1;
    return word + k + 1;
}

static int parse_gpu_line(const char **w, const size_t *l, int nwords, int lineno,
                          struct tessera_gpu_limit *g, char *err, size_t errlen)
{
    if (nwords != 3 && nwords != 4)
        return tessera_fail(err, errlen, "line %d: expected '<uuid> memory=<bytes|none> cores=<0-100> "
                     "[priority=<0|1>]'", lineno);
    if (!valid_uuid(w[0], l[0]))
        return tessera_fail(err, errlen, "line %d: '%.*s' is not a GPU UUID", lineno, (int)l[0], w[0]);
    memcpy(g->uuid, w[0], l[0]);
    g->uuid[l[0]] = '\0';

    size_t vlen = 0;
    const char *v = value_of(w[1], l[1], "memory", &vlen);
    if (v == NULL)
        return tessera_fail(err, errlen, "line %d: expected memory=<bytes|none>, got '%.*s'", lineno,
                     (int)l[1], w[1]);
    if (vlen == 4 && strncmp(v, "none", 4) == 0)
        g->memory_bytes = TESSERA_NO_MEMORY_LIMIT;
    else if (!parse_u64(v, vlen, &g->memory_bytes) || g->memory_bytes == TESSERA_NO_MEMORY_LIMIT)
        return tessera_fail(err, errlen, "line %d: memory must be a byte count or 'none', got '%.*s'",
                     lineno, (int)vlen, v);

    v = value_of(w[2], l[2], "cores", &vlen);
    uint64_t cores = 0;
    if (v == NULL)
        return tessera_fail(err, errlen, "line %d: expected cores=<0-100>, got '%.*s'", lineno, (int)l[2],
                     w[2]);
    if (!parse_u64(v, vlen, &cores) || cores > 100)
        return tessera_fail(err, errlen, "line %d: cores must be 0-100, got '%.*s'", lineno, (int)vlen, v);
    g->cores = (uint32_t)cores;

    /* Optional, so files written before priority existed still read: low, HAMi's default. */
    g->priority = TESSERA_PRIORITY_LOW;
    if (nwords == 3)
        return 0;
    v = value_of(w[3], l[3], "priority", &vlen);
    uint64_t priority = 0;
    if (v == NULL)
        return tessera_fail(err, errlen, "line %d: expected priority=<0|1>, got '%.*s'", lineno,
                     (int)l[3], w[3]);
    if (!parse_u64(v, vlen, &priority) || priority > TESSERA_PRIORITY_LOW)
        return tessera_fail(err, errlen, "line %d: priority must be 0 (high) or 1 (low), got '%.*s'",
                     lineno, (int)vlen, v);
    g->priority = (uint32_t)priority;
    return 0;
}

int tessera_limits_parse(const char *text, size_t len, struct tessera_limits *out, char *err,
                         size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (len > TESSERA_LIMITS_MAX_BYTES)
        return tessera_fail(err, errlen, "larger than %d bytes", TESSERA_LIMITS_MAX_BYTES);
    bool have_version = false;
    int lineno = 0;
    size_t pos = 0;
    while (pos < len) {
        const char *line = text + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t n = nl != NULL ? (size_t)(nl - line) : len - pos;
        pos += n + (nl != NULL ? 1 : 0);
        lineno++;
        if (n > 0 && line[n - 1] == '\r')
            n--;
        for (size_t i = 0; i < n; i++)
            if (line[i] == '\0' || (unsigned char)line[i] >= 0x80)
                return tessera_fail(err, errlen, "line %d: not ASCII text", lineno);
        const char *w[5];
        size_t l[5];
        int nwords = split(line, n, w, l, 4);
        if (nwords == 0 || w[0][0] == '#')
            continue;
        if (!have_version) {
            uint64_t version = 0;
            if (nwords != 2 || l[0] != 14 || strncmp(w[0], "tessera-limits", 14) != 0 ||
                !parse_u64(w[1], l[1], &version))
                return tessera_fail(err, errlen, "line %d: expected 'tessera-limits %d' first", lineno,
                             TESSERA_LIMITS_VERSION);
            if (version != TESSERA_LIMITS_VERSION)
                return tessera_fail(err, errlen, "line %d: format version %" PRIu64 " is not supported "
                             "(this shim reads version %d)", lineno, version,
                             TESSERA_LIMITS_VERSION);
            have_version = true;
            continue;
        }
        if (out->count == TESSERA_MAX_GPUS)
            return tessera_fail(err, errlen, "line %d: more than %d GPUs", lineno, TESSERA_MAX_GPUS);
        struct tessera_gpu_limit *g = &out->gpus[out->count];
        if (parse_gpu_line(w, l, nwords, lineno, g, err, errlen) != 0)
            return -1;
        for (uint32_t i = 0; i < out->count; i++)
            if (strcmp(out->gpus[i].uuid, g->uuid) == 0)
                return tessera_fail(err, errlen, "line %d: GPU %s listed twice", lineno, g->uuid);
        out->count++;
    }
    if (!have_version)
        return tessera_fail(err, errlen, "empty: expected 'tessera-limits %d'", TESSERA_LIMITS_VERSION);
    return 0;
}

int tessera_limits_read(const char *path, struct tessera_limits *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 1;
        return tessera_fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tessera_fail(err, errlen, "%s: not a regular file", path);
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
        close(fd);
        return tessera_fail(err, errlen, "%s: writable by group or others (mode %03o); limits must not "
                     "be changeable from inside the container", path, st.st_mode & 0777);
    }
    static const size_t cap = TESSERA_LIMITS_MAX_BYTES + 1;
    char buf[TESSERA_LIMITS_MAX_BYTES + 1];
    size_t len = 0;
    for (;;) {
        ssize_t got = read(fd, buf + len, cap - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            close(fd);
            return tessera_fail(err, errlen, "%s: cannot read: %s", path, strerror(e));
        }
        if (got == 0 || len + (size_t)got == cap) {
            len += (size_t)got;
            break;
        }
        len += (size_t)got;
    }
    close(fd);
    char why[256];
    if (tessera_limits_parse(buf, len, out, why, sizeof why) != 0)
        return tessera_fail(err, errlen, "%s: malformed: %s", path, why);
    return 0;
}

int tessera_limits_format(const struct tessera_limits *limits, char *buf, size_t buflen,
                          char *err, size_t errlen)
{
    if (limits->count > TESSERA_MAX_GPUS)
        return tessera_fail(err, errlen, "more than %d GPUs", TESSERA_MAX_GPUS);
    size_t pos = 0;
    int n = snprintf(buf, buflen, "# Tessera claim limits (format: shim/include/tessera_shim.h)\n"
                                  "tessera-limits %d\n", TESSERA_LIMITS_VERSION);
    if (n < 0 || (size_t)n >= buflen)
        return tessera_fail(err, errlen, "buffer too small");
    pos = (size_t)n;
    for (uint32_t i = 0; i < limits->count; i++) {
        const struct tessera_gpu_limit *g = &limits->gpus[i];
        size_t ulen = strnlen(g->uuid, TESSERA_UUID_MAX);
        if (!valid_uuid(g->uuid, ulen))
            return tessera_fail(err, errlen, "GPU %u: '%.*s' is not a GPU UUID", i, (int)ulen, g->uuid);
        if (g->cores > 100)
            return tessera_fail(err, errlen, "GPU %s: cores must be 0-100", g->uuid);
        if (g->priority > TESSERA_PRIORITY_LOW)
            return tessera_fail(err, errlen, "GPU %s: priority must be 0 (high) or 1 (low)", g->uuid);
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(limits->gpus[j].uuid, g->uuid) == 0)
                return tessera_fail(err, errlen, "GPU %s listed twice", g->uuid);
        char mem[24];
        if (g->memory_bytes == TESSERA_NO_MEMORY_LIMIT)
            snprintf(mem, sizeof mem, "none");
        else
            snprintf(mem, sizeof mem, "%" PRIu64, g->memory_bytes);
        n = snprintf(buf + pos, buflen - pos, "%s memory=%s cores=%u priority=%u\n", g->uuid, mem,
                     g->cores, g->priority);
        if (n < 0 || (size_t)n >= buflen - pos)
            return tessera_fail(err, errlen, "buffer too small");
        pos += (size_t)n;
    }
    return (int)pos;
}
