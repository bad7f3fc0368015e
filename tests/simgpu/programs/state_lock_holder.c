/*
 * Simulator-only test program: maps a node's state file and takes its lock, prints "locked" and
 * waits to be killed. Used to check that a process dying while it holds the shared lock does
 * not wedge the node (the robust mutex hands the next locker EOWNERDEAD and it recovers).
 *
 *   state_lock_holder STATE_FILE
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "state.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: state_lock_holder STATE_FILE\n");
        return 2;
    }
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    struct sim_shared *sh =
        mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sh == MAP_FAILED || pthread_mutex_lock(&sh->lock) != 0) {
        perror("lock");
        return 1;
    }
    printf("locked\n");
    fflush(stdout);
    pause();
    return 0;
}
