/* The packing calls that tools/nvml/gen_shim.py's generated functions make (runtime.c). */
#ifndef TSIM_RUNTIME_H
#define TSIM_RUNTIME_H
#include <stddef.h>
#include <stdint.h>

#include "nvml.h"

#define TSIM_MAX_POINTERS 8
/* Built with -fvisibility=hidden: only the NVML entry points are exported. */
#define TSIM_EXPORT __attribute__((visibility("default")))

struct tsim_call {
    uint8_t buffer[8192];
    size_t length;
    int overflow;
    const char *name;
    void *targets[TSIM_MAX_POINTERS];
    size_t capacities[TSIM_MAX_POINTERS];
    uint8_t pointers;
};

void tsim_begin(struct tsim_call *c, const char *name, uint8_t count);
void tsim_value(struct tsim_call *c, uint64_t value);
void tsim_handle(struct tsim_call *c, const void *handle, size_t size);
void tsim_string(struct tsim_call *c, const char *text);
void tsim_pointer(struct tsim_call *c, void *pointer, const void *input, size_t input_size,
                  size_t capacity);
nvmlReturn_t tsim_finish(struct tsim_call *c);
#endif
