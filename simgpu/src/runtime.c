/* Per-process setup shared by both libraries: configuration plus shared state. */
#include "runtime.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"

enum sim_open_result sim_runtime_open(struct sim_runtime *rt)
{
    const char *path = getenv(SIM_CONFIG_ENV);
    if (path == NULL || path[0] == '\0')
        return SIM_OPEN_NO_CONFIG;
    char err[1024];
    if (sim_config_load(path, &rt->cfg, err, sizeof err) != 0) {
        sim_log("%s", err);
        return SIM_OPEN_FAILED;
    }
    if (stat(path, &rt->watched) != 0)
        memset(&rt->watched, 0, sizeof rt->watched);
    pthread_mutex_init(&rt->watch_mu, NULL);
    if (sim_node_open(&rt->node, &rt->cfg, err, sizeof err) != 0) {
        sim_log("%s", err);
        return SIM_OPEN_FAILED;
    }
    return SIM_OPEN_OK;
}
