/*
 * Placeholder for the driver's helper programs (nvidia-debugdump,
 * nvidia-persistenced, nvidia-cuda-mps-control, ...): a real executable that
 * says what it is.  One build is copied under every name, so the name comes
 * from the executable's own path, not from argv[0], which the caller chooses.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    const char *name = argc > 0 ? argv[0] : "nvidia-tool";
    if (n > 0) {
        self[n] = '\0';
        name = self;
    }
    const char *base = strrchr(name, '/');
    printf("%s: gpusandbox simulated NVIDIA driver utility (no hardware behind it)\n",
           base ? base + 1 : name);
    return 0;
}
