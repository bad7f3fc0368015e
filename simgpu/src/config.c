/* Parser for the simulated node's configuration file (format: docs/simgpu.md). */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum section { SEC_NONE, SEC_NODE, SEC_GPU, SEC_MIG, SEC_KERNELS };

struct parser {
    const char *path;
    int line;
    char *err;
    size_t errlen;
    struct sim_config *cfg;
    enum section section;
    bool node_seen;
    /* Which keys the current section has set, to reject duplicates and find missing ones. */
    char seen[32][32];
    int seen_count;
};

static int fail(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(struct parser *p, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->line > 0)
        snprintf(p->err, p->errlen, "%s:%d: %s", p->path, p->line, msg);
    else
        snprintf(p->err, p->errlen, "%s: %s", p->path, msg);
    return -1;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

static int parse_u64(struct parser *p, const char *key, const char *value, uint64_t min,
                     uint64_t max, uint64_t *out)
{
    if (value[0] == '\0' || value[0] == '-' || value[0] == '+')
        return fail(p, "%s: expected a non-negative integer, got '%s'", key, value);
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(value, &end, 0);
    if (errno != 0 || end == value || *end != '\0')
        return fail(p, "%s: expected a non-negative integer, got '%s'", key, value);
    if (v < min || v > max)
        return fail(p, "%s: %llu is outside [%llu, %llu]", key, v, (unsigned long long)min,
                    (unsigned long long)max);
    *out = v;
    return 0;
}

static int parse_uint(struct parser *p, const char *key, const char *value, uint64_t min,
                      uint64_t max, unsigned int *out)
{
    uint64_t v = 0;
    if (parse_u64(p, key, value, min, max, &v) != 0)
        return -1;
    *out = (unsigned int)v;
    return 0;
}

static int parse_bool(struct parser *p, const char *key, const char *value, bool *out)
{
    if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0) {
        *out = true;
        return 0;
    }
    if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0) {
        *out = false;
        return 0;
    }
    return fail(p, "%s: expected true or false, got '%s'", key, value);
}

static int copy_text(struct parser *p, const char *key, const char *value, char *dst, size_t cap)
{
    size_t n = strlen(value);
    if (n == 0)
        return fail(p, "%s: must not be empty", key);
    if (n >= cap)
        return fail(p, "%s: longer than %zu characters", key, cap - 1);
    memcpy(dst, value, n + 1);
    return 0;
}

int sim_parse_pci_bus_id(const char *text, unsigned int *domain, unsigned int *bus,
                         unsigned int *device, unsigned int *function)
{
    unsigned int d = 0, b = 0, dev = 0, f = 0;
    int consumed = 0;
    if (sscanf(text, "%x:%x:%x.%x%n", &d, &b, &dev, &f, &consumed) != 4 ||
        text[consumed] != '\0')
        return -1;
    const char *colon = strchr(text, ':');
    size_t domain_digits = (size_t)(colon - text);
    if ((domain_digits != 4 && domain_digits != 8) || b > 0xff || dev > 0x1f || f > 7)
        return -1;
    *domain = d;
    *bus = b;
    *device = dev;
    *function = f;
    return 0;
}

static const struct {
    const char *name;
    int value;
} brands[] = {
    {"quadro", 1}, {"tesla", 2}, {"nvs", 3}, {"geforce", 5},
    {"titan", 6},  {"nvidia_rtx", 13}, {"nvidia", 14},
};

static int parse_brand(struct parser *p, const char *value, int *out)
{
    for (size_t i = 0; i < sizeof brands / sizeof brands[0]; i++) {
        if (strcmp(value, brands[i].name) == 0) {
            *out = brands[i].value;
            return 0;
        }
    }
    return fail(p, "brand: unknown brand '%s' (quadro, tesla, nvs, geforce, titan, nvidia_rtx, "
                   "nvidia)", value);
}

static int mark_seen(struct parser *p, const char *key)
{
    for (int i = 0; i < p->seen_count; i++) {
        if (strcmp(p->seen[i], key) == 0)
            return fail(p, "duplicate key '%s'", key);
    }
    if (p->seen_count < (int)(sizeof p->seen / sizeof p->seen[0]) && strlen(key) < 32)
        strcpy(p->seen[p->seen_count++], key);
    return 0;
}

static bool was_seen(const struct parser *p, const char *key)
{
    for (int i = 0; i < p->seen_count; i++) {
        if (strcmp(p->seen[i], key) == 0)
            return true;
    }
    return false;
}

/* `prefix` ("GPU-" or "MIG-") and a canonical 8-4-4-4-12 hex UUID: CUDA reports the same 16
 * bytes in binary. */
static bool uuid_well_formed(const char *v, const char *prefix)
{
    if (strncmp(v, prefix, 4) != 0 || strlen(v) != 40)
        return false;
    for (int i = 4; i < 40; i++) {
        bool dash = i == 12 || i == 17 || i == 22 || i == 27;
        if (dash ? v[i] != '-' : !isxdigit((unsigned char)v[i]))
            return false;
    }
    return true;
}

static int node_key(struct parser *p, const char *key, const char *value)
{
    struct sim_config *c = p->cfg;
    uint64_t v = 0;
    if (strcmp(key, "state_file") == 0) {
        if (value[0] != '/')
            return fail(p, "state_file: must be an absolute path, got '%s'", value);
        return copy_text(p, key, value, c->state_file, sizeof c->state_file);
    }
    if (strcmp(key, "driver_version") == 0)
        return copy_text(p, key, value, c->driver_version, sizeof c->driver_version);
    if (strcmp(key, "cuda_driver_version") == 0) {
        if (parse_u64(p, key, value, 1000, 99990, &v) != 0)
            return -1;
        c->cuda_driver_version = (int)v;
        return 0;
    }
    if (strcmp(key, "util_window_ms") == 0) {
        if (parse_u64(p, key, value, 10, 60000, &v) != 0)
            return -1;
        c->util_window_ns = v * 1000000ULL;
        return 0;
    }
    if (strcmp(key, "default_kernel_ns") == 0)
        return parse_u64(p, key, value, 0, 3600ULL * 1000000000ULL, &c->default_kernel_ns);
    if (strcmp(key, "latency_us") == 0) {
        if (parse_u64(p, key, value, 0, 10000000, &v) != 0)
            return -1;
        c->latency_ns = v * 1000ULL;
        return 0;
    }
    return fail(p, "unknown key '%s' in [node]", key);
}

static int gpu_key(struct parser *p, const char *key, const char *value)
{
    struct sim_gpu_config *g = &p->cfg->gpus[p->cfg->gpu_count - 1];
    uint64_t v = 0;
    if (strcmp(key, "uuid") == 0) {
        if (!uuid_well_formed(value, "GPU-"))
            return fail(p, "uuid: expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex), "
                           "got '%s'", value);
        return copy_text(p, key, value, g->uuid, sizeof g->uuid);
    }
    if (strcmp(key, "name") == 0)
        return copy_text(p, key, value, g->name, sizeof g->name);
    if (strcmp(key, "memory_bytes") == 0)
        return parse_u64(p, key, value, 1, 1ULL << 50, &g->memory_bytes);
    if (strcmp(key, "sm_count") == 0) {
        if (parse_u64(p, key, value, 1, 1024, &v) != 0)
            return -1;
        g->sm_count = (int)v;
        return 0;
    }
    if (strcmp(key, "compute_capability") == 0) {
        unsigned int major = 0, minor = 0;
        int consumed = 0;
        if (sscanf(value, "%u.%u%n", &major, &minor, &consumed) != 2 || value[consumed] != '\0' ||
            major < 1 || major > 20 || minor > 9)
            return fail(p, "compute_capability: expected MAJOR.MINOR such as 9.0, got '%s'",
                        value);
        g->cc_major = (int)major;
        g->cc_minor = (int)minor;
        return 0;
    }
    if (strcmp(key, "pci_bus_id") == 0) {
        if (sim_parse_pci_bus_id(value, &g->pci_domain, &g->pci_bus, &g->pci_device,
                                 &g->pci_function) != 0)
            return fail(p, "pci_bus_id: expected DOMAIN:BUS:DEVICE.FUNCTION in hex such as "
                           "00000000:01:00.0, got '%s'", value);
        return 0;
    }
    if (strcmp(key, "pci_device_id") == 0)
        return parse_uint(p, key, value, 0, 0xffffffffu, &g->pci_device_id);
    if (strcmp(key, "pci_subsystem_id") == 0)
        return parse_uint(p, key, value, 0, 0xffffffffu, &g->pci_subsystem_id);
    if (strcmp(key, "minor") == 0)
        return parse_uint(p, key, value, 0, 255, &g->minor);
    if (strcmp(key, "brand") == 0)
        return parse_brand(p, value, &g->brand);
    if (strcmp(key, "power_watts") == 0) {
        if (parse_u64(p, key, value, 0, 10000, &v) != 0)
            return -1;
        g->power_mw = (unsigned int)(v * 1000);
        return 0;
    }
    if (strcmp(key, "power_limit_watts") == 0) {
        if (parse_u64(p, key, value, 1, 10000, &v) != 0)
            return -1;
        g->power_limit_mw = (unsigned int)(v * 1000);
        return 0;
    }
    if (strcmp(key, "temperature_c") == 0)
        return parse_uint(p, key, value, 0, 150, &g->temperature_c);
    if (strcmp(key, "fail_alloc") == 0)
        return parse_u64(p, key, value, 0, UINT64_MAX, &g->faults.fail_alloc);
    if (strcmp(key, "lost") == 0)
        return parse_bool(p, key, value, &g->faults.lost);
    if (strcmp(key, "nvml_hang") == 0)
        return parse_bool(p, key, value, &g->faults.nvml_hang);
    if (strcmp(key, "mig_mode") == 0)
        return parse_bool(p, key, value, &g->mig_mode);
    return fail(p, "unknown key '%s' in [gpu]", key);
}

/* NVIDIA's profile names: "<slices>g.<GiB>gb", optionally "+me" (media extensions) and the like;
 * the leading slice count (1-7) gives the instance its share of the GPU's multiprocessors. */
static bool profile_well_formed(const char *v, int *slices)
{
    if (v[0] < '1' || v[0] > '7' || v[1] != 'g' || v[2] != '.' || !isdigit((unsigned char)v[3]))
        return false;
    for (const char *c = v; *c != '\0'; c++) {
        if (!isalnum((unsigned char)*c) && *c != '.' && *c != '+')
            return false;
    }
    *slices = v[0] - '0';
    return true;
}

static int mig_key(struct parser *p, const char *key, const char *value)
{
    struct sim_gpu_config *g = &p->cfg->gpus[p->cfg->gpu_count - 1];
    struct sim_mig_config *m = &g->mig[g->mig_count - 1];
    if (strcmp(key, "profile") == 0) {
        int slices = 0;
        if (strlen(value) >= sizeof m->profile || !profile_well_formed(value, &slices))
            return fail(p, "profile: expected a MIG profile such as 1g.10gb, got '%s'", value);
        if (!was_seen(p, "sm_count"))
            m->sm_count = g->sm_count * slices / 7 > 0 ? g->sm_count * slices / 7 : 1;
        return copy_text(p, key, value, m->profile, sizeof m->profile);
    }
    if (strcmp(key, "uuid") == 0) {
        if (!uuid_well_formed(value, "MIG-"))
            return fail(p, "uuid: expected MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (hex), "
                           "got '%s'", value);
        return copy_text(p, key, value, m->uuid, sizeof m->uuid);
    }
    if (strcmp(key, "memory_bytes") == 0)
        return parse_u64(p, key, value, 1, g->memory_bytes, &m->memory_bytes);
    if (strcmp(key, "sm_count") == 0) {
        uint64_t v = 0;
        if (parse_u64(p, key, value, 1, (uint64_t)g->sm_count, &v) != 0)
            return -1;
        m->sm_count = (int)v;
        return 0;
    }
    return fail(p, "unknown key '%s' in [mig]", key);
}

static int kernel_key(struct parser *p, const char *key, const char *value)
{
    struct sim_config *c = p->cfg;
    if (c->kernel_count == SIM_MAX_KERNELS)
        return fail(p, "more than %d entries in [kernels]", SIM_MAX_KERNELS);
    struct sim_kernel_config *k = &c->kernels[c->kernel_count];
    if (copy_text(p, "kernel name", key, k->name, sizeof k->name) != 0)
        return -1;
    if (strcmp(value, "param0") == 0) {
        k->from_param0 = true;
    } else if (parse_u64(p, key, value, 0, 3600ULL * 1000000000ULL, &k->ns) != 0) {
        return fail(p, "%s: expected 'param0' or a duration in nanoseconds, got '%s'", key,
                    value);
    }
    c->kernel_count++;
    return 0;
}

static void gpu_defaults(struct sim_gpu_config *g, int index)
{
    memset(g, 0, sizeof *g);
    g->node_index = index;
    g->sm_count = 132;
    g->cc_major = 9;
    g->cc_minor = 0;
    g->pci_bus = (unsigned int)index + 1;
    g->pci_device_id = 0x233010deu;
    g->pci_subsystem_id = 0x16c110deu;
    g->minor = (unsigned int)index;
    g->brand = 14; /* NVML_BRAND_NVIDIA, what current data-centre parts report */
    g->power_mw = 70000;
    g->power_limit_mw = 700000;
    g->temperature_c = 35;
    g->mig_index = -1;
    g->mem_domain = index;
}

/* Checks at the end of a section: required keys present. */
static int close_section(struct parser *p)
{
    if (p->section == SEC_MIG) {
        static const char *required[] = {"profile", "uuid", "memory_bytes"};
        for (size_t i = 0; i < 3; i++) {
            if (!was_seen(p, required[i]))
                return fail(p, "[mig] of GPU #%d lacks required key '%s'", p->cfg->gpu_count - 1,
                            required[i]);
        }
    }
    if (p->section == SEC_GPU) {
        static const char *required[] = {"uuid", "name", "memory_bytes"};
        for (size_t i = 0; i < 3; i++) {
            if (!was_seen(p, required[i]))
                return fail(p, "[gpu] #%d lacks required key '%s'", p->cfg->gpu_count - 1,
                            required[i]);
        }
    }
    return 0;
}

static int open_section(struct parser *p, const char *name)
{
    if (close_section(p) != 0)
        return -1;
    p->seen_count = 0;
    if (strcmp(name, "node") == 0) {
        if (p->node_seen)
            return fail(p, "[node] appears twice");
        p->node_seen = true;
        p->section = SEC_NODE;
    } else if (strcmp(name, "gpu") == 0) {
        if (p->cfg->gpu_count == SIM_MAX_GPUS)
            return fail(p, "more than %d [gpu] sections", SIM_MAX_GPUS);
        gpu_defaults(&p->cfg->gpus[p->cfg->gpu_count], p->cfg->gpu_count);
        p->cfg->gpu_count++;
        p->section = SEC_GPU;
    } else if (strcmp(name, "mig") == 0) {
        /* An instance of the GPU whose [gpu] section comes last before it. */
        if (p->cfg->gpu_count == 0)
            return fail(p, "[mig] before any [gpu]: an instance belongs to the GPU above it");
        struct sim_gpu_config *g = &p->cfg->gpus[p->cfg->gpu_count - 1];
        if (g->mig_count == SIM_MAX_MIG)
            return fail(p, "more than %d [mig] sections for GPU #%d", SIM_MAX_MIG,
                        p->cfg->gpu_count - 1);
        memset(&g->mig[g->mig_count], 0, sizeof g->mig[0]);
        g->mig_count++;
        p->section = SEC_MIG;
    } else if (strcmp(name, "kernels") == 0) {
        p->section = SEC_KERNELS;
    } else {
        return fail(p, "unknown section [%s] (expected [node], [gpu], [mig] or [kernels])", name);
    }
    return 0;
}

static int parse_line(struct parser *p, char *raw)
{
    char *line = trim(raw);
    if (line[0] == '\0' || line[0] == '#' || line[0] == ';')
        return 0;
    if (line[0] == '[') {
        char *close = strchr(line, ']');
        if (close == NULL || close[1] != '\0')
            return fail(p, "malformed section header '%s'", line);
        *close = '\0';
        return open_section(p, trim(line + 1));
    }
    char *eq = strchr(line, '=');
    if (eq == NULL)
        return fail(p, "expected 'key = value', got '%s'", line);
    *eq = '\0';
    char *key = trim(line);
    char *value = trim(eq + 1);
    if (key[0] == '\0')
        return fail(p, "missing key before '='");
    if (p->section == SEC_NONE)
        return fail(p, "key '%s' outside any section", key);
    if (mark_seen(p, key) != 0)
        return -1;
    switch (p->section) {
    case SEC_NODE:
        return node_key(p, key, value);
    case SEC_GPU:
        return gpu_key(p, key, value);
    case SEC_MIG:
        return mig_key(p, key, value);
    case SEC_KERNELS:
        return kernel_key(p, key, value);
    case SEC_NONE:
        break;
    }
    return -1;
}

/* GPU i's instances fit in its memory, and no MIG UUID is used twice on the node. */
static int check_mig(struct parser *p, int i)
{
    const struct sim_config *c = p->cfg;
    const struct sim_gpu_config *g = &c->gpus[i];
    uint64_t sum = 0;
    for (int k = 0; k < g->mig_count; k++) {
        sum += g->mig[k].memory_bytes;
        for (int j = 0; j <= i; j++) {
            for (int l = 0; l < (j == i ? k : c->gpus[j].mig_count); l++) {
                if (strcmp(g->mig[k].uuid, c->gpus[j].mig[l].uuid) == 0)
                    return fail(p, "MIG instances share uuid %s", g->mig[k].uuid);
            }
        }
    }
    if (sum > g->memory_bytes)
        return fail(p, "GPU %d: its [mig] instances' memory (%llu bytes) exceeds the GPU's (%llu)",
                    i, (unsigned long long)sum, (unsigned long long)g->memory_bytes);
    return 0;
}

static int check_whole(struct parser *p)
{
    struct sim_config *c = p->cfg;
    p->line = 0;
    if (c->state_file[0] == '\0')
        return fail(p, "[node] state_file is required");
    for (int i = 0; i < c->gpu_count; i++) {
        for (int j = 0; j < i; j++) {
            const struct sim_gpu_config *a = &c->gpus[i], *b = &c->gpus[j];
            if (strcmp(a->uuid, b->uuid) == 0)
                return fail(p, "GPUs %d and %d share uuid %s", j, i, a->uuid);
            if (a->pci_domain == b->pci_domain && a->pci_bus == b->pci_bus &&
                a->pci_device == b->pci_device && a->pci_function == b->pci_function)
                return fail(p, "GPUs %d and %d share a PCI bus id", j, i);
            if (a->minor == b->minor)
                return fail(p, "GPUs %d and %d share minor number %u", j, i, a->minor);
        }
        if (check_mig(p, i) != 0)
            return -1;
    }
    return 0;
}

int sim_config_load(const char *path, struct sim_config *out, char *err, size_t errlen)
{
    struct parser p = {.path = path, .err = err, .errlen = errlen, .cfg = out};
    memset(out, 0, sizeof *out);
    if (strlen(path) >= sizeof out->path)
        return fail(&p, "path too long");
    strcpy(out->path, path);
    strcpy(out->driver_version, "550.54.15");
    out->cuda_driver_version = SIM_DEFAULT_CUDA_DRIVER_VERSION;
    out->util_window_ns = 1000000000ULL;
    out->default_kernel_ns = 100000ULL;

    FILE *f = fopen(path, "re");
    if (f == NULL)
        return fail(&p, "cannot open: %s", strerror(errno));
    char buf[1024];
    int rc = 0;
    while (rc == 0 && fgets(buf, sizeof buf, f) != NULL) {
        p.line++;
        size_t n = strlen(buf);
        if (n == sizeof buf - 1 && buf[n - 1] != '\n' && !feof(f)) {
            rc = fail(&p, "line longer than %zu characters", sizeof buf - 2);
            break;
        }
        rc = parse_line(&p, buf);
    }
    if (rc == 0 && ferror(f))
        rc = fail(&p, "read error");
    fclose(f);
    if (rc == 0)
        rc = close_section(&p);
    if (rc == 0)
        rc = check_whole(&p);
    return rc;
}

uint64_t sim_config_fingerprint(const struct sim_config *cfg)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
#define MIX(ptr, len)                                                                             \
    for (size_t k_ = 0; k_ < (len); k_++) {                                                       \
        h ^= ((const unsigned char *)(ptr))[k_];                                                  \
        h *= 1099511628211ULL;                                                                    \
    }
    MIX(&cfg->gpu_count, sizeof cfg->gpu_count);
    for (int i = 0; i < cfg->gpu_count; i++) {
        MIX(cfg->gpus[i].uuid, strlen(cfg->gpus[i].uuid));
        MIX(&cfg->gpus[i].memory_bytes, sizeof cfg->gpus[i].memory_bytes);
        for (int k = 0; k < cfg->gpus[i].mig_count; k++) {
            MIX(cfg->gpus[i].mig[k].uuid, strlen(cfg->gpus[i].mig[k].uuid));
            MIX(&cfg->gpus[i].mig[k].memory_bytes, sizeof cfg->gpus[i].mig[k].memory_bytes);
        }
    }
#undef MIX
    return h;
}
