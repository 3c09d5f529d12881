/* Leak check of the C API: many cycles of handle / tensor descriptor / op descriptor create, run and destroy
 * for every operator, error paths included (each call's status is checked). Built and run by .ci/sanitize
 * against the ASan+UBSan libraries: the sanitizer's count of allocated bytes must not grow between an early
 * cycle and the last, and LeakSanitizer must find nothing at exit.
 *
 *   create_run_destroy [cycles]      (default 100000; exit 0 when clean)
 */
#include <infiniop.h>
#include <infinirt.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Provided by the sanitizer runtime; NULL (weak) in a build without one, which then checks statuses only. */
extern size_t __sanitizer_get_current_allocated_bytes(void) __attribute__((weak));

#define MAX_TENSORS 8
#define N 2
#define C 3
#define L 8
#define BIG (N * C * L)

static int failures = 0;

static void expect(infiniStatus_t got, infiniStatus_t want, const char *what, long cycle) {
    if (got != want && failures++ < 10) fprintf(stderr, "cycle %ld: %s returned %d, expected %d\n", cycle, what, got, want);
}

/* One operator as this program drives it: tensor shapes in C argument order and entry points taking arrays. */
typedef struct {
    const char *name;
    int tensors, outputs, in_place_input;
    int ndim[MAX_TENSORS];
    size_t shape[MAX_TENSORS][3];
    infiniStatus_t (*create)(infiniopHandle_t, infiniopDescriptor_t *, infiniopTensorDescriptor_t *);
    infiniStatus_t (*workspace)(infiniopDescriptor_t, size_t *);
    infiniStatus_t (*run)(infiniopDescriptor_t, void *, size_t, void **);
    infiniStatus_t (*destroy)(infiniopDescriptor_t);
} Op;

static infiniStatus_t createRms(infiniopHandle_t h, infiniopDescriptor_t *d, infiniopTensorDescriptor_t *t) {
    return infiniopCreateRMSNormBackwardDescriptor(h, d, t[0], t[1], t[2], t[3], t[4]);
}
static infiniStatus_t runRms(infiniopDescriptor_t d, void *ws, size_t size, void **p) {
    return infiniopRMSNormBackward(d, ws, size, p[0], p[1], p[2], p[3], p[4], NULL);
}
static infiniStatus_t createLn(infiniopHandle_t h, infiniopDescriptor_t *d, infiniopTensorDescriptor_t *t) {
    return infiniopCreateLayerNormBackwardDescriptor(h, d, t[0], t[1], t[2], t[3], t[4], t[5], t[6]);
}
static infiniStatus_t runLn(infiniopDescriptor_t d, void *ws, size_t size, void **p) {
    return infiniopLayerNormBackward(d, ws, size, p[0], p[1], p[2], p[3], p[4], p[5], p[6], NULL);
}
static infiniStatus_t createBn(infiniopHandle_t h, infiniopDescriptor_t *d, infiniopTensorDescriptor_t *t) {
    return infiniopCreateBatchNormBackwardDescriptor(h, d, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
}
static infiniStatus_t runBn(infiniopDescriptor_t d, void *ws, size_t size, void **p) {
    return infiniopBatchNormBackward(d, ws, size, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], NULL);
}

static const Op OPS[] = {
    {"RMSNormBackward", 5, 2, 2, {3, 1, 3, 3, 1},
     {{N, C, L}, {L}, {N, C, L}, {N, C, L}, {L}},
     createRms, infiniopGetRMSNormBackwardWorkspaceSize, runRms, infiniopDestroyRMSNormBackwardDescriptor},
    {"LayerNormBackward", 7, 3, 3, {3, 1, 1, 3, 1, 3, 2},
     {{N, C, L}, {L}, {L}, {N, C, L}, {L}, {N, C, L}, {N, C}},
     createLn, infiniopGetLayerNormBackwardWorkspaceSize, runLn, infiniopDestroyLayerNormBackwardDescriptor},
    {"BatchNormBackward", 8, 3, 4, {3, 1, 1, 3, 3, 1, 1, 1},
     {{N, C, L}, {C}, {C}, {N, C, L}, {N, C, L}, {C}, {C}, {C}},
     createBn, infiniopGetBatchNormBackwardWorkspaceSize, runBn, infiniopDestroyBatchNormBackwardDescriptor},
};

/* Tensor descriptors for `op` (dtype for all; `bad_shape` lengthens the second tensor), destroyed right after. */
static infiniStatus_t createOp(const Op *op, infiniopHandle_t handle, infiniopDescriptor_t *desc, infiniDtype_t dtype,
                               int bad_shape, int null_tensor, long cycle) {
    infiniopTensorDescriptor_t tensors[MAX_TENSORS];
    for (int i = 0; i < op->tensors; ++i) {
        size_t shape[3];
        memcpy(shape, op->shape[i], sizeof shape);
        if (bad_shape && i == 1) shape[0] += 1;
        expect(infiniopCreateTensorDescriptor(&tensors[i], op->ndim[i], shape, NULL, dtype), INFINI_STATUS_SUCCESS,
               "infiniopCreateTensorDescriptor", cycle);
    }
    infiniopTensorDescriptor_t kept = tensors[op->tensors - 1];
    if (null_tensor) tensors[op->tensors - 1] = NULL;
    infiniStatus_t status = op->create(handle, desc, tensors);
    tensors[op->tensors - 1] = kept;
    for (int i = 0; i < op->tensors; ++i) {
        expect(infiniopDestroyTensorDescriptor(tensors[i]), INFINI_STATUS_SUCCESS, "infiniopDestroyTensorDescriptor",
               cycle);
    }
    return status;
}

static void cycleOnce(const Op *op, float *data[MAX_TENSORS], unsigned char *workspace, long cycle) {
    infiniopHandle_t handle;
    expect(infiniopCreateHandle(&handle), INFINI_STATUS_SUCCESS, "infiniopCreateHandle", cycle);
    infiniopDescriptor_t desc, other;

    /* Error paths of create. */
    expect(createOp(op, handle, &desc, INFINI_DTYPE_F64, 0, 0, cycle), INFINI_STATUS_BAD_TENSOR_DTYPE, op->name, cycle);
    expect(createOp(op, handle, &desc, INFINI_DTYPE_F32, 1, 0, cycle), INFINI_STATUS_BAD_TENSOR_SHAPE, op->name, cycle);
    expect(createOp(op, handle, &desc, INFINI_DTYPE_F32, 0, 1, cycle), INFINI_STATUS_NULL_POINTER, op->name, cycle);
    infiniopTensorDescriptor_t tensor;
    size_t huge[2] = {(size_t)1 << 62, 4};
    expect(infiniopCreateTensorDescriptor(&tensor, 2, huge, NULL, INFINI_DTYPE_F32), INFINI_STATUS_BAD_TENSOR_SHAPE,
           "huge tensor", cycle);
    expect(infiniopCreateTensorDescriptor(&tensor, 2, huge, NULL, (infiniDtype_t)77), INFINI_STATUS_BAD_TENSOR_DTYPE,
           "dtype 77", cycle);

    /* A good descriptor: run, then the error paths of run. */
    expect(createOp(op, handle, &desc, INFINI_DTYPE_F32, 0, 0, cycle), INFINI_STATUS_SUCCESS, op->name, cycle);
    size_t size = 0;
    expect(op->workspace(desc, &size), INFINI_STATUS_SUCCESS, "workspace size", cycle);
    void *pointers[MAX_TENSORS];
    for (int i = 0; i < op->tensors; ++i) pointers[i] = data[i];
    expect(op->run(desc, workspace, size, pointers), INFINI_STATUS_SUCCESS, "run", cycle);
    if (size > 0) expect(op->run(desc, workspace, size - 1, pointers), INFINI_STATUS_INSUFFICIENT_WORKSPACE, "short", cycle);
    pointers[0] = data[op->in_place_input]; /* in place: allowed */
    expect(op->run(desc, workspace, size, pointers), INFINI_STATUS_SUCCESS, "in place", cycle);
    pointers[0] = data[0];
    pointers[1] = data[op->tensors - 1]; /* a vector output that is a vector input */
    expect(op->run(desc, workspace, size, pointers), INFINI_STATUS_BAD_PARAM, "aliased", cycle);
    pointers[1] = NULL;
    expect(op->run(desc, workspace, size, pointers), INFINI_STATUS_NULL_POINTER, "NULL data", cycle);

    /* Another op's descriptor is refused by this op's functions. */
    const Op *next = &OPS[(op - OPS + 1) % 3];
    expect(createOp(next, handle, &other, INFINI_DTYPE_F32, 0, 0, cycle), INFINI_STATUS_SUCCESS, next->name, cycle);
    expect(op->workspace(other, &size), INFINI_STATUS_BAD_PARAM, "foreign descriptor", cycle);
    expect(op->destroy(other), INFINI_STATUS_BAD_PARAM, "destroy foreign", cycle);
    expect(next->destroy(other), INFINI_STATUS_SUCCESS, "destroy", cycle);

    /* A descriptor outlives its handle: it copied the device at create (under ASan a use after free shows). */
    expect(infiniopDestroyHandle(handle), INFINI_STATUS_SUCCESS, "infiniopDestroyHandle", cycle);
    pointers[1] = data[1];
    expect(op->workspace(desc, &size), INFINI_STATUS_SUCCESS, "workspace size after the handle's destroy", cycle);
    expect(op->run(desc, workspace, size, pointers), INFINI_STATUS_SUCCESS, "run after the handle's destroy", cycle);
    expect(op->destroy(desc), INFINI_STATUS_SUCCESS, "destroy", cycle);
    expect(op->destroy(NULL), INFINI_STATUS_NULL_POINTER, "destroy NULL", cycle);
}

int main(int argc, char **argv) {
    long cycles = argc > 1 ? atol(argv[1]) : 100000;
    float *data[MAX_TENSORS];
    for (int i = 0; i < MAX_TENSORS; ++i) {
        data[i] = malloc(BIG * sizeof(float));
        for (int j = 0; j < BIG; ++j) data[i][j] = 1.0f + (float)((i * 7 + j) % 5); /* positive: valid variances */
    }
    unsigned char *workspace = malloc(1 << 20);
    size_t early = 0;
    for (long cycle = 0; cycle < cycles; ++cycle) {
        for (int k = 0; k < 3; ++k) cycleOnce(&OPS[k], data, workspace, cycle);
        if (cycle == 1000 && __sanitizer_get_current_allocated_bytes) early = __sanitizer_get_current_allocated_bytes();
    }
    long growth = 0;
    if (__sanitizer_get_current_allocated_bytes && cycles > 1000) {
        growth = (long)__sanitizer_get_current_allocated_bytes() - (long)early;
        printf("%ld cycles x 3 operators; allocated bytes from cycle 1000 to the end: %+ld\n", cycles, growth);
    } else {
        printf("%ld cycles x 3 operators (no sanitizer allocator counter in this build)\n", cycles);
    }
    for (int i = 0; i < MAX_TENSORS; ++i) free(data[i]);
    free(workspace);
    if (failures) fprintf(stderr, "%d unexpected statuses\n", failures);
    if (growth > 0) fprintf(stderr, "allocated bytes grew by %ld\n", growth);
    return failures || growth > 0 ? 1 : 0;
}
