/*
 * tensorizer.h - the stable C ABI of libtensorizer.
 *
 * libtensorizer reads and writes tensorizer (|TZR|) files, data versions 1-5,
 * byte-compatible with the upstream Python tensorizer.
 *
 * Conventions
 * -----------
 *  - Every function that can fail returns an int: TZ_OK (0) on success or a
 *    negative TZ_E_* code. The values of the codes are pinned and never change.
 *    Each function lists the codes it returns besides TZ_OK; any of them may
 *    also return TZ_E_NOMEM (out of memory) and TZ_E_INTERNAL (a bug), which
 *    the lists leave out. Functions returning void or a pointer cannot fail.
 *  - After a failure, tz_error_last() returns a human-readable message for the
 *    most recent failure on the calling thread (thread-local storage).
 *  - Out-parameters come first.
 *  - Handles are opaque. An object created by tz_X_open/tz_X_new is owned by
 *    the caller and released with the matching tz_X_free.
 *  - "close" and "free" mean one thing each:
 *      tz_X_close finishes the object's I/O (completes a file or an upload)
 *        and returns a status; the handle stays allocated, and calling it
 *        again is harmless. Only objects with something to finish (writers,
 *        sinks) have one.
 *      tz_X_free releases the handle. It returns nothing, accepts NULL, and
 *        closes first when needed, dropping any error (call tz_X_close first
 *        to see them). The handle must not be in use by another thread.
 *  - Structs the caller allocates (tz_file_info, tz_tensor_info,
 *    tz_read_request, tz_tensor_desc, tz_writer_state) start with a
 *    `uint32_t version` so that later versions of the library can add fields
 *    at their end without breaking compiled callers. Initialise them with
 *    their TZ_X_INIT macro (or set `version` to TZ_X_VERSION), also before
 *    passing one to be filled: the library fills only the fields that exist
 *    in the version the caller names and never changes `version`. A version
 *    of 0 or one newer than the library knows fails with TZ_E_INVALID_ARG.
 *  - Bulk data always goes to and from caller-owned buffers; the library never
 *    allocates tensor memory on the caller's behalf.
 *  - Pointers returned inside info structs are borrowed: they stay valid until
 *    the handle they came from is freed.
 *  - No C++ exception ever crosses this boundary.
 *
 * Thread safety
 * -------------
 *  - A tz_reader may be used from several threads at once: every function that
 *    takes a const tz_reader * or a tz_reader * for reading is internally
 *    synchronised. Reads spread work over the library's own threads.
 *  - A tz_source may be used from several threads at once.
 *  - A tz_writer and a tz_sink must be used by one thread at a time.
 *  - A tz_key is immutable and may be shared by threads.
 *  - tz_options must not be modified while another thread uses it.
 *  - tz_X_free must not race with any other use of the same handle.
 *  - Functions without a handle (tz_version, tz_status_name, tz_path_encode,
 *    tz_key_new_*, tz_options_new) may be called from any thread.
 */
#ifndef TENSORIZER_H
#define TENSORIZER_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  define TZ_API __declspec(dllexport)
#elif defined(__GNUC__)
#  define TZ_API __attribute__((visibility("default")))
#else
#  define TZ_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Library version ------------------------------------------------------ */

/* TZ_VERSION_MAJOR, _MINOR and _PATCH of the header compiled against. */
#include "tensorizer_version.h"

/* "MAJOR.MINOR.PATCH" of the library actually loaded. */
TZ_API const char *tz_version(void);

/* Newest tensorizer data version this library reads and writes. */
#define TZ_DATA_VERSION_MAX 5

/* ---- Errors --------------------------------------------------------------- */

#define TZ_OK 0
#define TZ_E_INVALID_ARG -1   /* bad argument from the caller */
#define TZ_E_IO -2            /* the OS reported an I/O error (disk full, EIO...) */
#define TZ_E_NOT_FOUND -3     /* no such file, or tensor index out of range */
#define TZ_E_FORMAT -4        /* malformed or corrupt file (bad magic, lengths...) */
#define TZ_E_VERSION -5       /* unsupported data version */
#define TZ_E_TRUNCATED -6     /* the file ends before a structure it announces */
#define TZ_E_HASH -7          /* a stored CRC32 / SHA-256 does not match */
#define TZ_E_CONFLICT -8      /* conflicting tensor paths (duplicate, leaf vs prefix) */
#define TZ_E_LIMIT -9         /* a format limit was hit (metadata overflow, u16 index...) */
#define TZ_E_CRYPTO -10       /* encryption/decryption failure or mismatch */
#define TZ_E_UNSUPPORTED -11  /* valid request this build or file cannot serve */
#define TZ_E_STATE -12        /* handle used in the wrong state (e.g. closed writer) */
#define TZ_E_NOMEM -13        /* out of memory */
#define TZ_E_INTERNAL -99     /* a bug: please report it */

/* Message of the last failure on this thread; "" if none. Never NULL.
 * The pointer is valid until the next libtensorizer call on this thread.
 * Any thread; each thread sees its own message. */
TZ_API const char *tz_error_last(void);

/* Symbolic name of a status code, e.g. "TZ_E_HASH"; "TZ_E_UNKNOWN" for a value
 * that is no code. Never NULL; a static string. Any thread. */
TZ_API const char *tz_status_name(int status);

/* ---- Options -------------------------------------------------------------- */

/* A bag of string key/value options for opening readers, writers, sources and
 * sinks. Each key below says which of them accept it; opening one with a key
 * it does not accept fails with TZ_E_INVALID_ARG.
 *
 * Keys for readers only:
 *   "num_threads"  worker threads for bulk reads, 1 to 1024 (default: the CPU
 *                  count, clamped to 2-64)
 *   "kdf_max_opslimit", "kdf_max_memlimit"
 *                  the most costly key derivation a file may ask a password
 *                  key for (defaults 64 and 4294967296 bytes); a file asking
 *                  more fails with TZ_E_LIMIT instead of tying up the machine
 *   "kdf_max_derivations"  how many different key derivations (salt and
 *                  parameter sets) one file may ask a password key for, 1 to
 *                  4294967295 (default 4; writers use one per file); the
 *                  derivation past it fails with TZ_E_LIMIT, so the Argon2
 *                  work of a whole load stays bounded
 *   "verify_hash"  "1" to verify hashes on every read by default ("0")
 *   "huge_pages"   "1" to advise transparent huge pages for read destinations
 *                  (fewer page faults filling fresh memory; "0")
 *   "metadata_only" "1" to open an encrypted file without a key, to list its
 *                  tensors and check the hashes of those without data; any
 *                  read of encrypted data then fails with TZ_E_CRYPTO ("0")
 * Keys for readers and sources:
 *   "direct_io"    "1" to read large blocks of local files with O_DIRECT when
 *                  possible ("0")
 * Keys for writers only:
 *   "num_threads"  worker threads for hashing and writing, 1 to 1024 (default:
 *                  the CPU count, clamped to 2-64)
 *   "crypt_chunk_size"  bytes per encrypted box (default 2097152; a multiple
 *                  of 64, at least 1024). Readers honour any valid size.
 *   "durable"      local files: "1" (default) makes tz_writer_close durable:
 *                  the file's data and its directory entry are synced
 *                  (fdatasync, fsync of the folder) before it returns, so a
 *                  checkpoint reported saved survives a power loss; "0"
 *                  leaves that to the OS (faster for scratch files)
 * Keys for remote storage, accepted by readers, sources, writers and sinks
 * (each applies where the URI's scheme uses it):
 *   http(s):// and s3:// (ranged GETs, one connection per thread, redirects
 *   followed; transient failures (connection errors, timeouts, stalls, 5xx,
 *   408, 429) retried with backoff, resuming at the first missing byte;
 *   other failures, 4xx and certificate errors among them, fail at once; a
 *   host name that does not resolve is tried twice in all. Retries stop at
 *   whichever limit comes first: http_max_attempts failures in a row, or a
 *   streak of failures lasting http_retry_timeout_ms. Bytes arriving end a
 *   streak. libcurl errors name their "cURL exit code"):
 *   "tls_verify"   "0" to skip TLS certificate checks ("1")
 *   "ca_file", "ca_dir"  CA bundle / hashed CA directory to trust (system's)
 *   "http_headers" extra request headers, one "Name: value" per line
 *   "http_max_attempts"  failed attempts in a row before giving up (8)
 *   "http_backoff_ms"    first retry delay, doubled each time up to 3 s (100)
 *   "http_retry_timeout_ms"  how long failures in a row may go on before
 *                  giving up (30000)
 *   "http_connect_timeout_ms"  connection timeout (10000); also the
 *                  connection timeout of redis:// sources
 *   "http_stall_timeout_ms" (20000: a transfer that delivers nothing for this
 *                  long is retried)
 *   s3:// (credentials, endpoint and region resolve as upstream tensorizer
 *   does: these keys, then the s3cmd config, then the AWS environment
 *   variables and shared files, else anonymous access):
 *   "s3_access_key_id", "s3_secret_access_key", "s3_session_token"
 *                  credentials (unset: resolved)
 *   "s3_endpoint"  "host[:port]" or a URL of the S3 service (unset: resolved)
 *   "s3_default_endpoint"  the endpoint used when nothing names one (unset:
 *                  upstream's CoreWeave endpoints, accel-object.ord1.
 *                  coreweave.com to read, object.ord1.coreweave.com to write)
 *   "s3_region"    signing region (unset: resolved, else "us-east-1")
 *   "s3_config_path"  s3cmd config file to read (default "~/.s3cfg"; ""
 *                  reads none)
 *   "s3_force_http" "1" to use plain http:// for the endpoint (unset: resolved)
 *   "s3_addressing" "path" or "virtual"-hosted bucket URLs (unset: chosen by
 *                  the endpoint's host)
 *   "s3_part_size" bytes per part of a multipart upload, for writers and sinks
 *                  (16777216; 5 MiB to 5 GiB)
 * A key (tz_options_set_key) makes readers decrypt and writers encrypt.
 * Unknown keys and malformed values are rejected by tz_options_set. */
typedef struct tz_options tz_options;

/* Creates an empty bag, owned by the caller (tz_options_free).
 * Returns TZ_E_INVALID_ARG (out is NULL). */
TZ_API int tz_options_new(tz_options **out);
/* Sets `key` to `value` (both copied), replacing an earlier value.
 * Returns TZ_E_INVALID_ARG: a NULL argument, an unknown key or a value the key
 * does not accept (the message says which). Not with concurrent users of
 * `opts`. */
TZ_API int tz_options_set(tz_options *opts, const char *key, const char *value);
/* Releases the bag; accepts NULL. Readers and writers opened with it keep
 * what they need. */
TZ_API void tz_options_free(tz_options *opts);

/* ---- Encryption keys ------------------------------------------------------ */

/* Tensor data is encrypted with XSalsa20-Poly1305 (libsodium secretbox) in
 * chunks, as upstream tensorizer does. A tz_key holds the secret in guarded
 * memory (locked where the OS allows, wiped when freed). Keys are immutable:
 * a handle may be shared by threads, and options, readers and writers keep
 * their own reference, so the caller may free it right after handing it on.
 * Secrets never appear in error messages. A wrong key, a wrong password and
 * altered ciphertext all fail with TZ_E_CRYPTO and one generic message.
 * Each tz_key_new_* hands the caller a key to release with tz_key_free and
 * returns TZ_E_CRYPTO if libsodium cannot be initialised. */
typedef struct tz_key tz_key;

#define TZ_KEY_BYTES 32
#define TZ_SALT_BYTES 16
/* Argon2id limits (libsodium's values). */
#define TZ_OPSLIMIT_MIN 1
#define TZ_OPSLIMIT_INTERACTIVE 2
#define TZ_OPSLIMIT_MODERATE 3
#define TZ_OPSLIMIT_SENSITIVE 4
#define TZ_OPSLIMIT_MAX 4294967295
#define TZ_MEMLIMIT_MIN 8192
#define TZ_MEMLIMIT_INTERACTIVE 67108864
#define TZ_MEMLIMIT_MODERATE 268435456
#define TZ_MEMLIMIT_SENSITIVE 1073741824
#define TZ_MEMLIMIT_MAX 4398046510080

/* 32 random bytes. Returns TZ_E_INVALID_ARG (out is NULL), TZ_E_CRYPTO. */
TZ_API int tz_key_new_random(tz_key **out);
/* Exactly TZ_KEY_BYTES bytes of key, copied.
 * Returns TZ_E_INVALID_ARG (NULL, or not 32 bytes), TZ_E_CRYPTO. */
TZ_API int tz_key_new_from_bytes(tz_key **out, const void *key, size_t key_len);
/* Derives a key from a password now (Argon2id). `salt` is TZ_SALT_BYTES
 * bytes, or NULL for a random one. Writers store the limits and salt in the
 * file, so readers can derive the key again from the password.
 * Returns TZ_E_INVALID_ARG (empty password, salt length, limits out of
 * range), TZ_E_CRYPTO (the derivation failed, e.g. memlimit not allocatable). */
TZ_API int tz_key_new_derived(tz_key **out, const void *password, size_t password_len, uint64_t opslimit,
                              uint64_t memlimit, const uint8_t *salt, size_t salt_len);
/* A password for reading: each file's key is derived with the limits and
 * salt stored in it. Cannot be used to write.
 * Returns TZ_E_INVALID_ARG (out NULL, empty password), TZ_E_CRYPTO. */
TZ_API int tz_key_new_password(tz_key **out, const void *password, size_t password_len);
/* Copies the 32 key bytes to `out` (cap >= TZ_KEY_BYTES).
 * Returns TZ_E_INVALID_ARG (NULL, cap too small), TZ_E_STATE for a password
 * key, whose keys exist only per file. Any thread. */
TZ_API int tz_key_get_bytes(uint8_t *out, size_t cap, const tz_key *key);
/* Copies the salt of a derived key (cap >= TZ_SALT_BYTES).
 * Returns TZ_E_INVALID_ARG (NULL, cap too small), TZ_E_NOT_FOUND for keys made
 * without a password (random, from bytes, password-only). Any thread. */
TZ_API int tz_key_get_salt(uint8_t *out, size_t cap, const tz_key *key);
/* Drops the caller's reference; accepts NULL. Holders (options, readers,
 * writers) keep theirs; the secret is wiped when the last one goes. */
TZ_API void tz_key_free(tz_key *key);

/* Readers opened with these options decrypt; writers encrypt. NULL removes
 * the key. `opts` takes its own reference to the key.
 * Returns TZ_E_INVALID_ARG (opts is NULL). Not with concurrent users of
 * `opts`. */
TZ_API int tz_options_set_key(tz_options *opts, const tz_key *key);

/* ---- Tensor types and paths ------------------------------------------------ */

#define TZ_TENSOR_PARAM 0
#define TZ_TENSOR_BUFFER 1
#define TZ_TENSOR_STATE_DICT 2

/* One component of a tensor path: a string key or a non-negative list index.
 * Not versioned: it is only ever handed out in arrays the library owns
 * (tz_tensor_info.path) or read from the caller by tz_path_encode, and its
 * layout is final. */
typedef struct tz_path_component {
  int is_index;     /* 1: use `index`; 0: use `str`/`str_len` (UTF-8) */
  uint64_t index;
  const char *str;  /* not NUL-terminated */
  size_t str_len;
} tz_path_component;

/* ---- Reader --------------------------------------------------------------- */

typedef struct tz_reader tz_reader;

#define TZ_FILE_INFO_VERSION 1
#define TZ_FILE_INFO_INIT { TZ_FILE_INFO_VERSION }

/* File-level facts from the header. */
typedef struct tz_file_info {
  uint32_t version;          /* TZ_FILE_INFO_VERSION, set by the caller */
  uint32_t data_version;
  uint32_t flags;            /* low 32 bits of the feature flags (bit 0 = encrypted) */
  uint64_t tensor_count;
  uint64_t tensor_data_size; /* header "tensor_size": data bytes the writer stored */
  uint64_t metadata_length;  /* M: length of the metadata index block */
  uint64_t file_size;
  int encrypted;             /* 1 if tensor headers carry crypt_info blocks */
} tz_file_info;

#define TZ_TENSOR_INFO_VERSION 1
#define TZ_TENSOR_INFO_INIT { TZ_TENSOR_INFO_VERSION }

/* What the metadata index says about one tensor. */
typedef struct tz_tensor_info {
  uint32_t version;          /* TZ_TENSOR_INFO_VERSION, set by the caller */
  const uint8_t *name;       /* the name bytes exactly as stored */
  size_t name_len;
  const char *dtype;         /* full dtype string, may contain one NUL (opaque) */
  size_t dtype_len;
  uint32_t ndim;
  const uint64_t *shape;     /* ndim dims, outermost first */
  int32_t tensor_type;       /* TZ_TENSOR_* */
  int32_t module_index;      /* from the tensor header; -1 until that header was read */
  uint64_t header_offset;
  uint64_t data_offset;
  uint64_t data_length;      /* bytes stored in the file (0 for meta tensors) */
  uint64_t nbytes;           /* bytes the tensor occupies in memory: numel * itemsize */
  uint32_t itemsize;
  int is_meta;               /* 1: no data stored; reads give zeros */
  int is_opaque;             /* 1: numpy part is void ("<V2"); see torch_dtype */
  const char *torch_dtype;   /* e.g. "bfloat16" (no "torch." prefix) or NULL */
  size_t path_len;           /* number of path components */
  const tz_path_component *path;
} tz_tensor_info;

/* Opens a tensorizer file, owned by the caller (tz_reader_free). `uri` is a
 * local path, a file:// URI, an http:// or https:// URL (the server must
 * support range requests), an s3://bucket/key object, or a
 * redis://[[user]:password@]host[:port][/db]/prefix key set written by
 * upstream's to_redis (schemes other than file:// match in any case).
 * `opts` may be NULL. Parses and validates the header and metadata index.
 * Returns TZ_E_INVALID_ARG (NULL out/uri, an option readers do not take, a
 * malformed s3/redis URI or S3 options, a directory), TZ_E_NOT_FOUND (no such file or object), TZ_E_IO,
 * TZ_E_UNSUPPORTED (an unknown URI scheme), TZ_E_FORMAT, TZ_E_VERSION,
 * TZ_E_TRUNCATED, TZ_E_CONFLICT (two tensors with conflicting paths),
 * TZ_E_CRYPTO (an encrypted file without a key and without "metadata_only",
 * or a key for a file that is not encrypted). */
TZ_API int tz_reader_open(tz_reader **out, const char *uri, const tz_options *opts);
/* Releases the reader and what it borrowed out; accepts NULL. A reader has
 * nothing to finish, so there is no tz_reader_close. Not concurrently with
 * any other use of `reader`. */
TZ_API void tz_reader_free(tz_reader *reader);

/* Fills `out` (set out->version first). Returns TZ_E_INVALID_ARG (NULL, or
 * an unknown out->version). Thread-safe. */
TZ_API int tz_reader_file_info(tz_file_info *out, const tz_reader *reader);
/* Number of tensors in the metadata index. Returns TZ_E_INVALID_ARG (NULL).
 * Thread-safe. */
TZ_API int tz_reader_tensor_count(uint64_t *out, const tz_reader *reader);
/* Info for tensor `index` (file order); set out->version first. Pointers
 * inside are borrowed from the reader (valid until tz_reader_free).
 * Returns TZ_E_INVALID_ARG (NULL, or an unknown out->version), TZ_E_NOT_FOUND
 * (index out of range). Thread-safe. */
TZ_API int tz_reader_tensor_info(tz_tensor_info *out, tz_reader *reader, uint64_t index);

/* Reads and validates the headers of the given tensors (all if indices is NULL),
 * which fills in module_index. Reads do this as a side effect.
 * Returns TZ_E_INVALID_ARG (reader is NULL), TZ_E_NOT_FOUND (an index out of
 * range, or the storage's), TZ_E_IO, TZ_E_FORMAT, TZ_E_TRUNCATED, TZ_E_CRYPTO
 * (a malformed crypt_info block). Thread-safe. */
TZ_API int tz_reader_load_headers(tz_reader *reader, const uint64_t *indices, size_t count);

/* Verification checks every hash a tensor's header stores: over the header
 * and the data, or over the header alone for a meta tensor. A verified read
 * verifies something or fails: a header storing no hash fails it with
 * TZ_E_HASH ("cannot be verified"), as does tz_reader_verify_bytes. */
#define TZ_READ_VERIFY_HASH 0x1u     /* check every stored hash of each tensor */
#define TZ_READ_NO_VERIFY_HASH 0x2u  /* override the reader's "verify_hash" option */

#define TZ_READ_REQUEST_VERSION 1
#define TZ_READ_REQUEST_INIT { TZ_READ_REQUEST_VERSION }

typedef struct tz_read_request {
  uint32_t version;  /* TZ_READ_REQUEST_VERSION, set by the caller */
  uint64_t index;    /* tensor index */
  void *dst;         /* caller buffer of at least `nbytes` bytes of that tensor */
  uint64_t dst_size;
} tz_read_request;

/* Reads one tensor's bytes (plaintext, C-contiguous) into dst, which stays
 * the caller's. Meta tensors are zero-filled. dst_size must be >= info.nbytes.
 * Returns TZ_E_INVALID_ARG (NULL reader or dst, dst_size too small),
 * TZ_E_NOT_FOUND (index out of range, or the storage's), TZ_E_IO,
 * TZ_E_FORMAT, TZ_E_TRUNCATED, TZ_E_HASH (when verifying), TZ_E_CRYPTO
 * (wrong key, altered data, or a reader opened with "metadata_only"; dst is
 * then zeroed), TZ_E_LIMIT (the file asks a password key for a derivation
 * above "kdf_max_*"). Thread-safe. */
TZ_API int tz_reader_read(tz_reader *reader, uint64_t index, void *dst, uint64_t dst_size,
                          uint32_t flags);

/* Reads many tensors in parallel using up to `num_threads` threads (0: the
 * reader's default). Every element of `requests` must carry the same
 * `version`: the library finds element k at k times the size of that
 * version's struct, so one array cannot mix versions. The buffers stay the
 * caller's. On failure, *failed (if not NULL) receives the position in
 * `requests` of the request that failed first; buffers of other requests may
 * be partly written.
 * Returns what tz_reader_read returns, and TZ_E_INVALID_ARG for a NULL
 * `requests` with count > 0 or an unknown or mixed `version` (nothing is
 * read then). Thread-safe. */
TZ_API int tz_reader_read_batch(tz_reader *reader, const tz_read_request *requests, size_t count,
                                uint32_t flags, uint32_t num_threads, size_t *failed);

/* Checks caller-provided bytes (e.g. a module's live tensor) against the hashes
 * stored in tensor `index`'s header, the header bytes themselves taken as stored.
 * Returns TZ_OK when every stored hash matches, TZ_E_HASH when one does not;
 * also TZ_E_INVALID_ARG (NULL reader, NULL data with size > 0),
 * TZ_E_NOT_FOUND (index out of range, or the storage's), and reading the
 * header's TZ_E_IO, TZ_E_FORMAT, TZ_E_TRUNCATED, TZ_E_CRYPTO. Thread-safe. */
TZ_API int tz_reader_verify_bytes(tz_reader *reader, uint64_t index, const void *data,
                                  uint64_t size);

/* The hashes stored in a tensor's header, as upstream's TensorHash holds
 * them: for callers that check or show them themselves (reads verify them
 * natively). */
#define TZ_HASH_CRC32 0
#define TZ_HASH_SHA256 1
#define TZ_TENSOR_HASH_VERSION 1
#define TZ_TENSOR_HASH_INIT { TZ_TENSOR_HASH_VERSION }
#define TZ_TENSOR_HASH_MAX_BYTES 64

typedef struct tz_tensor_hash {
  uint32_t version;   /* TZ_TENSOR_HASH_VERSION, set by the caller */
  uint32_t type;      /* TZ_HASH_*: the type code stored in the file */
  uint32_t length;    /* bytes of `value` in use: 4 for CRC32, 32 for SHA-256 */
  uint8_t value[TZ_TENSOR_HASH_MAX_BYTES]; /* the stored bytes, unchanged */
} tz_tensor_hash;

/* Writes up to `cap` stored hashes of tensor `index` to `out` (cap 0 and
 * out NULL: only measure) and their number to *count, in header order; reads
 * the tensor's header if it was not read yet. Every element of `out` up to
 * `cap` carries element 0's `version`. Returns TZ_OK;
 * TZ_E_INVALID_ARG (NULL reader or count, NULL out with cap > 0, unknown or
 * mixed version); TZ_E_NOT_FOUND (index out of range); reading the header's
 * TZ_E_IO, TZ_E_FORMAT, TZ_E_TRUNCATED, TZ_E_CRYPTO. Thread-safe. */
TZ_API int tz_reader_tensor_hashes(tz_tensor_hash *out, size_t cap, size_t *count, tz_reader *reader,
                                   uint64_t index);

/* ---- Raw byte sources ----------------------------------------------------- */

/* Positional reads of any object a reader can open (local path, file://,
 * http(s)://, s3://, redis://), with the same options (TLS, headers, retries,
 * S3, direct_io): for callers that want bytes rather than tensors, e.g.
 * file-like objects. Thread-safe. */
typedef struct tz_source tz_source;

/* Opens `uri`, owned by the caller (tz_source_free). `opts` may be NULL.
 * Returns TZ_E_INVALID_ARG (NULL out/uri, an option sources do not take, a
 * malformed s3/redis URI or S3 options, a directory), TZ_E_NOT_FOUND, TZ_E_IO,
 * TZ_E_TRUNCATED (an empty http object), TZ_E_FORMAT (redis keys that
 * overlap), TZ_E_UNSUPPORTED (an unknown URI scheme). */
TZ_API int tz_source_open(tz_source **out, const char *uri, const tz_options *opts);
/* Size of the object in bytes, known since open. Returns TZ_E_INVALID_ARG
 * (NULL). Thread-safe. */
TZ_API int tz_source_size(uint64_t *out, const tz_source *source);
/* Reads exactly `len` bytes at `offset` into dst (the caller's).
 * Returns TZ_E_INVALID_ARG (NULL source, NULL dst with len > 0),
 * TZ_E_TRUNCATED (past the end, or the object shrank), TZ_E_IO,
 * TZ_E_NOT_FOUND (the object went away). Thread-safe. */
TZ_API int tz_source_read(tz_source *source, uint64_t offset, void *dst, size_t len);
/* The header lines ("Name: value\r\n" each, status line excluded) of the
 * response that opened an http(s):// or s3:// source; empty ("", 0) for other
 * sources. Borrowed: valid until tz_source_free, never changed meanwhile.
 * Returns TZ_E_INVALID_ARG (NULL). Thread-safe. */
TZ_API int tz_source_response_headers(const char **out, size_t *out_len, const tz_source *source);
/* Releases the source; accepts NULL. A source has nothing to finish, so there
 * is no tz_source_close. Not concurrently with any other use of `source`. */
TZ_API void tz_source_free(tz_source *source);

/* ---- Raw byte sinks -------------------------------------------------------- */

/* Positional writes to a local file or an s3:// object (a multipart upload:
 * parts go out as they fill; close completes it). Every byte past the first
 * part must be written once. Options: the remote-storage keys (TLS, http_*,
 * s3_*, including "s3_part_size") listed under tz_options. Not thread-safe:
 * one thread at a time. */
typedef struct tz_sink tz_sink;

/* Creates (truncates) a local file or starts an S3 upload, owned by the
 * caller (tz_sink_free). `opts` may be NULL.
 * Returns TZ_E_INVALID_ARG (NULL out/uri, an option sinks do not take, a
 * malformed s3 URI or S3 options), TZ_E_NOT_FOUND (missing folder or bucket),
 * TZ_E_IO, TZ_E_UNSUPPORTED (a scheme other than file:// and s3://). */
TZ_API int tz_sink_open(tz_sink **out, const char *uri, const tz_options *opts);
/* Writes `len` bytes from src (the caller's, not kept) at `offset`.
 * Returns TZ_E_INVALID_ARG (NULL sink, NULL src with len > 0), TZ_E_STATE
 * (the sink is closed; S3: a byte of a part already uploaded), TZ_E_IO,
 * TZ_E_NOT_FOUND (S3: the upload or bucket went away). One thread at a time. */
TZ_API int tz_sink_write(tz_sink *sink, uint64_t offset, const void *src, size_t len);
/* Finishes the object (sets its size to the end of the data written); the
 * handle stays allocated until tz_sink_free. Calling it again is harmless.
 * Returns TZ_E_INVALID_ARG (sink is NULL), TZ_E_IO, TZ_E_NOT_FOUND (S3).
 * One thread at a time. */
TZ_API int tz_sink_close(tz_sink *sink);
/* Frees the handle; accepts NULL. A sink not closed is aborted (S3: no object
 * appears), its errors dropped. */
TZ_API void tz_sink_free(tz_sink *sink);

/* ---- Writer --------------------------------------------------------------- */

typedef struct tz_writer tz_writer;

#define TZ_TENSOR_DESC_VERSION 1
#define TZ_TENSOR_DESC_INIT { TZ_TENSOR_DESC_VERSION }

/* One tensor to append. */
typedef struct tz_tensor_desc {
  uint32_t version;      /* TZ_TENSOR_DESC_VERSION, set by the caller */
  const uint8_t *name;   /* encoded name bytes: plain UTF-8, or 0x1E + JSON array */
  size_t name_len;
  const char *dtype;     /* dtype string, e.g. "<f4" or "<V2\0torch.bfloat16" */
  size_t dtype_len;
  uint32_t ndim;
  const uint64_t *shape;
  uint32_t module_index; /* must fit in 16 bits */
  int32_t tensor_type;   /* TZ_TENSOR_* */
  int is_meta;           /* 1: store shape and dtype only (data ignored) */
  const void *data;      /* C-contiguous bytes, numel * itemsize of them */
  uint64_t data_size;
} tz_tensor_desc;

/* Creates a file, or starts an s3:// upload, and writes an empty tensorizer
 * header; owned by the caller (tz_writer_close, then tz_writer_free). `opts`
 * may be NULL. A local file is written beside its path under a unique
 * temporary name and renamed over it when the first write call completes
 * (or at close, if none does): until then the path keeps any file it held,
 * afterwards it holds the new file, complete after every write call. A save
 * that fails or is killed before that leaves the previous file in place.
 * Two saves to one path each write their own file and the last rename wins
 * whole; the close of the one replaced fails with TZ_E_CONFLICT. Devices,
 * FIFOs and files in folders the caller cannot create files in are written
 * in place, truncated at open.
 * Returns TZ_E_INVALID_ARG (NULL out/uri, an option writers do not take, a
 * password-only key, a bad crypt_chunk_size, a malformed s3 URI or S3
 * options), TZ_E_NOT_FOUND (missing folder or bucket), TZ_E_IO,
 * TZ_E_UNSUPPORTED (a scheme other than file:// and s3://). */
TZ_API int tz_writer_open(tz_writer **out, const char *uri, const tz_options *opts);

/* Appends tensors as one write call: hashing and writing run in parallel;
 * afterwards the file header and end marker are updated, so the file is
 * complete and valid even if the writer is never closed. If this is the first
 * call and the metadata for all `count` tensors does not fit the standard
 * 256 KiB reserve, the reserve is enlarged (a file upstream still reads).
 * Every element of `tensors` must carry the same `version`: the library
 * finds element k at k times the size of that version's struct, so one array
 * cannot mix versions. The descriptors and their data stay the caller's and
 * are not kept after the call. On failure nothing of this call is recorded in
 * the file header.
 * Returns TZ_E_INVALID_ARG (NULL writer or tensors, an unknown or mixed
 * `version`, a bad name, dtype, shape, type or data size), TZ_E_CONFLICT (a
 * path that clashes with another of this or an earlier call), TZ_E_LIMIT (a
 * name over 65535 bytes, module_index over 16 bits, metadata that no longer
 * fits after the first call; the writer stays usable), TZ_E_STATE (the writer
 * is closed, or an earlier write failed other than with TZ_E_LIMIT), TZ_E_IO,
 * TZ_E_NOT_FOUND (S3), TZ_E_CRYPTO. One thread at a time. */
TZ_API int tz_writer_write(tz_writer *writer, const tz_tensor_desc *tensors, size_t count,
                           uint32_t num_threads);

#define TZ_WRITER_STATE_VERSION 1
#define TZ_WRITER_STATE_INIT { TZ_WRITER_STATE_VERSION }

typedef struct tz_writer_state {
  uint32_t version;          /* TZ_WRITER_STATE_VERSION, set by the caller */
  uint32_t data_version;
  uint64_t tensor_count;
  uint64_t tensor_data_size; /* Σ data bytes written */
  uint64_t file_size;        /* bytes up to and including the end marker */
} tz_writer_state;

/* Fills `out` (set out->version first); also after tz_writer_close.
 * Returns TZ_E_INVALID_ARG (NULL, or an unknown out->version).
 * One thread at a time, like every writer call. */
TZ_API int tz_writer_state_get(tz_writer_state *out, const tz_writer *writer);

/* Finalises the file (header, end marker) and closes it; after a failed write
 * (TZ_E_STATE since), the file or upload is aborted instead. The handle stays
 * allocated until tz_writer_free. Calling it twice is harmless.
 * Returns TZ_E_INVALID_ARG (writer is NULL), TZ_E_IO, TZ_E_NOT_FOUND (S3),
 * TZ_E_STATE (S3: a byte of a part already uploaded), TZ_E_CONFLICT (another
 * save replaced this file at its path). One thread at a time. */
TZ_API int tz_writer_close(tz_writer *writer);
/* Frees the handle; accepts NULL. Closes the file first if still open (errors
 * are dropped). */
TZ_API void tz_writer_free(tz_writer *writer);

/* ---- Helpers -------------------------------------------------------------- */

/* Encodes a tensor path the way upstream does: a single string component is
 * written raw; anything else as 0x1E + compact ASCII JSON. Writes at most
 * `cap` bytes to `out` and the full length to *out_len (call with cap 0 to
 * measure).
 * Returns TZ_E_INVALID_ARG (NULL out_len or path, no component, a string
 * that is not UTF-8, a single name that is empty or starts with 0x1E, or cap
 * too small: *out_len then holds the length needed). Any thread. */
TZ_API int tz_path_encode(uint8_t *out, size_t cap, size_t *out_len,
                          const tz_path_component *path, size_t path_len);

#ifdef __cplusplus
}
#endif

#endif /* TENSORIZER_H */
