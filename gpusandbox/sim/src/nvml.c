/*
 * Simulated libnvidia-ml.so.1: the NVML calls nvidia-smi -L, container
 * tooling and schedulers make, with nvml.h's return codes and struct layouts.
 * Built with -DSIM_LIB_VERSION="550.54.15" -DSIM_CUDA_VERSION=12040
 * -DSIM_MIG_PROFILES="0:1:3g.40gb;...".
 */
#include "simcommon.c"

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_UNKNOWN = 999,
};

/* nvmlDevice_t is an opaque pointer; a MIG handle carries its instance. */
typedef struct nvmlDevice_st {
    int gpu;   /* index in sim_gpus */
    int mig;   /* -1 for the GPU itself */
} *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

/* nvmlPciInfo_t as of NVML's _v3 calls. */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static int nvml_refs;
static struct nvmlDevice_st nvml_handles[SIM_MAX_GPUS][1 + SIM_MAX_MIG];

nvmlReturn_t nvmlInit_v2(void)
{
    char version[64], path[PATH_MAX];
    if (nvml_refs > 0) {
        nvml_refs++;
        return NVML_SUCCESS;
    }
    sim_find_root();
    if (sim_driver_version(version, sizeof version) != 0)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    sim_path(path, sizeof path, "/dev/nvidiactl");
    if (access(path, F_OK) != 0)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (!sim_ctl_usable())
        return NVML_ERROR_NO_PERMISSION;
    if (strcmp(version, SIM_LIB_VERSION) != 0)
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    sim_scan();
    for (int g = 0; g < sim_ngpus; g++)
        for (int m = 0; m <= SIM_MAX_MIG; m++) {
            nvml_handles[g][m].gpu = g;
            nvml_handles[g][m].mig = m - 1;
        }
    nvml_refs = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void)
{
    return nvmlInit_v2();
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void)
{
    if (nvml_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    nvml_refs--;
    return NVML_SUCCESS;
}

static const struct { int code; const char *text; } nvml_errors[] = {
    {NVML_SUCCESS, "Success"},
    {NVML_ERROR_UNINITIALIZED, "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
    {NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"},
    {NVML_ERROR_NOT_FOUND, "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
    {NVML_ERROR_LIB_RM_VERSION_MISMATCH, "Driver/library version mismatch"},
    {NVML_ERROR_UNKNOWN, "Unknown Error"},
};

const char *nvmlErrorString(nvmlReturn_t result)
{
    for (size_t i = 0; i < sizeof nvml_errors / sizeof nvml_errors[0]; i++)
        if (nvml_errors[i].code == result)
            return nvml_errors[i].text;
    return "Unknown Error";
}

static nvmlReturn_t nvml_copy(char *out, unsigned int len, const char *text)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int len)
{
    char v[64];
    if (nvml_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (sim_driver_version(v, sizeof v) != 0)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    return nvml_copy(version, len, v);
}

/* "12.550.54.15": the CUDA major, then the library build. */
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int len)
{
    char v[96];
    snprintf(v, sizeof v, "%d.%s", SIM_CUDA_VERSION / 1000, SIM_LIB_VERSION);
    return nvml_copy(version, len, v);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = SIM_CUDA_VERSION;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    return nvmlSystemGetCudaDriverVersion(version);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (nvml_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)sim_ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
    return nvmlDeviceGetCount_v2(count);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (nvml_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)sim_ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &nvml_handles[index][0];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (nvml_refs == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int g = 0; g < sim_ngpus; g++) {
        if (strcmp(sim_gpus[g].uuid, uuid) == 0) {
            *device = &nvml_handles[g][0];
            return NVML_SUCCESS;
        }
        for (int m = 0; m < sim_gpus[g].nmig; m++)
            if (strcmp(sim_gpus[g].mig[m].uuid, uuid) == 0) {
                *device = &nvml_handles[g][m + 1];
                return NVML_SUCCESS;
            }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* A handle this library gave out, or NULL. */
static struct sim_gpu *nvml_gpu(nvmlDevice_t dev)
{
    if (nvml_refs == 0 || !dev || dev->gpu < 0 || dev->gpu >= sim_ngpus)
        return NULL;
    if (dev->mig >= sim_gpus[dev->gpu].nmig)
        return NULL;
    return &sim_gpus[dev->gpu];
}

static nvmlReturn_t nvml_bad(void)
{
    return nvml_refs == 0 ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int len)
{
    struct sim_gpu *g = nvml_gpu(dev);
    char text[160];
    if (!g)
        return nvml_bad();
    if (dev->mig < 0)
        return nvml_copy(name, len, g->model);
    snprintf(text, sizeof text, "%s MIG %s", g->model, g->mig[dev->mig].profile);
    return nvml_copy(name, len, text);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int len)
{
    struct sim_gpu *g = nvml_gpu(dev);
    if (!g)
        return nvml_bad();
    return nvml_copy(uuid, len, dev->mig < 0 ? g->uuid : g->mig[dev->mig].uuid);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index)
{
    if (!nvml_gpu(dev) || !index)
        return nvml_bad();
    *index = (unsigned)dev->gpu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minor)
{
    struct sim_gpu *g = nvml_gpu(dev);
    if (!g || !minor)
        return nvml_bad();
    *minor = g->minor;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci)
{
    struct sim_gpu *g = nvml_gpu(dev);
    unsigned domain = 0, bus = 0, device = 0, function = 0;
    if (!g || !pci)
        return nvml_bad();
    memset(pci, 0, sizeof *pci);
    sscanf(g->bus, "%x:%x:%x.%x", &domain, &bus, &device, &function);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = device;
    pci->pciDeviceId = 0x233010de;
    snprintf(pci->busId, sizeof pci->busId, "%08x:%02x:%02x.%x", domain, bus, device, function);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04x:%02x:%02x.%x", domain, bus, device, function);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory)
{
    struct sim_gpu *g = nvml_gpu(dev);
    if (!g || !memory)
        return nvml_bad();
    memory->total = dev->mig < 0 ? sim_mem_from(g->model) : g->mig[dev->mig].mem;
    memory->used = 0;
    memory->free = memory->total;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *current, unsigned int *pending)
{
    struct sim_gpu *g = nvml_gpu(dev);
    if (!g || dev->mig >= 0 || !current || !pending)
        return nvml_bad();
    *current = *pending = (unsigned)g->mig_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *count)
{
    struct sim_gpu *g = nvml_gpu(dev);
    if (!g || dev->mig >= 0 || !count)
        return nvml_bad();
    *count = g->mig_mode ? SIM_MAX_MIG : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int index, nvmlDevice_t *mig)
{
    struct sim_gpu *g = nvml_gpu(dev);
    if (!g || dev->mig >= 0 || !mig || index >= SIM_MAX_MIG)
        return nvml_bad();
    if (!g->mig_mode)
        return NVML_ERROR_NOT_SUPPORTED;
    if (index >= (unsigned)g->nmig)
        return NVML_ERROR_NOT_FOUND;
    *mig = &nvml_handles[dev->gpu][index + 1];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned int *is_mig)
{
    if (!nvml_gpu(dev) || !is_mig)
        return nvml_bad();
    *is_mig = dev->mig >= 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *dev)
{
    if (!nvml_gpu(mig) || mig->mig < 0 || !dev)
        return nvml_bad();
    *dev = &nvml_handles[mig->gpu][0];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int *id)
{
    struct sim_gpu *g = nvml_gpu(dev);
    if (!g || dev->mig < 0 || !id)
        return nvml_bad();
    *id = g->mig[dev->mig].gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned int *id)
{
    struct sim_gpu *g = nvml_gpu(dev);
    if (!g || dev->mig < 0 || !id)
        return nvml_bad();
    *id = g->mig[dev->mig].ci;
    return NVML_SUCCESS;
}
