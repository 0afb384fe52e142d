/* Gather/scatter of whole cache blocks between paged planes and a contiguous chunk, on the GPU.
 *
 * Compiled at first use by NVRTC through cupy.RawModule (kvstore/native/cuda.py), so this file is device code
 * only: no host launcher, no headers (NVRTC has none of the host's), the CUDA vector type uint4 built in.
 *
 * One launch moves a whole chunk: grid (rows, planes), one thread block per (row, plane), each thread block
 * copying one `row_units`-long row with 16-byte vector loads and stores when every address and size is 16-byte
 * aligned (the caller checks and picks kvstore_copy_rows_vec16), bytes otherwise (kvstore_copy_rows_bytes).
 * A row of a model's cache block is many kilobytes, so every thread block streams a long run of memory and the
 * copy is bound by memory bandwidth rather than by launches. Block numbers outside [0, num_blocks) are skipped,
 * so a bad index never writes outside the cache.
 *
 * The plane pointer table and the index live in device memory; the kernel runs on the caller's stream, so the
 * caller orders it with events like any other work.
 */

template <typename V>
__device__ void copy_rows(const long long *__restrict__ plane_ptrs, long long row_stride, long long row_units,
                          const long long *__restrict__ index, long long rows, long long num_blocks,
                          V *__restrict__ chunk, int to_chunk) {
    const long long r = blockIdx.x;
    const long long p = blockIdx.y;
    const long long block = index[r];
    if (block < 0 || block >= num_blocks) return;
    V *row = reinterpret_cast<V *>(reinterpret_cast<char *>(plane_ptrs[p]) + block * row_stride);
    V *slot = chunk + (p * rows + r) * row_units;
    if (to_chunk) {
#pragma unroll 4
        for (long long i = threadIdx.x; i < row_units; i += blockDim.x) slot[i] = row[i];
    } else {
#pragma unroll 4
        for (long long i = threadIdx.x; i < row_units; i += blockDim.x) row[i] = slot[i];
    }
}

extern "C" __global__ void kvstore_copy_rows_vec16(const long long *plane_ptrs, long long row_stride,
                                                   long long row_units, const long long *index, long long rows,
                                                   long long num_blocks, uint4 *chunk, int to_chunk) {
    copy_rows<uint4>(plane_ptrs, row_stride, row_units, index, rows, num_blocks, chunk, to_chunk);
}

extern "C" __global__ void kvstore_copy_rows_bytes(const long long *plane_ptrs, long long row_stride,
                                                   long long row_units, const long long *index, long long rows,
                                                   long long num_blocks, unsigned char *chunk, int to_chunk) {
    copy_rows<unsigned char>(plane_ptrs, row_stride, row_units, index, rows, num_blocks, chunk, to_chunk);
}
