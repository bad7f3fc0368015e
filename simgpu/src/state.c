/* The shared state file: mapping, initialisation, the robust lock and the process table. */
#include "state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

static void read_identity(struct sim_identity *id)
{
    memset(id, 0, sizeof *id);
    id->pid = (int32_t)getpid();
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) == 0)
        id->ns_ino = (uint64_t)st.st_ino;
    /* Field 22 of /proc/self/stat, counted after the parenthesised command name. */
    FILE *f = fopen("/proc/self/stat", "re");
    if (f == NULL)
        return;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return;
    p++;
    for (int field = 3; field <= 22 && p != NULL; field++) {
        p = strchr(p + 1, ' ');
        if (p != NULL && field == 21)
            id->start_ticks = strtoull(p + 1, NULL, 10);
    }
}

static bool same_identity(const struct sim_identity *a, const struct sim_identity *b)
{
    return a->pid == b->pid && a->ns_ino == b->ns_ino && a->start_ticks == b->start_ticks;
}

/* Query the liveness lock of `slot`. Returns 1 when held by another process (pid filled), 0 when
 * free, -1 when the query itself failed (treated as alive: never reap on doubt). */
static int liveness_holder(int fd, int slot, int32_t *pid)
{
    struct flock fl = {
        .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = SIM_LIVENESS_BASE + slot, .l_len = 1};
    if (fcntl(fd, F_GETLK, &fl) != 0)
        return -1;
    if (fl.l_type == F_UNLCK)
        return 0;
    *pid = (int32_t)fl.l_pid;
    return 1;
}

bool sim_node_proc_alive(struct sim_node *node, int slot, int32_t *visible_pid)
{
    const struct sim_proc_slot *p = &node->sh->procs[slot];
    if (!p->used)
        return false;
    int32_t pid = 0;
    switch (liveness_holder(node->fd, slot, &pid)) {
    case 1:
        *visible_pid = pid;
        return true;
    case 0:
        /* Our own locks never conflict with us: a free lock on our own slot means "us". */
        if (same_identity(&p->id, &node->me)) {
            *visible_pid = node->me.pid;
            return true;
        }
        return false;
    default:
        *visible_pid = p->id.pid;
        return true;
    }
}

static void free_slot(struct sim_shared *sh, int slot)
{
    for (uint32_t i = 0; i < sh->alloc_hwm; i++) {
        if (sh->allocs[i].used && sh->allocs[i].proc == slot)
            sh->allocs[i].used = 0;
    }
    sh->procs[slot].ctx_mask = 0;
    sh->procs[slot].gen++;
    sh->procs[slot].used = 0;
}

void sim_node_reap(struct sim_node *node)
{
    struct sim_shared *sh = node->sh;
    for (int s = 0; s < SIM_MAX_PROCS; s++) {
        int32_t pid = 0;
        if (sh->procs[s].used && s != node->my_slot && !sim_node_proc_alive(node, s, &pid))
            free_slot(sh, s);
    }
}

int sim_node_register(struct sim_node *node)
{
    struct sim_shared *sh = node->sh;
    sim_node_reap(node);
    for (int s = 0; s < SIM_MAX_PROCS; s++) {
        if (sh->procs[s].used)
            continue;
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                           .l_start = SIM_LIVENESS_BASE + s, .l_len = 1};
        if (fcntl(node->fd, F_SETLK, &fl) != 0)
            continue; /* held by a process that predates a re-initialisation; skip it */
        sh->procs[s].id = node->me;
        sh->procs[s].ctx_mask = 0;
        sh->procs[s].used = 1;
        node->my_slot = s;
        return 0;
    }
    return -1;
}

void sim_node_lock(struct sim_node *node)
{
    int rc = pthread_mutex_lock(&node->sh->lock);
    if (rc == EOWNERDEAD) {
        /* The holder died mid-update. Every entry is self-contained, so the only repair is the
         * allocation high-water mark, which may lag a slot written just before the death. */
        uint32_t hwm = 0;
        for (uint32_t i = 0; i < SIM_MAX_ALLOCS; i++) {
            if (node->sh->allocs[i].used)
                hwm = i + 1;
        }
        node->sh->alloc_hwm = hwm;
        pthread_mutex_consistent(&node->sh->lock);
    } else if (rc != 0) {
        sim_log("cannot take the state lock: %s", strerror(rc));
        abort();
    }
}

void sim_node_unlock(struct sim_node *node)
{
    pthread_mutex_unlock(&node->sh->lock);
}

static void initialise(struct sim_shared *sh, const struct sim_config *cfg)
{
    memset(sh, 0, sizeof *sh);
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&sh->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    sh->layout = SIM_STATE_LAYOUT;
    sh->gpu_count = (uint32_t)cfg->gpu_count;
    sh->fingerprint = sim_config_fingerprint(cfg);
    __atomic_store_n(&sh->magic, SIM_STATE_MAGIC, __ATOMIC_RELEASE);
}

static bool any_process_alive(int fd, const struct sim_shared *sh)
{
    for (int s = 0; s < SIM_MAX_PROCS; s++) {
        int32_t pid = 0;
        if (sh->procs[s].used && liveness_holder(fd, s, &pid) != 0)
            return true;
    }
    return false;
}

int sim_node_open(struct sim_node *node, const struct sim_config *cfg, char *err, size_t errlen)
{
    memset(node, 0, sizeof *node);
    node->my_slot = -1;
    read_identity(&node->me);
    int fd = open(cfg->state_file, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open state file %s: %s", cfg->path, cfg->state_file,
                 strerror(errno));
        return -1;
    }
    /* Several simulated nodes' processes may start at once: serialise initialisation with an
     * flock (independent of the POSIX record locks used for liveness). */
    if (flock(fd, LOCK_EX) != 0) {
        snprintf(err, errlen, "%s: cannot lock state file: %s", cfg->state_file, strerror(errno));
        close(fd);
        return -1;
    }
    struct stat st;
    int rc = -1;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "%s: %s", cfg->state_file, strerror(errno));
        goto out;
    }
    bool fresh = (size_t)st.st_size < sizeof(struct sim_shared);
    if (fresh && ftruncate(fd, (off_t)sizeof(struct sim_shared)) != 0) {
        snprintf(err, errlen, "%s: cannot size state file: %s", cfg->state_file, strerror(errno));
        goto out;
    }
    if (fresh)
        (void)fchmod(fd, 0666); /* processes of other users (containers) share the node */
    map = mmap(NULL, sizeof(struct sim_shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "%s: cannot map state file: %s", cfg->state_file, strerror(errno));
        goto out;
    }
    struct sim_shared *sh = map;
    bool matches = !fresh && sh->magic == SIM_STATE_MAGIC && sh->layout == SIM_STATE_LAYOUT &&
                   sh->fingerprint == sim_config_fingerprint(cfg);
    if (!matches) {
        if (!fresh && sh->magic == SIM_STATE_MAGIC && any_process_alive(fd, sh)) {
            snprintf(err, errlen, "%s: state file %s is in use by processes started with a "
                     "different GPU configuration; stop them first", cfg->path, cfg->state_file);
            munmap(map, sizeof(struct sim_shared));
            goto out;
        }
        initialise(sh, cfg);
    }
    node->sh = sh;
    node->fd = fd;
    rc = 0;
out:
    flock(fd, LOCK_UN);
    if (rc != 0)
        close(fd);
    return rc;
}
