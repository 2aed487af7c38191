/* dtype.c - item sizes of the data types TIDE recognises. */
#include "tide.h"

size_t tide_dtype_size(tide_dtype_t dtype) {
    switch (dtype) {
    case TIDE_DTYPE_BF16: return 2;
    case TIDE_DTYPE_FP32: return 4;
    case TIDE_DTYPE_FP16: return 2;
    default: return 0;
    }
}
