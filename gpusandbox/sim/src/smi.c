/*
 * Simulated nvidia-smi.  Like the real tool it reaches the driver only through
 * libnvidia-ml.so.1, loaded with dlopen at run time, so a container without
 * the injected library (or without the driver's device nodes) fails the way
 * the real one does, with the real messages and exit codes (nvidia-smi(1),
 * RETURN VALUE: 6 object not found, 9 driver not loaded, 12 NVML not found,
 * 18 version mismatch).
 *
 *   nvidia-smi                      short summary table
 *   nvidia-smi -L | --list-gpus     "GPU 0: <name> (UUID: GPU-...)" + MIG lines
 *   nvidia-smi --query-gpu=F,... --format=csv[,noheader][,nounits]
 *   nvidia-smi --version
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static struct {
    int (*init)(void);
    const char *(*error)(int);
    int (*driver)(char *, unsigned);
    int (*nvml_version)(char *, unsigned);
    int (*cuda)(int *);
    int (*count)(unsigned *);
    int (*handle)(unsigned, nvmlDevice_t *);
    int (*name)(nvmlDevice_t, char *, unsigned);
    int (*uuid)(nvmlDevice_t, char *, unsigned);
    int (*pci)(nvmlDevice_t, nvmlPciInfo_t *);
    int (*memory)(nvmlDevice_t, nvmlMemory_t *);
    int (*mig_mode)(nvmlDevice_t, unsigned *, unsigned *);
    int (*mig_max)(nvmlDevice_t, unsigned *);
    int (*mig_handle)(nvmlDevice_t, unsigned, nvmlDevice_t *);
} nvml;

#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_LIBRARY_NOT_FOUND 12
#define NVML_ERROR_LIB_RM_VERSION_MISMATCH 18

static void *need(void *lib, const char *symbol)
{
    void *p = dlsym(lib, symbol);
    if (!p) {
        fprintf(stderr, "NVIDIA-SMI couldn't find %s in libnvidia-ml.so.1.\n", symbol);
        exit(13);
    }
    return p;
}

static int load(void)
{
    char version[96] = "";
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure "
               "that the NVIDIA Display Driver is properly installed and present in your system.\n"
               "Please also try adding directory that contains libnvidia-ml.so to your system PATH.\n");
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    }
    *(void **)&nvml.init = need(lib, "nvmlInit_v2");
    *(void **)&nvml.error = need(lib, "nvmlErrorString");
    *(void **)&nvml.driver = need(lib, "nvmlSystemGetDriverVersion");
    *(void **)&nvml.nvml_version = need(lib, "nvmlSystemGetNVMLVersion");
    *(void **)&nvml.cuda = need(lib, "nvmlSystemGetCudaDriverVersion");
    *(void **)&nvml.count = need(lib, "nvmlDeviceGetCount_v2");
    *(void **)&nvml.handle = need(lib, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nvml.name = need(lib, "nvmlDeviceGetName");
    *(void **)&nvml.uuid = need(lib, "nvmlDeviceGetUUID");
    *(void **)&nvml.pci = need(lib, "nvmlDeviceGetPciInfo_v3");
    *(void **)&nvml.memory = need(lib, "nvmlDeviceGetMemoryInfo");
    *(void **)&nvml.mig_mode = need(lib, "nvmlDeviceGetMigMode");
    *(void **)&nvml.mig_max = need(lib, "nvmlDeviceGetMaxMigDeviceCount");
    *(void **)&nvml.mig_handle = need(lib, "nvmlDeviceGetMigDeviceHandleByIndex");

    int rc = nvml.init();
    if (rc == 0)
        return 0;
    if (rc == NVML_ERROR_DRIVER_NOT_LOADED) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n\n");
    } else {
        printf("Failed to initialize NVML: %s\n", nvml.error(rc));
        if (rc == NVML_ERROR_LIB_RM_VERSION_MISMATCH && nvml.nvml_version(version, sizeof version) == 0)
            printf("NVML library version: %s\n", strchr(version, '.') ? strchr(version, '.') + 1 : version);
    }
    return rc;
}

static int list_gpus(void)
{
    unsigned count = 0;
    nvml.count(&count);
    if (count == 0) {
        printf("No devices found.\n");
        return NVML_ERROR_NOT_FOUND;
    }
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t dev;
        char name[160] = "", uuid[96] = "";
        unsigned current = 0, pending = 0, max = 0;
        if (nvml.handle(i, &dev) != 0)
            continue;
        nvml.name(dev, name, sizeof name);
        nvml.uuid(dev, uuid, sizeof uuid);
        printf("GPU %u: %s (UUID: %s)\n", i, name, uuid);
        if (nvml.mig_mode(dev, &current, &pending) != 0 || !current || nvml.mig_max(dev, &max) != 0)
            continue;
        for (unsigned m = 0; m < max; m++) {
            nvmlDevice_t mig;
            if (nvml.mig_handle(dev, m, &mig) != 0)
                continue;
            nvml.name(mig, name, sizeof name);
            nvml.uuid(mig, uuid, sizeof uuid);
            const char *profile = strstr(name, " MIG ");
            printf("  MIG %-11s Device %2u: (UUID: %s)\n", profile ? profile + 5 : name, m, uuid);
        }
    }
    return 0;
}

static void cuda_text(char *out, size_t len)
{
    int v = 0;
    nvml.cuda(&v);
    snprintf(out, len, "%d.%d", v / 1000, (v % 1000) / 10);
}

/* The GPU count, with the driver's and CUDA's versions; 0, after
   nvidia-smi's message, when there is no GPU. */
static unsigned devices(char *driver, size_t driver_len, char *cuda, size_t cuda_len)
{
    unsigned count = 0;
    nvml.count(&count);
    if (count == 0) {
        printf("No devices were found\n");
        return 0;
    }
    nvml.driver(driver, driver_len);
    cuda_text(cuda, cuda_len);
    return count;
}

static int summary(void)
{
    char driver[64] = "", cuda[16];
    unsigned count = devices(driver, sizeof driver, cuda, sizeof cuda);
    if (count == 0)
        return NVML_ERROR_NOT_FOUND;
    const char *rule = "+-----------------------------------------------------------------------------+";
    printf("%s\n| NVIDIA-SMI %-14s Driver Version: %-14s CUDA Version: %-4s |\n", rule, driver, driver, cuda);
    printf("|-----+-------------------------------+------------------+--------------------|\n");
    printf("| GPU | Name                          | Bus-Id           | Memory      MIG M. |\n");
    printf("|=====+===============================+==================+====================|\n");
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t dev;
        char name[160] = "";
        nvmlPciInfo_t pci;
        nvmlMemory_t mem = {0, 0, 0};
        unsigned current = 0, pending = 0;
        if (nvml.handle(i, &dev) != 0)
            continue;
        nvml.name(dev, name, sizeof name);
        memset(&pci, 0, sizeof pci);
        nvml.pci(dev, &pci);
        nvml.memory(dev, &mem);
        nvml.mig_mode(dev, &current, &pending);
        printf("| %3u | %-29.29s | %-16s | %6lluMiB %-8s |\n", i, name, pci.busId,
               mem.total >> 20, current ? "Enabled" : "Disabled");
    }
    printf("%s\n", rule);
    return 0;
}

/* --query-gpu=index,uuid,name,... --format=csv[,noheader][,nounits] */
static int query(const char *fields, const char *format)
{
    char list[512], driver[64] = "", cuda[16];
    if (!format || strncmp(format, "csv", 3) != 0) {
        printf("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n");
        return 2;
    }
    int header = !strstr(format, "noheader"), units = !strstr(format, "nounits");
    unsigned count = devices(driver, sizeof driver, cuda, sizeof cuda);
    if (count == 0)
        return NVML_ERROR_NOT_FOUND;
    for (int row = header ? -1 : 0; row < (int)count; row++) {
        nvmlDevice_t dev = NULL;
        if (row >= 0 && nvml.handle((unsigned)row, &dev) != 0)
            continue;
        snprintf(list, sizeof list, "%s", fields);
        const char *sep = "";
        for (char *save = NULL, *f = strtok_r(list, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
            char value[160] = "";
            nvmlPciInfo_t pci;
            nvmlMemory_t mem = {0, 0, 0};
            unsigned current = 0, pending = 0;
            if (row < 0) {
                printf("%s%s%s", sep, f, strcmp(f, "memory.total") == 0 && units ? " [MiB]" : "");
            } else {
                if (strcmp(f, "index") == 0)
                    snprintf(value, sizeof value, "%d", row);
                else if (strcmp(f, "uuid") == 0 || strcmp(f, "gpu_uuid") == 0)
                    nvml.uuid(dev, value, sizeof value);
                else if (strcmp(f, "name") == 0 || strcmp(f, "gpu_name") == 0)
                    nvml.name(dev, value, sizeof value);
                else if (strcmp(f, "pci.bus_id") == 0 || strcmp(f, "gpu_bus_id") == 0) {
                    memset(&pci, 0, sizeof pci);
                    nvml.pci(dev, &pci);
                    snprintf(value, sizeof value, "%s", pci.busId);
                } else if (strcmp(f, "driver_version") == 0)
                    snprintf(value, sizeof value, "%s", driver);
                else if (strcmp(f, "memory.total") == 0) {
                    nvml.memory(dev, &mem);
                    snprintf(value, sizeof value, units ? "%llu MiB" : "%llu", mem.total >> 20);
                } else if (strcmp(f, "compute_mode") == 0) {
                    /* The stand-in GPUs have no compute mode to set: they
                       report the driver's default. */
                    snprintf(value, sizeof value, "Default");
                } else if (strcmp(f, "mig.mode.current") == 0) {
                    nvml.mig_mode(dev, &current, &pending);
                    snprintf(value, sizeof value, "%s", current ? "Enabled" : "Disabled");
                } else {
                    printf("Field \"%s\" is not a valid field to query.\n\n", f);
                    return 2;
                }
                printf("%s%s", sep, value);
            }
            sep = ", ";
        }
        printf("\n");
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *fields = NULL, *format = NULL;
    int list = 0, version = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-L") == 0 || strcmp(argv[i], "--list-gpus") == 0)
            list = 1;
        else if (strcmp(argv[i], "--version") == 0)
            version = 1;
        else if (strncmp(argv[i], "--query-gpu=", 12) == 0)
            fields = argv[i] + 12;
        else if (strncmp(argv[i], "--format=", 9) == 0)
            format = argv[i] + 9;
        else {
            printf("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n");
            return 2;
        }
    }
    int rc = load();
    if (rc != 0)
        return rc;
    if (version) {
        char driver[64] = "", cuda[16], lib[96] = "";
        nvml.driver(driver, sizeof driver);
        nvml.nvml_version(lib, sizeof lib);
        cuda_text(cuda, sizeof cuda);
        printf("NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\n"
               "CUDA Version        : %s\n", driver, strchr(lib, '.') ? strchr(lib, '.') + 1 : lib,
               driver, cuda);
        return 0;
    }
    if (fields)
        return query(fields, format);
    return list ? list_gpus() : summary();
}
