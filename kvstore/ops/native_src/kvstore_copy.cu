/* Gather/scatter of whole cache blocks between paged planes and a contiguous chunk, on the GPU.
 *
 * One launch moves a whole chunk: grid (rows, planes), one thread block per (row, plane), each thread block
 * copying one `row_bytes` row with 16-byte vector loads and stores when every address and size is 16-byte
 * aligned (the caller says so), bytes otherwise. A row of a typical model is 16-64 KiB, so every thread
 * block streams several KiB and the copy is bound by HBM bandwidth, not by launches. Block numbers outside
 * [0, num_blocks) are skipped, so a bad index never writes outside the cache.
 *
 * The plane pointer table and the index live in device memory; the kernel runs on the caller's stream, so
 * the caller orders it with events like any other work.
 */
#include <cuda_runtime.h>
#include <stdint.h>

template <typename V>
__global__ void copy_rows_kernel(const int64_t *__restrict__ plane_ptrs, int64_t row_stride, int64_t row_units,
                                 const int64_t *__restrict__ index, int64_t rows, int64_t num_blocks,
                                 V *__restrict__ chunk, int to_chunk) {
    const int64_t r = blockIdx.x;
    const int64_t p = blockIdx.y;
    const int64_t block = index[r];
    if (block < 0 || block >= num_blocks) return;
    V *row = reinterpret_cast<V *>(reinterpret_cast<char *>(plane_ptrs[p]) + block * row_stride);
    V *slot = chunk + (p * rows + r) * row_units;
    if (to_chunk) {
#pragma unroll 4
        for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) slot[i] = row[i];
    } else {
#pragma unroll 4
        for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) row[i] = slot[i];
    }
}

extern "C" int kvstore_copy_rows_cuda(const int64_t *plane_ptrs, int64_t planes, int64_t row_stride,
                                      int64_t row_bytes, const int64_t *index, int64_t rows, int64_t num_blocks,
                                      void *chunk, int to_chunk, int vec16, void *stream) {
    if (rows == 0 || planes == 0) return 0;
    if (planes > 65535) return (int)cudaErrorInvalidValue;
    const dim3 grid((unsigned)rows, (unsigned)planes);
    const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    if (vec16) {
        const int64_t units = row_bytes / 16;
        const int threads = units >= 512 ? 512 : (units >= 128 ? 128 : 32);
        copy_rows_kernel<uint4><<<grid, threads, 0, s>>>(plane_ptrs, row_stride, units, index, rows, num_blocks,
                                                         reinterpret_cast<uint4 *>(chunk), to_chunk);
    } else {
        copy_rows_kernel<uint8_t><<<grid, 256, 0, s>>>(plane_ptrs, row_stride, row_bytes, index, rows, num_blocks,
                                                       reinterpret_cast<uint8_t *>(chunk), to_chunk);
    }
    return (int)cudaGetLastError();
}
