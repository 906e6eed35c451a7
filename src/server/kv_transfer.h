/* kv_transfer.h — the binary KV-transfer connection between a prefill
 * server and a decode server (prefill/decode disaggregation).
 *
 * A frame is a 24-byte header then a payload, every integer little-endian:
 *   u32 magic "TSKV" | u16 version (1) | u16 kind | u64 payload length |
 *   u64 XXH3-64 of the payload
 * kind 1, blocks: u32 block_size, layers, kv_heads, head_dim, dtype,
 *   n_blocks; i32 tokens[n_blocks x block_size]; then per block the K/V of
 *   every layer (per layer K then V, each (kv_heads, block_size) rows of
 *   head_dim values in the pool's type), ts_engine_block_bytes each. dtype
 *   (TS_KVX_DTYPE_*): 0 f32 (4 head_dim bytes a row), 1 bf16 (2 head_dim),
 *   2 int8 (head_dim int8 values, zero padding to a multiple of 4 bytes,
 *   then the row's f32 scale: 4 ((head_dim + 3) / 4 + 1) bytes; see
 *   ts_kv_dtype). A receiver whose cache holds another type refuses the
 *   blocks, naming both types.
 * kind 2, reply: i32 status (0: adopted), u32 blocks adopted, the message.
 * One connection carries one blocks frame and its reply. The receiver
 * reads the header and the geometry first, refuses what does not match
 * its model before reading the rest, and checks the checksum before it
 * touches its cache. */
#ifndef TS_KV_TRANSFER_H
#define TS_KV_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#define TS_KVX_MAGIC       0x564B5354u /* "TSKV" read little-endian */
#define TS_KVX_VERSION     1
#define TS_KVX_HEADER      24
#define TS_KVX_META        24
#define TS_KVX_KIND_BLOCKS 1
#define TS_KVX_KIND_REPLY  2

/* the geometry's dtype: the K/V rows' type on the wire */
#define TS_KVX_DTYPE_F32  0
#define TS_KVX_DTYPE_BF16 1
#define TS_KVX_DTYPE_INT8 2

typedef struct {
    uint32_t block_size, layers, kv_heads, head_dim, dtype, n_blocks;
} ts_kvx_geometry;

/* "f32", "bf16", "int8" ("unknown" past them) */
const char *ts_kvx_dtype_name(uint32_t dtype);

typedef struct {
    ts_kvx_geometry g;
    const int32_t *tokens; /* n_blocks x block_size */
    const void *kv;        /* n_blocks x block bytes */
} ts_kvx_blocks;

/* bytes of one block's K/V for geometry g (of its dtype; 0 for a dtype
 * outside TS_KVX_DTYPE_*) */
uint64_t ts_kvx_block_bytes(const ts_kvx_geometry *g);

/* A blocks frame (header + payload), malloc'd; NULL when out of memory. */
uint8_t *ts_kvx_encode(const ts_kvx_blocks *b, size_t *len);

/* Checks a header: magic, version, kind, payload length within max.
 * Returns 0, or -1 with err naming what is wrong. */
int ts_kvx_check_header(const uint8_t *h, uint16_t kind, uint64_t max_payload,
                        uint64_t *payload_len, uint64_t *checksum, char *err,
                        size_t errcap);

/* Checks a whole blocks payload against its checksum and its own geometry
 * (sizes add up) and points b into it. 0, or -1 with err. */
int ts_kvx_decode_blocks(const uint8_t *payload, uint64_t len,
                         uint64_t checksum, ts_kvx_blocks *b, char *err,
                         size_t errcap);

/* Sends frame to target ("host:port"), waits for the reply: 0 with
 * *adopted, or -1 with err (connection, timeout, refusal with the peer's
 * message). */
int ts_kvx_send(const char *target, const uint8_t *frame, size_t len,
                int timeout_ms, uint32_t *adopted, char *err, size_t errcap);

/* The receiving side's check of the geometry, then the adoption: returns
 * 0 and *adopted, or -1 with err. */
typedef int (*ts_kvx_adopt_fn)(void *arg, const ts_kvx_geometry *g,
                               const ts_kvx_blocks *b, uint32_t *adopted,
                               char *err, size_t errcap);

/* Serves one accepted connection: reads a blocks frame (checking the
 * geometry with adopt(arg, g, NULL, ...) before reading the data), adopts
 * it, writes the reply, closes fd. 0: adopted; -1: refused (a reply
 * with the reason was sent). */
int ts_kvx_serve_connection(int fd, ts_kvx_adopt_fn adopt, void *arg,
                            uint64_t max_payload, int timeout_ms);

/* A listening TCP socket on host:port (port 0: any); *bound the port.
 * Returns the fd or -1 with err. */
int ts_kvx_listen(const char *host, int port, int *bound, char *err,
                  size_t errcap);

#endif
