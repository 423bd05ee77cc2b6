/* The tool's one use of the CUDA runtime outside the bench: run a linear
 * that lives on a CUDA device on host buffers (copy in, forward, copy out). */
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "commands.h"
#include "core/core.h"

ql_status ql_tool_device_forward(ql_linear *lin, const void *x, ql_dtype xdt, int64_t m, int64_t k, void *y,
                                 ql_dtype ydt, int64_t n)
{
    const size_t xb = (size_t)(m * k) * ql_dtype_size(xdt), yb = (size_t)(m * n) * ql_dtype_size(ydt);
    void *dx = NULL, *dy = NULL;
    cudaError_t e = cudaMalloc(&dx, xb ? xb : 16);
    if (e == cudaSuccess) e = cudaMalloc(&dy, yb ? yb : 16);
    if (e == cudaSuccess) e = cudaMemcpy(dx, x, xb, cudaMemcpyHostToDevice);
    ql_status st = QL_OK;
    if (e == cudaSuccess) {
        st = ql_linear_forward(lin, dx, xdt, m, k, dy, ydt, n, NULL);
        if (st == QL_OK) e = cudaMemcpy(y, dy, yb, cudaMemcpyDeviceToHost); /* waits for the forward */
    }
    cudaFree(dx);
    cudaFree(dy);
    if (st != QL_OK) return st;
    if (e != cudaSuccess)
        return ql_fail(QL_ERR_UNSUPPORTED, "qlinear forward --device cuda: %s", cudaGetErrorString(e));
    return QL_OK;
}
