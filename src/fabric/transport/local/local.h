/*
 * local.h - the local transport (transport.h): every rank of the world in this process, its
 * signals CUDA events of the prepared program, its fences the family's aggregate events.
 */
#ifndef TIDE_FABRIC_TRANSPORT_LOCAL_H_
#define TIDE_FABRIC_TRANSPORT_LOCAL_H_

#include "fabric/cuda/transport.h"

/* The call's tp_ctx. */
typedef struct {
    tide_cuda_shared_t *sh;
    tide_cuda_family_t *fam;
    tide_cuda_prepared_t *pp;
} tide_transport_local_t;

#endif /* TIDE_FABRIC_TRANSPORT_LOCAL_H_ */
