/* Gather/scatter of whole cache blocks between paged planes and a contiguous chunk, for host memory.
 *
 * One call moves every row of every plane of a chunk. The (plane, row) pairs are split evenly over
 * `threads` OpenMP threads and each pair is one memcpy of `row_bytes`, so the copy runs at memory bandwidth
 * with one call per chunk instead of one per plane. Block numbers are checked against `num_blocks`; a bad
 * one stops the call before anything is copied and its position is returned.
 *
 * Returns 0 on success, or 1 + the position in `index` of the first block number out of range.
 */
#include <stdint.h>
#include <string.h>

int64_t kvstore_copy_rows_cpu(const int64_t *plane_ptrs, int64_t planes, int64_t row_stride, int64_t row_bytes,
                              const int64_t *index, int64_t rows, int64_t num_blocks, uint8_t *chunk,
                              int to_chunk, int threads) {
    for (int64_t r = 0; r < rows; ++r) {
        if (index[r] < 0 || index[r] >= num_blocks) return r + 1;
    }
    const int64_t total = planes * rows;
    if (threads < 1) threads = 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t i = 0; i < total; ++i) {
        const int64_t p = i / rows, r = i % rows;
        uint8_t *row = (uint8_t *)(intptr_t)plane_ptrs[p] + index[r] * row_stride;
        uint8_t *slot = chunk + i * row_bytes;
        if (to_chunk) {
            memcpy(slot, row, (size_t)row_bytes);
        } else {
            memcpy(row, slot, (size_t)row_bytes);
        }
    }
    return 0;
}
