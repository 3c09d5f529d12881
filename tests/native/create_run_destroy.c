/* Leak check of the C API: many cycles of handle / tensor descriptor / op descriptor create, run and destroy
 * for every operator, forwards (their seed and Ex forms on alternate cycles) and backwards, error paths included
 * (each call's status is checked). Built and run by .ci/sanitize
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
#define FAMILIES 6 /* OPS: the six operators, then the Ex forms of the three forwards */
#define OP_COUNT 9

static int failures = 0;

static void expect(infiniStatus_t got, infiniStatus_t want, const char *what, long cycle) {
    if (got != want && failures++ < 10) fprintf(stderr, "cycle %ld: %s returned %d, expected %d\n", cycle, what, got, want);
}

/* One operator as this program drives it: tensor shapes in C argument order and entry points taking arrays.
 * f64: what its create returns for F64 tensors; null_last: for a NULL last tensor (an optional bias is SUCCESS);
 * alias_output: an output that the run refuses (BAD_PARAM) to find at the last tensor's data. */
typedef struct {
    const char *name;
    int tensors, outputs, in_place_input, alias_output;
    infiniStatus_t f64, null_last;
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

static infiniStatus_t createRmsF(infiniopHandle_t h, infiniopDescriptor_t *d, infiniopTensorDescriptor_t *t) {
    return infiniopCreateRMSNormDescriptor(h, d, t[0], t[1], t[2], 1e-5f);
}
static infiniStatus_t runRmsF(infiniopDescriptor_t d, void *ws, size_t size, void **p) {
    return infiniopRMSNorm(d, ws, size, p[0], p[1], p[2], NULL);
}
static infiniStatus_t createRmsFEx(infiniopHandle_t h, infiniopDescriptor_t *d, infiniopTensorDescriptor_t *t) {
    return infiniopCreateRMSNormDescriptorEx(h, d, t[0], t[1], t[2], t[3], 1e-5);
}
static infiniStatus_t runRmsFEx(infiniopDescriptor_t d, void *ws, size_t size, void **p) {
    return infiniopRMSNormEx(d, ws, size, p[0], p[1], p[2], p[3], NULL);
}
static infiniStatus_t createLnF(infiniopHandle_t h, infiniopDescriptor_t *d, infiniopTensorDescriptor_t *t) {
    return infiniopCreateLayerNormDescriptor(h, d, t[0], t[1], t[2], t[3], t[4], t[5], 1e-5f);
}
static infiniStatus_t runLnF(infiniopDescriptor_t d, void *ws, size_t size, void **p) {
    return infiniopLayerNorm(d, ws, size, p[0], p[1], p[2], p[3], p[4], p[5], NULL);
}
static infiniStatus_t createLnFEx(infiniopHandle_t h, infiniopDescriptor_t *d, infiniopTensorDescriptor_t *t) {
    return infiniopCreateLayerNormDescriptorEx(h, d, t[0], t[1], t[2], t[3], t[4], t[5], 1e-5);
}
static infiniStatus_t runLnFEx(infiniopDescriptor_t d, void *ws, size_t size, void **p) {
    return infiniopLayerNormEx(d, ws, size, p[0], p[1], p[2], p[3], p[4], p[5], NULL);
}
static infiniStatus_t createBnF(infiniopHandle_t h, infiniopDescriptor_t *d, infiniopTensorDescriptor_t *t) {
    return infiniopCreateBatchNormDescriptor(h, d, t[0], t[1], t[2], t[3], t[4], t[5], 0.1f, 1e-5f);
}
static infiniStatus_t runBnF(infiniopDescriptor_t d, void *ws, size_t size, void **p) {
    return infiniopBatchNorm(d, ws, size, p[0], p[1], p[2], p[3], p[4], p[5], NULL);
}
static infiniStatus_t createBnFEx(infiniopHandle_t h, infiniopDescriptor_t *d, infiniopTensorDescriptor_t *t) {
    return infiniopCreateBatchNormDescriptorEx(h, d, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], 1, 0.1, 1e-5);
}
static infiniStatus_t runBnFEx(infiniopDescriptor_t d, void *ws, size_t size, void **p) {
    return infiniopBatchNormEx(d, ws, size, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], NULL);
}

#define BAD_DTYPE INFINI_STATUS_BAD_TENSOR_DTYPE
#define NULL_PTR INFINI_STATUS_NULL_POINTER
#define OK INFINI_STATUS_SUCCESS

static const Op OPS[OP_COUNT] = {
    {"RMSNormBackward", 5, 2, 2, 1, BAD_DTYPE, NULL_PTR, {3, 1, 3, 3, 1},
     {{N, C, L}, {L}, {N, C, L}, {N, C, L}, {L}},
     createRms, infiniopGetRMSNormBackwardWorkspaceSize, runRms, infiniopDestroyRMSNormBackwardDescriptor},
    {"LayerNormBackward", 7, 3, 3, 1, BAD_DTYPE, NULL_PTR, {3, 1, 1, 3, 1, 3, 2},
     {{N, C, L}, {L}, {L}, {N, C, L}, {L}, {N, C, L}, {N, C}},
     createLn, infiniopGetLayerNormBackwardWorkspaceSize, runLn, infiniopDestroyLayerNormBackwardDescriptor},
    {"BatchNormBackward", 8, 3, 4, 1, BAD_DTYPE, NULL_PTR, {3, 1, 1, 3, 3, 1, 1, 1},
     {{N, C, L}, {C}, {C}, {N, C, L}, {N, C, L}, {C}, {C}, {C}},
     createBn, infiniopGetBatchNormBackwardWorkspaceSize, runBn, infiniopDestroyBatchNormBackwardDescriptor},
    /* The forwards: y, x, w (seed, w required). */
    {"RMSNorm", 3, 1, 1, 0, OK, NULL_PTR, {3, 3, 1},
     {{N, C, L}, {N, C, L}, {L}},
     createRmsF, infiniopGetRMSNormWorkspaceSize, runRmsF, infiniopDestroyRMSNormDescriptor},
    /* output, input_standardization, input_std_deviation, input, weight, bias (may be NULL) */
    {"LayerNorm", 6, 3, 3, 1, OK, OK, {3, 3, 2, 3, 1, 1},
     {{N, C, L}, {N, C, L}, {N, C}, {N, C, L}, {L}, {L}},
     createLnF, infiniopGetLayerNormWorkspaceSize, runLnF, infiniopDestroyLayerNormDescriptor},
    /* output, running_mean, running_var (in/out), input, weight, bias (all required; the documentation's dtypes,
     * F16/F32/BF16: batch_norm/info.h and docs/api.md, whatever the public header's comment says of F64) */
    {"BatchNorm", 6, 3, 3, 1, BAD_DTYPE, NULL_PTR, {3, 1, 1, 3, 1, 1},
     {{N, C, L}, {C}, {C}, {N, C, L}, {C}, {C}},
     createBnF, infiniopGetBatchNormWorkspaceSize, runBnF, infiniopDestroyBatchNormDescriptor},
    /* The Ex forms. y, rstd, x, w */
    {"RMSNormEx", 4, 2, 2, 1, OK, NULL_PTR, {3, 2, 3, 1},
     {{N, C, L}, {N, C}, {N, C, L}, {L}},
     createRmsFEx, infiniopGetRMSNormWorkspaceSize, runRmsFEx, infiniopDestroyRMSNormDescriptor},
    /* y, mean, rstd, x, w, b (may be NULL) */
    {"LayerNormEx", 6, 3, 3, 1, OK, OK, {3, 2, 2, 3, 1, 1},
     {{N, C, L}, {N, C}, {N, C}, {N, C, L}, {L}, {L}},
     createLnFEx, infiniopGetLayerNormWorkspaceSize, runLnFEx, infiniopDestroyLayerNormDescriptor},
    /* y, save_mean, save_invstd, running_mean, running_var, x, weight, bias (may be NULL), training */
    {"BatchNormEx", 8, 5, 5, 1, OK, OK, {3, 1, 1, 1, 1, 3, 1, 1},
     {{N, C, L}, {C}, {C}, {C}, {C}, {N, C, L}, {C}, {C}},
     createBnFEx, infiniopGetBatchNormWorkspaceSize, runBnFEx, infiniopDestroyBatchNormDescriptor},
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

    size_t size = 0;
    void *pointers[MAX_TENSORS];
    for (int i = 0; i < op->tensors; ++i) pointers[i] = data[i];

    /* Error paths of create, and the creates that succeed where a backward's fail: F64, a NULL optional bias. */
    expect(createOp(op, handle, &desc, INFINI_DTYPE_I32, 0, 0, cycle), INFINI_STATUS_BAD_TENSOR_DTYPE, op->name, cycle);
    infiniStatus_t status = createOp(op, handle, &desc, INFINI_DTYPE_F64, 0, 0, cycle);
    expect(status, op->f64, "create with F64", cycle);
    if (status == INFINI_STATUS_SUCCESS) {
        expect(op->workspace(desc, &size), INFINI_STATUS_SUCCESS, "F64 workspace size", cycle);
        expect(op->destroy(desc), INFINI_STATUS_SUCCESS, "F64 destroy", cycle);
    }
    expect(createOp(op, handle, &desc, INFINI_DTYPE_F32, 1, 0, cycle), INFINI_STATUS_BAD_TENSOR_SHAPE, op->name, cycle);
    status = createOp(op, handle, &desc, INFINI_DTYPE_F32, 0, 1, cycle);
    expect(status, op->null_last, "create with a NULL last tensor", cycle);
    if (status == INFINI_STATUS_SUCCESS) { /* runs without it: its pointer is ignored */
        expect(op->workspace(desc, &size), INFINI_STATUS_SUCCESS, "workspace size without the last tensor", cycle);
        pointers[op->tensors - 1] = NULL;
        expect(op->run(desc, workspace, size, pointers), INFINI_STATUS_SUCCESS, "run without the last tensor", cycle);
        pointers[op->tensors - 1] = data[op->tensors - 1];
        expect(op->destroy(desc), INFINI_STATUS_SUCCESS, "destroy", cycle);
    }
    infiniopTensorDescriptor_t tensor;
    size_t huge[2] = {(size_t)1 << 62, 4};
    expect(infiniopCreateTensorDescriptor(&tensor, 2, huge, NULL, INFINI_DTYPE_F32), INFINI_STATUS_BAD_TENSOR_SHAPE,
           "huge tensor", cycle);
    expect(infiniopCreateTensorDescriptor(&tensor, 2, huge, NULL, (infiniDtype_t)77), INFINI_STATUS_BAD_TENSOR_DTYPE,
           "dtype 77", cycle);

    /* A good descriptor: run, then the error paths of run. */
    expect(createOp(op, handle, &desc, INFINI_DTYPE_F32, 0, 0, cycle), INFINI_STATUS_SUCCESS, op->name, cycle);
    expect(op->workspace(desc, &size), INFINI_STATUS_SUCCESS, "workspace size", cycle);
    expect(op->run(desc, workspace, size, pointers), INFINI_STATUS_SUCCESS, "run", cycle);
    if (size > 0) expect(op->run(desc, workspace, size - 1, pointers), INFINI_STATUS_INSUFFICIENT_WORKSPACE, "short", cycle);
    pointers[0] = data[op->in_place_input]; /* in place: allowed */
    expect(op->run(desc, workspace, size, pointers), INFINI_STATUS_SUCCESS, "in place", cycle);
    pointers[0] = data[0];
    pointers[op->alias_output] = data[op->tensors - 1]; /* an output that is a vector input */
    expect(op->run(desc, workspace, size, pointers), INFINI_STATUS_BAD_PARAM, "aliased", cycle);
    pointers[op->alias_output] = data[op->alias_output];
    pointers[1] = NULL;
    expect(op->run(desc, workspace, size, pointers), INFINI_STATUS_NULL_POINTER, "NULL data", cycle);

    /* Another op's descriptor is refused by this op's functions. */
    const Op *next = &OPS[((op - OPS) % FAMILIES + 1) % FAMILIES]; /* the next operator, never this one */
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
        for (int k = 0; k < FAMILIES; ++k) {
            /* A forward's seed form on even cycles, its Ex form on odd ones. */
            const int index = k >= 3 && cycle % 2 == 1 ? k + 3 : k;
            cycleOnce(&OPS[index], data, workspace, cycle);
        }
        if (cycle == 1000 && __sanitizer_get_current_allocated_bytes) early = __sanitizer_get_current_allocated_bytes();
    }
    long growth = 0;
    if (__sanitizer_get_current_allocated_bytes && cycles > 1000) {
        growth = (long)__sanitizer_get_current_allocated_bytes() - (long)early;
        printf("%ld cycles x 6 operators; allocated bytes from cycle 1000 to the end: %+ld\n", cycles, growth);
    } else {
        printf("%ld cycles x 6 operators (no sanitizer allocator counter in this build)\n", cycles);
    }
    for (int i = 0; i < MAX_TENSORS; ++i) free(data[i]);
    free(workspace);
    if (failures) fprintf(stderr, "%d unexpected statuses\n", failures);
    if (growth > 0) fprintf(stderr, "allocated bytes grew by %ld\n", growth);
    return failures || growth > 0 ? 1 : 0;
}
