#ifndef INFINIOP_HANDLE_H
#define INFINIOP_HANDLE_H

#include "../infinicore.h"

typedef struct InfiniopHandle *infiniopHandle_t;

/* The handle is bound to the device last selected with infinirtSetDevice on this thread (CPU if none). An operator
 * descriptor copies the device from it at create and never reads it again: the handle may be destroyed first. */
__C __export infiniStatus_t infiniopCreateHandle(infiniopHandle_t *handle_ptr);
__C __export infiniStatus_t infiniopDestroyHandle(infiniopHandle_t handle);

#endif /* INFINIOP_HANDLE_H */
