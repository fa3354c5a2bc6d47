/*
 * What the simulated libcuda and libnvidia-ml share: where the driver root is,
 * which GPUs the calling process can use, and what the driver says about them.
 *
 * This file is #included by cuda.c and nvml.c rather than linked: each library
 * stays one translation unit whose helpers are all static (nothing leaks into
 * the exported symbol table), and the package ships only .c files.
 *
 * The rule every consumer follows is the one a real driver stack shows:
 *   - a GPU exists for the caller when /dev/nvidia<minor> is a character device
 *     of major 195 that the caller may open: open(O_RDWR) succeeds, or fails
 *     with ENXIO/ENODEV (the node is fine but no kernel driver sits behind it,
 *     which is the simulated host).  EPERM (a cgroup device filter, see
 *     Documentation/admin-guide/cgroup-v1/devices.rst and BPF_CGROUP_DEVICE)
 *     or EACCES (file mode, nodev mount) hides it, as it hides a real GPU;
 *   - what the GPU is (model, UUID, bus id) comes from
 *     /proc/driver/nvidia/gpus/<bus id>/information, matched by Device Minor.
 * Paths are absolute (/proc, /dev) inside a sandbox.  On the host side of a
 * simulated host the library lives in DIR/usr/lib/<multiarch>/, so the root
 * is the library's own location minus that suffix.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define SIM_NVIDIA_MAJOR 195
#define SIM_MAX_GPUS 32           /* NV_MAX_GPUS in the kernel module */
#define SIM_MAX_MIG 7             /* MIG devices per GPU on A100/H100 */
#define SIM_MIG_GIS 15            /* gi0..gi14 in nv-caps.c's table */
#define SIM_MIG_CIS 8             /* ci0..ci7 per GPU instance */

#ifndef SIM_LIB_VERSION
#define SIM_LIB_VERSION "0.0.0"
#endif
#ifndef SIM_CUDA_VERSION
#define SIM_CUDA_VERSION 0
#endif
/* "minor:gi:profile;..." for every GPU instance the simulated host created.
 * The profile is the one thing the driver knows that no file in /proc or /dev
 * says, so the builder compiles it in, like a kernel's own state. */
#ifndef SIM_MIG_PROFILES
#define SIM_MIG_PROFILES ""
#endif

struct sim_mig {
    unsigned gi, ci;
    char uuid[48];
    char profile[24];
    unsigned long long mem;
};

struct sim_gpu {
    unsigned minor;
    char model[96];
    char uuid[48];
    unsigned char raw[16];
    char bus[32];
    int mig_mode;
    int nmig;
    struct sim_mig mig[SIM_MAX_MIG];
};

/* Short enough that root + any absolute path below fits in PATH_MAX. */
static char sim_root[PATH_MAX - 512];
static struct sim_gpu sim_gpus[SIM_MAX_GPUS];
static int sim_ngpus;

static void sim_path(char *out, size_t len, const char *abs)
{
    snprintf(out, len, "%s%s", sim_root, abs);
}

/* The directory of this library, minus a standard library-directory suffix,
 * when that prefix holds a driver root; otherwise "" (the real /). */
static void sim_find_root(void)
{
    static const char *const libdirs[] = {
        "/usr/lib/x86_64-linux-gnu", "/usr/lib/i386-linux-gnu",
        "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib32",
        "/lib/x86_64-linux-gnu", "/lib64", "/usr/lib", "/lib", NULL,
    };
    Dl_info info;
    char dir[PATH_MAX], probe[PATH_MAX + 64];

    sim_root[0] = '\0';
    if (!dladdr((void *)sim_find_root, &info) || !info.dli_fname)
        return;
    if (!realpath(info.dli_fname, dir))
        return;
    char *slash = strrchr(dir, '/');
    if (!slash)
        return;
    *slash = '\0';
    size_t n = strlen(dir);
    for (int i = 0; libdirs[i]; i++) {
        size_t m = strlen(libdirs[i]);
        if (n > m && strcmp(dir + n - m, libdirs[i]) == 0) {
            dir[n - m] = '\0';
            snprintf(probe, sizeof probe, "%s/proc/driver/nvidia/version", dir);
            if (strlen(dir) < sizeof sim_root && access(probe, F_OK) == 0)
                memcpy(sim_root, dir, strlen(dir) + 1);
            return;
        }
    }
}

/* 1 when the caller may use this node (see the rule at the top). */
static int sim_node_usable(const char *path, int flags)
{
    int fd = open(path, flags | O_CLOEXEC | O_NOCTTY);
    if (fd >= 0) {
        close(fd);
        return 1;
    }
    return errno == ENXIO || errno == ENODEV;
}

/* The kernel module's version: the 8th word of the first line
 * ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ..."). */
static int sim_driver_version(char *out, size_t len)
{
    char path[PATH_MAX], line[512];
    sim_path(path, sizeof path, "/proc/driver/nvidia/version");
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (!ok)
        return -1;
    char *p = strstr(line, "Kernel Module");
    if (!p)
        return -1;
    p += strlen("Kernel Module");
    while (*p == ' ')
        p++;
    size_t k = strcspn(p, " \t\n");
    if (k == 0 || k >= len)
        return -1;
    memcpy(out, p, k);
    out[k] = '\0';
    return 0;
}

/* FNV-1a, 64 bits, then MurmurHash3's fmix64 so that keys differing in one
 * byte differ everywhere: MIG UUIDs are derived from the parent GPU UUID and
 * the instance ids; gpusandbox/sim/ids.py computes the same values. */
static uint64_t sim_fnv(const char *s, uint64_t h)
{
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

static void sim_format_uuid(char *out, size_t len, const char *prefix, const unsigned char *b)
{
    snprintf(out, len,
             "%s%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             prefix, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9],
             b[10], b[11], b[12], b[13], b[14], b[15]);
}

static void sim_mig_uuid(char *out, size_t len, const char *gpu_uuid, unsigned gi, unsigned ci)
{
    char key[96];
    unsigned char b[16];
    snprintf(key, sizeof key, "%s/gi%u/ci%u", gpu_uuid, gi, ci);
    uint64_t h1 = sim_fnv(key, 0xcbf29ce484222325ULL);
    uint64_t h2 = sim_fnv(key, 0x84222325cbf29ce4ULL);
    for (int i = 0; i < 8; i++) {
        b[i] = (unsigned char)(h1 >> (56 - 8 * i));
        b[8 + i] = (unsigned char)(h2 >> (56 - 8 * i));
    }
    sim_format_uuid(out, len, "MIG-", b);
}

static int sim_parse_uuid(const char *text, unsigned char *raw)
{
    if (strncmp(text, "GPU-", 4) != 0)
        return -1;
    const char *p = text + 4;
    for (int i = 0; i < 16; i++) {
        if (*p == '-')
            p++;
        unsigned v;
        if (!isxdigit((unsigned char)p[0]) || !isxdigit((unsigned char)p[1]) ||
            sscanf(p, "%2x", &v) != 1)
            return -1;
        raw[i] = (unsigned char)v;
        p += 2;
    }
    return 0;
}

/* "80GB" in a model name or "10gb" in a profile, in bytes; 0 when absent. */
static unsigned long long sim_mem_from(const char *s)
{
    for (const char *p = s; *p; p++) {
        if (isdigit((unsigned char)*p) && (p == s || !isalnum((unsigned char)p[-1]))) {
            char *end;
            unsigned long long v = strtoull(p, &end, 10);
            if (strncasecmp(end, "gb", 2) == 0)
                return v << 30;
            p = end - 1;
        }
    }
    return 0;
}

static void sim_value(char *out, size_t len, const char *line, const char *key)
{
    size_t k = strlen(key);
    if (strncmp(line, key, k) != 0 || line[k] != ':')
        return;
    const char *v = line + k + 1;
    while (*v == ' ' || *v == '\t')
        v++;
    snprintf(out, len, "%.*s", (int)strcspn(v, "\n"), v);
}

static int sim_read_info(const char *file, struct sim_gpu *g)
{
    char line[256], minor[16] = "";
    FILE *f = fopen(file, "re");
    if (!f)
        return -1;
    g->model[0] = g->uuid[0] = g->bus[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        sim_value(g->model, sizeof g->model, line, "Model");
        sim_value(g->uuid, sizeof g->uuid, line, "GPU UUID");
        sim_value(g->bus, sizeof g->bus, line, "Bus Location");
        sim_value(minor, sizeof minor, line, "Device Minor");
    }
    fclose(f);
    if (!minor[0] || sim_parse_uuid(g->uuid, g->raw) != 0)
        return -1;
    g->minor = (unsigned)strtoul(minor, NULL, 10);
    return 0;
}

static int sim_cap_minor(const char *abs)
{
    char path[PATH_MAX], line[128];
    int minor = -1;
    sim_path(path, sizeof path, abs);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "DeviceFileMinor: %d", &minor) == 1)
            break;
    fclose(f);
    return minor;
}

static int sim_cap_usable(int minor)
{
    char abs[64], path[PATH_MAX];
    if (minor < 0)
        return 0;
    snprintf(abs, sizeof abs, "/dev/nvidia-caps/nvidia-cap%d", minor);
    sim_path(path, sizeof path, abs);
    return sim_node_usable(path, O_RDONLY);
}

static void sim_mig_profile(struct sim_mig *m, unsigned minor)
{
    const char *p = SIM_MIG_PROFILES;
    unsigned g, gi;
    char prof[24];
    snprintf(m->profile, sizeof m->profile, "1g.10gb");
    while (*p) {
        if (sscanf(p, "%u:%u:%23[^;]", &g, &gi, prof) == 3 && g == minor && gi == m->gi)
            snprintf(m->profile, sizeof m->profile, "%s", prof);
        p += strcspn(p, ";");
        if (*p == ';')
            p++;
    }
    m->mem = sim_mem_from(m->profile);
}

/* The MIG devices of one GPU that the caller may use: the driver lists the
 * instance under /proc/driver/nvidia/capabilities and both its GPU-instance
 * and compute-instance capability nodes may be opened. */
static void sim_scan_mig(struct sim_gpu *g)
{
    char abs[128], path[PATH_MAX];
    struct stat st;
    snprintf(abs, sizeof abs, "/proc/driver/nvidia/capabilities/gpu%u/mig", g->minor);
    sim_path(path, sizeof path, abs);
    g->mig_mode = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    g->nmig = 0;
    for (unsigned gi = 0; g->mig_mode && gi < SIM_MIG_GIS; gi++) {
        snprintf(abs, sizeof abs, "/proc/driver/nvidia/capabilities/gpu%u/mig/gi%u/access", g->minor, gi);
        int gi_minor = sim_cap_minor(abs);
        if (gi_minor < 0 || !sim_cap_usable(gi_minor))
            continue;
        for (unsigned ci = 0; ci < SIM_MIG_CIS && g->nmig < SIM_MAX_MIG; ci++) {
            snprintf(abs, sizeof abs, "/proc/driver/nvidia/capabilities/gpu%u/mig/gi%u/ci%u/access",
                     g->minor, gi, ci);
            if (!sim_cap_usable(sim_cap_minor(abs)))
                continue;
            struct sim_mig *m = &g->mig[g->nmig++];
            m->gi = gi;
            m->ci = ci;
            sim_mig_uuid(m->uuid, sizeof m->uuid, g->uuid, gi, ci);
            sim_mig_profile(m, g->minor);
        }
    }
}

/* Fills sim_gpus with the usable GPUs, ordered by minor (= PCI order here). */
static void sim_scan(void)
{
    static struct sim_gpu known[256];
    static unsigned char have[256];
    char path[PATH_MAX], file[PATH_MAX + 512];
    struct dirent *de;
    DIR *d;

    memset(have, 0, sizeof have);
    sim_ngpus = 0;
    sim_path(path, sizeof path, "/proc/driver/nvidia/gpus");
    if ((d = opendir(path)) != NULL) {
        while ((de = readdir(d)) != NULL) {
            struct sim_gpu g;
            if (de->d_name[0] == '.')
                continue;
            snprintf(file, sizeof file, "%s/%s/information", path, de->d_name);
            if (sim_read_info(file, &g) == 0 && g.minor < 256) {
                known[g.minor] = g;
                have[g.minor] = 1;
            }
        }
        closedir(d);
    }
    for (unsigned minor = 0; minor < 256 && sim_ngpus < SIM_MAX_GPUS; minor++) {
        char abs[32];
        struct stat st;
        if (!have[minor])
            continue;
        snprintf(abs, sizeof abs, "/dev/nvidia%u", minor);
        sim_path(path, sizeof path, abs);
        if (stat(path, &st) != 0 || !S_ISCHR(st.st_mode) ||
            major(st.st_rdev) != SIM_NVIDIA_MAJOR || minor(st.st_rdev) != minor)
            continue;
        if (!sim_node_usable(path, O_RDWR))
            continue;
        sim_gpus[sim_ngpus] = known[minor];
        sim_scan_mig(&sim_gpus[sim_ngpus]);
        sim_ngpus++;
    }
}

/* The control node: a driver stack that cannot open it cannot do anything. */
static int sim_ctl_usable(void)
{
    char path[PATH_MAX];
    sim_path(path, sizeof path, "/dev/nvidiactl");
    return sim_node_usable(path, O_RDWR);
}
