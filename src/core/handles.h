/*
 * handles.h - validity of tide_comm_t / tide_group_t handles without reading the object.
 *
 * A handle is the object's address (the public types are pointers, and tests and tools that
 * link the static library read the objects directly).  Every live object is entered in a
 * process-wide set of addresses; a public call first looks its handle up there, so a handle
 * that was destroyed (or never created) is refused with TIDE_ERR_INVALID_ARGUMENT before any
 * byte of it is read.  The storage of a released object is poisoned and kept in a quarantine
 * of the last TIDE_HANDLE_QUARANTINE releases instead of going back to malloc, so that within
 * that window no new object can take a stale handle's address (the ABA case): a stale handle
 * is reliably reported, never resolved to another object.
 */
#ifndef TIDE_CORE_HANDLES_H_
#define TIDE_CORE_HANDLES_H_

#include "tide.h"

#include <stdbool.h>
#include <stddef.h>

#define TIDE_HANDLE_QUARANTINE 1024

typedef enum { TIDE_HANDLE_COMM = 1, TIDE_HANDLE_GROUP = 2 } tide_handle_kind_t;

/* Enter a new object (TIDE_ERR_NO_MEMORY when the set cannot grow). */
tide_result_t tide_handle_add(void *obj, tide_handle_kind_t kind);

/* Whether obj is a live object of `kind`; reads nothing of obj. */
bool tide_handle_live(const void *obj, tide_handle_kind_t kind);

/* TIDE_SUCCESS for a live handle, else TIDE_ERR_INVALID_ARGUMENT naming `call` and the
 * handle (NULL, destroyed, or not a handle of this kind). */
tide_result_t tide_handle_check(const void *obj, tide_handle_kind_t kind, const char *call);

/* Remove obj from the set, poison its `bytes` and release it through the quarantine. */
void tide_handle_release(void *obj, tide_handle_kind_t kind, size_t bytes);

#endif /* TIDE_CORE_HANDLES_H_ */
