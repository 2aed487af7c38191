"""Shard adoption: the storage FSDP2's sharded parameters live in while TIDE serves them.

Every adopted shard is rooted at storage offset 0 of a storage of its own: a slice of the
backing buffer's storage (UntypedStorage slicing), which keeps the buffer alive and shares
its bytes.  A shard at a non-zero offset of a shared storage breaks what users do with state
dicts: a DTensor wrapper built over such a local tensor reports a non-zero data pointer
without a storage, so copy.deepcopy(get_model_state_dict(model)) and torch.save fail with
"invalid python storage".  With offset-0 storages they behave as stock's.

Two backing buffers:
- the group's resident region in TIDE's arena (a group whose all-gather does not cast):
  TIDE-AG reads the shards there, nothing is copied in;
- for a casting group (fp32 masters, bf16 all-gather) one packed fp32 buffer in torch's
  memory: the masters *are* that buffer (no second copy), and TIDE-AG reads it and casts as
  the bytes land.
"""

import torch


class _CudaBytes:
    """__cuda_array_interface__ of bytes inside `owner` (a CUDA tensor), keeping it alive."""

    def __init__(self, ptr, nbytes, owner):
        self._owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3, "strides": None}


def _own_storage(base, storage, start, end):
    """A 1-D uint8 tensor over bytes [start, end) of base's storage, at offset 0 of a storage
    of its own that keeps base's alive."""
    try:
        piece = storage[start:end]  # UntypedStorage slicing: a view that holds its base
    except (NotImplementedError, RuntimeError, TypeError):
        if base.device.type != "cuda":
            raise
        ptr = storage.data_ptr() + start
        return torch.as_tensor(_CudaBytes(ptr, end - start, base), device=base.device)
    return torch.empty(0, dtype=torch.uint8, device=base.device).set_(piece, 0, (end - start,))


def zero_offset_views(base, numels):
    """1-D tensors of `numels[i]` items of base's dtype, back to back from base's first item,
    each at offset 0 of its own slice of base's storage."""
    itemsize = base.element_size()
    storage = base.untyped_storage()
    start = base.storage_offset() * itemsize
    out = []
    for n in numels:
        end = start + n * itemsize
        t = _own_storage(base, storage, start, end).view(base.dtype)
        assert t.storage_offset() == 0 and t.numel() == n
        out.append(t)
        start = end
    return out


def move_shard(fp, flat):
    """Make `flat` (1-D, the padded sharded numel) the storage of fp's sharded parameter,
    with its current values: FSDP2's _sharded_param_data and the DTensor's local tensor
    (its first rows), as FSDPParam.reset_sharded_param rebinds them.  The nn.Parameter
    object stays the same, so optimizers and their state keep pointing at it."""
    old = fp._sharded_param_data
    local = fp.sharded_param._local_tensor
    length = local.size(0) if local.numel() > 0 else 0
    if old.data_ptr() != flat.data_ptr():
        flat.copy_(old)
    fp._sharded_param_data = flat
    fp.sharded_param._local_tensor = flat.view(fp.padded_sharded_param_size).narrow(0, 0, length)


def adopt(fsdp_params, views):
    """Move every parameter's shard into its view (once, at enable)."""
    with torch.no_grad():
        for fp, view in zip(fsdp_params, views):
            move_shard(fp, view)


def readopt_if_replaced(fsdp_params, views):
    """Adopt again, with one copy each, the shards whose storage was replaced since
    (load_state_dict(assign=True), a user's set_); returns how many."""
    moved = 0
    with torch.no_grad():
        for fp, view in zip(fsdp_params, views):
            if fp._sharded_param_data.data_ptr() != view.data_ptr():
                move_shard(fp, view)
                moved += 1
    return moved


def release(fsdp_params, views):
    """Give the shards that still live in `views` storage of their own (before the backing
    arena is unmapped)."""
    with torch.no_grad():
        for fp, view in zip(fsdp_params, views):
            if fp._sharded_param_data.data_ptr() == view.data_ptr():
                move_shard(fp, torch.empty_like(view))
