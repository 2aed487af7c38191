/*
 * capture.c - tide_stream_capture_key: which CUDA graph capture a stream is part of, as the
 * CUDA fabrics' calls see it.  Callers that route calls around a capture (tide.fsdp's
 * capture="tide") need the capture's identity, which torch does not expose: two captures
 * with no call in between are otherwise indistinguishable, and the library refuses a set's
 * calls spread over two graphs.
 */
#include "core/checks.h"
#include "fabric/fabric.h"
#include "tide.h"

tide_result_t tide_stream_capture_key(void *stream, uint64_t *key_out) {
    tide_error_clear();
    TIDE_ARG_CHECK(key_out != NULL, "stream_capture_key: key_out is NULL");
#ifdef TIDE_HAVE_CUDA
    return tide_cuda_stream_capture_key(stream, key_out);
#else
    (void)stream;
    return TIDE_ERR(TIDE_ERR_UNSUPPORTED,
                    "stream_capture_key: this libtide is built without CUDA "
                    "(cmake -DTIDE_WITH_CUDA=ON)");
#endif
}
