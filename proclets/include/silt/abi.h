/* The C ABI between a Silt function bundle (a shared object) and the worker
 * that loads it.
 *
 * A bundle exports silt_abi_version() and silt_handle(), and optionally
 * silt_init(), silt_after_restore(), silt_task() and silt_max_concurrency().
 * The worker refuses a bundle whose
 * silt_abi_version() differs from the SILT_ABI_VERSION it was built with.
 * Function authors use silt/function.h, which produces these exports; nothing
 * here needs to be written by hand.
 *
 * Strings are (pointer, length) pairs, valid only during the call; they are not
 * NUL-terminated. */
#ifndef SILT_ABI_H_
#define SILT_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SILT_ABI_VERSION 3u /* 2: silt_context.state; 3: writer flush */
/* The oldest bundle ABI a worker still loads (its writer has no flush, which
 * it never calls). */
#define SILT_ABI_MIN_VERSION 2u

typedef struct silt_str {
  const char* data;
  size_t len;
} silt_str;

typedef struct silt_header {
  silt_str name;
  silt_str value;
} silt_header;

typedef struct silt_request {
  silt_str method;
  silt_str path;  /* the path the function sees, e.g. "/" or "/a/b" */
  silt_str query; /* raw query string without '?' */
  const silt_header* headers;
  size_t header_count;
  silt_str body;
} silt_request;

/* The instance's connection to its function's state (sharded maps, vectors,
 * queues; silt/state.h builds the requests, silt/state_wire.h is their
 * format). call() sends one request and passes the whole reply to append()
 * (which may be called several times); it returns 0, or -1 when the state
 * service cannot be reached. Safe to call from several threads. */
typedef struct silt_state_api {
  void* host;
  int (*call)(void* host, const char* request, size_t request_len, void* out,
              void (*append)(void* out, const char* data, size_t len));
} silt_state_api;

typedef struct silt_context {
  silt_str function_name;
  silt_str function_namespace;
  silt_str call_id; /* empty in silt_init and silt_after_restore */
  silt_str
      instance_id; /* unique per instance, fresh after every restore or fork */
  silt_str secrets_dir;        /* directory holding one file per secret */
  const silt_state_api* state; /* never NULL */
} silt_context;

/* How a handler writes its response: the host owns the storage. flush (ABI 3)
 * sends what was written so far to the caller now: the status and headers
 * with the first flush, then the body bytes appended since the last one. A
 * response once flushed is streamed: later set_status and add_header calls
 * are ignored, and what is appended after the last flush ends it when the
 * handler returns. flush returns 0, or -1 when the call's connection is gone
 * (the handler should return). */
typedef struct silt_response_writer {
  void* host;
  void (*set_status)(void* host, int status);
  void (*add_header)(void* host, silt_str name, silt_str value);
  void (*append_body)(void* host, const char* data, size_t len);
  int (*flush)(void* host);
} silt_response_writer;

/* Bundle exports. Return 0 on success; a non-zero return from silt_handle makes
 * the call a 500, from silt_init makes the instance fail to start. `error` (may
 * be written, at most error_cap bytes including the NUL) explains why. */
typedef uint32_t (*silt_abi_version_fn)(void);
typedef int (*silt_init_fn)(const silt_context* ctx, char* error,
                            size_t error_cap);
typedef int (*silt_handle_fn)(const silt_context* ctx, const silt_request* req,
                              const silt_response_writer* out, char* error,
                              size_t error_cap);
typedef void (*silt_after_restore_fn)(const silt_context* ctx);
/* Optional, asked once after silt_init: how many calls (silt_handle or
 * silt_task) the bundle's code takes at once, each on its own thread. Absent
 * or 1: one at a time. At most SILT_MAX_CONCURRENCY (larger is capped). */
typedef uint32_t (*silt_max_concurrency_fn)(void);
#define SILT_MAX_CONCURRENCY 1024u
/* Optional: runs one compute proclet's share of a job (a silt/state_wire.h
 * TaskCall in `call`) and passes its reply (a StateCode byte, then the result
 * or the error message) to append(). Returns 0; non-zero only when the call
 * could not be read. */
typedef int (*silt_task_fn)(const silt_context* ctx, const char* call,
                            size_t call_len, void* out,
                            void (*append)(void* out, const char* data,
                                           size_t len));

#ifdef __cplusplus
}
#endif

#endif /* SILT_ABI_H_ */
