/*
 * The transport of libnvidia-ml.so.1 for simulated GPUs (see tessera.nvml.sim.server).
 *
 * Every exported NVML function (generated into shim.c from tessera.nvml.sim.abi) packs its
 * arguments with tsim_* below, sends them over a Unix socket to the simulator and writes back
 * what it answers. Nothing here knows a GPU: the simulator's rules live once, in Python.
 *
 * The socket is $TESSERA_NVML_SIM_SOCKET, or TSIM_DEFAULT_SOCKET (set at build time). Each
 * thread has its own connection, so a thread blocked in nvmlEventSetWait_v2 does not hold up
 * the others; the server groups a process's connections into one session by its pid. With no
 * server, nvmlInit_v2 returns NVML_ERROR_DRIVER_NOT_LOADED, as on a node without a driver.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "nvml.h"
#include "runtime.h"

#ifndef TSIM_DEFAULT_SOCKET
#define TSIM_DEFAULT_SOCKET "/var/lib/tessera-sim/nvml.sock"
#endif

static __thread int tsim_fd = -1;
static int tsim_ever_connected = 0;

static int tsim_connect(void) {
    if (tsim_fd >= 0)
        return tsim_fd;
    const char *path = getenv("TESSERA_NVML_SIM_SOCKET");
    if (path == NULL || path[0] == '\0')
        path = TSIM_DEFAULT_SOCKET;
    struct sockaddr_un address;
    memset(&address, 0, sizeof address);
    address.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof address.sun_path)
        return -1;
    strcpy(address.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        close(fd);
        return -1;
    }
    tsim_fd = fd;
    return fd;
}

static void tsim_disconnect(void) {
    if (tsim_fd >= 0)
        close(tsim_fd);
    tsim_fd = -1;
}

static void tsim_put(struct tsim_call *c, const void *data, size_t size) {
    if (c->length + size > sizeof c->buffer) {
        c->overflow = 1;
        return;
    }
    memcpy(c->buffer + c->length, data, size);
    c->length += size;
}

static void tsim_put_u32(struct tsim_call *c, uint32_t value) { tsim_put(c, &value, 4); }

void tsim_begin(struct tsim_call *c, const char *name, uint8_t count) {
    c->length = 4; /* the frame's length goes first, filled in by tsim_finish */
    c->overflow = 0;
    c->pointers = 0;
    c->name = name;
    uint16_t size = (uint16_t)strlen(name);
    tsim_put(c, &size, 2);
    tsim_put(c, name, size);
    tsim_put(c, &count, 1);
}

void tsim_value(struct tsim_call *c, uint64_t value) {
    tsim_put(c, "v", 1);
    tsim_put(c, &value, 8);
}

void tsim_handle(struct tsim_call *c, const void *handle, size_t size) {
    uint64_t bits = 0;
    memcpy(&bits, handle, size < sizeof bits ? size : sizeof bits);
    tsim_value(c, bits);
}

void tsim_string(struct tsim_call *c, const char *text) {
    if (text == NULL) {
        tsim_put(c, "n", 1);
        return;
    }
    tsim_put(c, "s", 1);
    tsim_put_u32(c, (uint32_t)strlen(text));
    tsim_put(c, text, strlen(text));
}

void tsim_pointer(struct tsim_call *c, void *pointer, const void *input, size_t input_size,
                  size_t capacity) {
    if (c->pointers >= TSIM_MAX_POINTERS) {
        c->overflow = 1;
        return;
    }
    c->targets[c->pointers] = pointer;
    c->capacities[c->pointers] = pointer == NULL ? 0 : capacity;
    c->pointers++;
    if (pointer == NULL) {
        tsim_put(c, "n", 1);
        return;
    }
    tsim_put(c, "p", 1);
    tsim_put_u32(c, (uint32_t)input_size);
    if (input_size)
        tsim_put(c, input, input_size);
}

static int tsim_write_all(int fd, const uint8_t *data, size_t size) {
    while (size) {
        ssize_t sent = send(fd, data, size, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent <= 0)
            return -1;
        data += sent;
        size -= (size_t)sent;
    }
    return 0;
}

static int tsim_read_all(int fd, uint8_t *data, size_t size) {
    while (size) {
        ssize_t got = recv(fd, data, size, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        data += got;
        size -= (size_t)got;
    }
    return 0;
}

static int tsim_is_init(const char *name) {
    return strcmp(name, "nvmlInit_v2") == 0 || strcmp(name, "nvmlInitWithFlags") == 0;
}

/* Send the call, wait for the answer, write each pointer's bytes back; the NVML return code. */
nvmlReturn_t tsim_finish(struct tsim_call *c) {
    if (c->overflow)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t frame = (uint32_t)(c->length - 4);
    memcpy(c->buffer, &frame, 4);
    uint8_t header[4];
    int fd = -1;
    /* An init may find this thread's connection dead (the simulator restarted): it starts a
     * new session on a new connection, as nvmlInit after a driver reload would. Any other call
     * on a dead connection fails: its handles belonged to the old session. */
    for (int attempt = 0; attempt < 2; attempt++) {
        fd = tsim_connect();
        if (fd < 0) {
            if (tsim_is_init(c->name))
                return NVML_ERROR_DRIVER_NOT_LOADED;
            return __atomic_load_n(&tsim_ever_connected, __ATOMIC_RELAXED)
                       ? NVML_ERROR_UNKNOWN : NVML_ERROR_UNINITIALIZED;
        }
        if (tsim_write_all(fd, c->buffer, c->length) == 0 && tsim_read_all(fd, header, 4) == 0)
            break;
        tsim_disconnect();
        if (!tsim_is_init(c->name) || attempt == 1)
            return NVML_ERROR_UNKNOWN;
    }
    uint32_t length;
    memcpy(&length, header, 4);
    uint8_t *reply = malloc(length ? length : 1);
    if (reply == NULL)
        return NVML_ERROR_MEMORY;
    if (length < 5 || tsim_read_all(fd, reply, length) != 0) {
        free(reply);
        tsim_disconnect();
        return NVML_ERROR_UNKNOWN;
    }
    __atomic_store_n(&tsim_ever_connected, 1, __ATOMIC_RELAXED);
    int32_t code;
    memcpy(&code, reply, 4);
    uint8_t blobs = reply[4];
    size_t offset = 5;
    for (uint8_t i = 0; i < blobs && i < c->pointers; i++) {
        uint32_t size;
        if (offset + 4 > length)
            break;
        memcpy(&size, reply + offset, 4);
        offset += 4;
        if (offset + size > length)
            break;
        if (c->targets[i] != NULL && size) {
            /* never past what the caller said it holds, whatever the server sends */
            memcpy(c->targets[i], reply + offset, size < c->capacities[i] ? size : c->capacities[i]);
        }
        offset += size;
    }
    free(reply);
    return (nvmlReturn_t)code;
}

/* Error strings come from the simulator too; each is kept for the life of the process. */
static pthread_mutex_t tsim_strings_lock = PTHREAD_MUTEX_INITIALIZER;
static char *tsim_strings[1024];

TSIM_EXPORT const char *DECLDIR nvmlErrorString(nvmlReturn_t result) {
    unsigned index = (unsigned)result < 1023 ? (unsigned)result : 1023;
    pthread_mutex_lock(&tsim_strings_lock);
    char *text = tsim_strings[index];
    pthread_mutex_unlock(&tsim_strings_lock);
    if (text != NULL)
        return text;
    static char unknown[] = "Unknown Error";
    char buffer[256] = {0};
    struct tsim_call c;
    tsim_begin(&c, "nvmlErrorString", 1);
    tsim_value(&c, (uint64_t)(unsigned)result);
    tsim_pointer(&c, buffer, NULL, 0, sizeof buffer - 1);
    /* the pointer above is ours, not the caller's: the server answers with the text */
    if (tsim_finish(&c) != NVML_SUCCESS || buffer[0] == '\0')
        return unknown;
    text = strdup(buffer);
    if (text == NULL)
        return unknown;
    pthread_mutex_lock(&tsim_strings_lock);
    if (tsim_strings[index] == NULL && index < 1023)
        tsim_strings[index] = text;
    else {
        free(text);
        text = tsim_strings[index] ? tsim_strings[index] : unknown;
    }
    pthread_mutex_unlock(&tsim_strings_lock);
    return text;
}
