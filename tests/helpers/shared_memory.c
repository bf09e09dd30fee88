/* Three tasks sharing one memory map (clone CLONE_VM, not threads: each is a
 * process of its own, in state S or D by itself). Once the file "go" exists
 * in the current directory, one writes into a shared mapping of DIR/data
 * (on a frozen filesystem: it stays in D state holding the map's lock) and
 * another asks to change the mapping (it queues for the lock). The parent,
 * in state S, prints "mapped" and waits: reading its /proc/PID/cmdline
 * takes the same lock and blocks until the filesystem thaws.
 *
 *     cc -o shared_memory shared_memory.c && ./shared_memory DIR
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define SIZE (16 * 4096)
#define STACK (64 * 1024)

static char *mapping;

static void wait_for_go(void) {
    while (access("go", F_OK) != 0)
        usleep(10000);
}

static int write_fault(void *unused) {
    wait_for_go();
    mapping[2 * 4096] = 'x';
    for (;;)
        pause();
    return 0;
}

static int change_mapping(void *unused) {
    wait_for_go();
    usleep(200000);  /* after the fault has taken the lock */
    mprotect(mapping, SIZE, PROT_READ);
    for (;;)
        pause();
    return 0;
}

static int start(int (*fn)(void *)) {
    char *stack = malloc(STACK);
    return stack ? clone(fn, stack + STACK, CLONE_VM | SIGCHLD, NULL) : -1;
}

int main(int argc, char **argv) {
    char path[4096];
    if (argc != 2)
        return 2;
    snprintf(path, sizeof path, "%s/data", argv[1]);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, SIZE) != 0)
        return 1;
    mapping = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapping == MAP_FAILED || start(write_fault) < 0 || start(change_mapping) < 0)
        return 1;
    printf("mapped\n");
    fflush(stdout);
    for (;;)
        pause();
}
