/*
 * Simulated libcuda.so.1: the driver API calls that tests, CUDA runtimes and
 * framework probes make first, with the CUresult codes of cuda.h.
 * Built with -DSIM_LIB_VERSION="550.54.15" -DSIM_CUDA_VERSION=12040.
 */
#include "simcommon.c"

typedef int CUresult;
typedef int CUdevice;
typedef struct { char bytes[16]; } CUuuid;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
    CUDA_ERROR_UNKNOWN = 999,
};

#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76

static int cu_state = -1;          /* -1: cuInit not called; else its result */
static int cu_order[SIM_MAX_GPUS]; /* CUDA ordinal -> index in sim_gpus */
static int cu_count;

/* CUDA_VISIBLE_DEVICES as the real driver reads it: a comma list of ordinals
 * or GPU- UUID prefixes; enumeration stops at the first item that names no
 * device (or one already listed). */
static void cu_apply_visible(void)
{
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    cu_count = 0;
    if (!env) {
        for (int i = 0; i < sim_ngpus; i++)
            cu_order[cu_count++] = i;
        return;
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", env);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        tok[strcspn(tok, " ")] = '\0';
        int pick = -1;
        if (strncmp(tok, "GPU-", 4) == 0 && strlen(tok) > 4) {
            for (int i = 0; i < sim_ngpus; i++)
                if (strncmp(sim_gpus[i].uuid, tok, strlen(tok)) == 0)
                    pick = pick < 0 ? i : -2; /* ambiguous prefix */
        } else if (*tok && strspn(tok, "0123456789") == strlen(tok)) {
            long idx = strtol(tok, NULL, 10);
            if (idx < sim_ngpus)
                pick = (int)idx;
        }
        if (pick < 0)
            return;
        for (int k = 0; k < cu_count; k++)
            if (cu_order[k] == pick)
                return;
        cu_order[cu_count++] = pick;
    }
}

CUresult cuInit(unsigned int flags)
{
    char version[64];
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (cu_state >= 0)
        return cu_state;
    sim_find_root();
    if (sim_driver_version(version, sizeof version) != 0 || !sim_ctl_usable())
        return cu_state = CUDA_ERROR_NO_DEVICE;
    /* User-space and kernel module must be the same build. */
    if (strcmp(version, SIM_LIB_VERSION) != 0)
        return cu_state = CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    sim_scan();
    cu_apply_visible();
    return cu_state = cu_count > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = SIM_CUDA_VERSION;
    return CUDA_SUCCESS;
}

static struct sim_gpu *cu_dev(CUdevice dev)
{
    if (cu_state != CUDA_SUCCESS || dev < 0 || dev >= cu_count)
        return NULL;
    return &sim_gpus[cu_order[dev]];
}

static CUresult cu_dev_error(void)
{
    return cu_state == CUDA_SUCCESS ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cuDeviceGetCount(int *count)
{
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    if (cu_state != CUDA_SUCCESS)
        return CUDA_ERROR_NOT_INITIALIZED;
    *count = cu_count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cu_dev(ordinal))
        return cu_dev_error();
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    struct sim_gpu *g = cu_dev(dev);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g)
        return cu_dev_error();
    snprintf(name, (size_t)len, "%s", g->model);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    struct sim_gpu *g = cu_dev(dev);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g)
        return cu_dev_error();
    memcpy(uuid->bytes, g->raw, 16);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid(uuid, dev);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    struct sim_gpu *g = cu_dev(dev);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g)
        return cu_dev_error();
    *bytes = (size_t)sim_mem_from(g->model);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
    return cuDeviceTotalMem_v2(bytes, dev);
}

CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev)
{
    struct sim_gpu *g = cu_dev(dev);
    if (!bus || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g)
        return cu_dev_error();
    snprintf(bus, (size_t)len, "%s", g->bus);
    return CUDA_SUCCESS;
}

/* Compute capability by product family, for framework probes. */
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev)
{
    static const struct { const char *tag; int major, minor; } families[] = {
        {"H100", 9, 0}, {"H200", 9, 0}, {"GH200", 9, 0}, {"L40", 8, 9}, {"L4", 8, 9},
        {"A100", 8, 0}, {"A30", 8, 0}, {"A10", 8, 6}, {"A40", 8, 6}, {"T4", 7, 5},
        {"V100", 7, 0}, {NULL, 0, 0},
    };
    struct sim_gpu *g = cu_dev(dev);
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g)
        return cu_dev_error();
    int major = 9, minor = 0;
    for (int i = 0; families[i].tag; i++) {
        if (strstr(g->model, families[i].tag)) {
            major = families[i].major;
            minor = families[i].minor;
            break;
        }
    }
    if (attribute == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        *value = major;
    else if (attribute == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        *value = minor;
    else
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static const struct { int code; const char *name, *text; } cu_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
     "system has unsupported display driver / cuda driver combination"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult cu_error_lookup(CUresult error, const char **out, int want_name)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof cu_errors / sizeof cu_errors[0]; i++) {
        if (cu_errors[i].code == error) {
            *out = want_name ? cu_errors[i].name : cu_errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **text)
{
    return cu_error_lookup(error, text, 0);
}

CUresult cuGetErrorName(CUresult error, const char **name)
{
    return cu_error_lookup(error, name, 1);
}
