/* The reader's walk of a key chain through the daemon's published lookup index (protocol/index_layout.py), and
 * the writer's placement of a batch of new keys in it (kvstore_index_place, at the end).
 *
 * The same walk as kvstore/mapped/index_reader.py's, a key at a time: linear probing from key_lo & mask, at most
 * max_probe slots; per slot a sequence-lock read (seq, the slot, seq again; an odd or moved seq means the writer
 * is in it). Loads are issued in program order (volatile) and x86-64 does not reorder loads with loads, which is
 * what the lock needs; the index is offered on x86-64 only.
 *
 * Keys are listed bound to their namespace (kvstore/binding.py): the walk binds each key it is given with one XOR
 * of its low half by `ns_mask`, as the daemon did before listing it.
 *
 * `index` is the mapped file; the table starts `header_bytes` into it. For each leading listed key, out[4 * i ..] =
 * the slot's byte offset in the file, seq, host, size (out may be NULL: a lookup needs none of it), and
 * counts[state] is how many of them each tier (state) holds.
 * Returns how many leading keys are listed (*missed = 1 when the walk stopped at a key that is not), -1 when a
 * slot changed under the read (try again), -2 when a key was probed max_probe slots without an answer (the
 * socket must answer).
 */
#include <stdint.h>

/* The calling convention of this library's functions: kvstore/native/__init__.py refuses a library built from
 * other sources (an older build left in place) rather than call it with arguments it does not take.
 * 2: the walks bind keys to their namespace (ns_mask). */
int64_t kvstore_index_abi(void) { return 2; }

#define SLOT_WORDS 8
#define EMPTY 0
#define TOMBSTONE 1
#define DISK 2
#define STATES 5   /* EMPTY, TOMBSTONE, DISK, HOST, GPU */

int64_t kvstore_index_walk(const volatile uint64_t *index, uint64_t header_bytes, uint64_t mask,
                           const uint64_t *keys, int64_t n, int64_t max_probe, uint64_t *out, uint64_t *counts,
                           int64_t *missed, uint64_t ns_mask) {
    const volatile uint64_t *table = index + header_bytes / 8;
    *missed = 0;
    for (int k = 0; k < STATES; ++k) counts[k] = 0;
    for (int64_t i = 0; i < n; ++i) {
        const uint64_t lo = keys[2 * i] ^ ns_mask, hi = keys[2 * i + 1];
        uint64_t slot = lo & mask;
        int64_t probe = 0;
        for (; probe < max_probe; ++probe, slot = (slot + 1) & mask) {
            const volatile uint64_t *s = table + slot * SLOT_WORDS;
            const uint64_t seq = s[0];
            const uint64_t klo = s[1], khi = s[2], state = s[3], host = s[4], size = s[5];
            if ((seq & 1) || s[0] != seq) return -1;
            if (klo == lo && khi == hi && state >= DISK && state < STATES) {
                if (out) {
                    uint64_t *o = out + 4 * i;
                    o[0] = header_bytes + slot * SLOT_WORDS * 8;
                    o[1] = seq;
                    o[2] = host;
                    o[3] = size;
                }
                counts[state] += 1;
                break;
            }
            if (state == EMPTY) {
                *missed = 1;
                return i;
            }
        }
        if (probe == max_probe) return -2;
    }
    return n;
}

/* A whole lookup in one call, as SharedIndexView.answer takes it in Python (kvstore/mapped/index_reader.py): the
 * header's checks, the walk without per-key detail, the epoch read again, and the rule that sends a promoting
 * lookup to the socket. One call instead of a dozen Python steps matters to a scheduler that wakes up every
 * pass with cold caches. The header word indices are protocol/index_layout.py's (H_SLOTS, H_EPOCH, H_HEARTBEAT,
 * H_FLAGS) and its flags CLOSED and REMOTE. Returns the leading keys listed (counts as kvstore_index_walk), -1 when
 * the table or a slot moved under the read (try again), -2 when only the socket can answer: the view is closed or
 * its heartbeat older than stale_ns, a key was probed max_probe slots without an answer, or (promote) a leading
 * chunk only the disk holds or a walk that stopped short with a remote tier below.
 */
#include <time.h>

#define H_SLOTS 2
#define H_EPOCH 3
#define H_HEARTBEAT 4
#define H_FLAGS 5
#define CLOSED 1
#define REMOTE 2

int64_t kvstore_index_lookup(const volatile uint64_t *index, uint64_t header_bytes, const uint64_t *keys, int64_t n,
                             int64_t max_probe, int64_t stale_ns, int64_t promote, uint64_t *counts,
                             uint64_t ns_mask) {
    const uint64_t epoch = index[H_EPOCH];
    const uint64_t flags = index[H_FLAGS];
    if (epoch & 1) return -1;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const int64_t age = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec - (int64_t)index[H_HEARTBEAT];
    if ((flags & CLOSED) || age > stale_ns) return -2;
    int64_t missed = 0;
    const int64_t got = kvstore_index_walk(index, header_bytes, index[H_SLOTS] - 1, keys, n, max_probe, 0, counts,
                                           &missed, ns_mask);
    if (got < 0) return got;
    if (index[H_EPOCH] != epoch) return -1;
    if (promote && (counts[DISK] || (missed && (flags & REMOTE)))) return -2;
    return got;
}

/* The writer's side (kvstore/mapped/index_writer.py): list n keys that hold no slot yet, each in the first
 * EMPTY or TOMBSTONE slot of its probe sequence (from key_lo & mask, at most max_probe slots), the same slot the
 * Python writer would choose. Each slot is written under its sequence lock: seq + 1 (odd: readers retry), key,
 * state, host, size, then seq + 2; stores are issued in program order (volatile) and x86-64 does not reorder
 * stores with stores. listings[3 * i ..] = state, host, size of key i. slots[i] = the slot taken, or -1 when
 * none was free within max_probe (the key stays unlisted). Returns how many of the slots taken were tombstones.
 */
int64_t kvstore_index_place(volatile uint64_t *index, uint64_t header_bytes, uint64_t mask, const uint64_t *keys,
                            const uint64_t *listings, int64_t n, int64_t max_probe, int64_t *slots) {
    volatile uint64_t *table = index + header_bytes / 8;
    int64_t reused = 0;
    for (int64_t i = 0; i < n; ++i) {
        const uint64_t lo = keys[2 * i], hi = keys[2 * i + 1];
        uint64_t slot = lo & mask;
        slots[i] = -1;
        for (int64_t probe = 0; probe < max_probe; ++probe, slot = (slot + 1) & mask) {
            volatile uint64_t *s = table + slot * SLOT_WORDS;
            const uint64_t state = s[3];
            if (state != EMPTY && state != TOMBSTONE) continue;
            reused += state == TOMBSTONE;
            const uint64_t seq = s[0];
            s[0] = seq + 1;
            s[1] = lo;
            s[2] = hi;
            s[3] = listings[3 * i];
            s[4] = listings[3 * i + 1];
            s[5] = listings[3 * i + 2];
            s[0] = seq + 2;
            slots[i] = (int64_t)slot;
            break;
        }
    }
    return reused;
}
