/*
 * The pod sandbox's first process (what registry.k8s.io/pause is elsewhere), built from source so
 * that no image is pulled. It holds the pod's namespaces open, reaps zombies when the pod shares its
 * PID namespace, and exits cleanly on SIGINT or SIGTERM, which it must handle itself: as PID 1 of a
 * PID namespace it would otherwise ignore them.
 */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signum) {
    (void)signum;
    _exit(0);
}

static void reap(int signum) {
    (void)signum;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    if (sigaction(SIGINT, &on_stop, NULL) != 0 || sigaction(SIGTERM, &on_stop, NULL) != 0 ||
        sigaction(SIGCHLD, &on_child, NULL) != 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
