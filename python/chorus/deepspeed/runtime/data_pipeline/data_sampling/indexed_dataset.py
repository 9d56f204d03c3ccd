"""The memory-mapped indexed dataset files DeepSpeed's data analyzer writes and its
curriculum sampler reads (Megatron's format: PREFIX.bin holds the rows end to end,
PREFIX.idx a header, each row's length and byte offset, and the document boundaries),
so that index files made by DeepSpeed load here and the other way round.

The .idx layout: b"MMIDIDX\\x00\\x00", version 1 (<Q), dtype code (<B), row count (<Q),
document count (<Q), then int32 lengths, int64 byte offsets, int64 document starts.
Files are written to a temporary name and renamed, so a reader never sees half of one."""
import os
import struct

import numpy as np
import torch

_MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.uint16, 7: np.uint32, 8: np.uint64}
_TORCH = {torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32,
          torch.int64: np.int64}


def _np_dtype(dtype):
    dtype = _TORCH.get(dtype, dtype)
    dtype = np.dtype(dtype).type
    if dtype not in DTYPES.values():
        raise ValueError(f"indexed dataset: dtype {dtype} is not one of {sorted(d.__name__ for d in DTYPES.values())}")
    return dtype


def code(dtype):
    dtype = _np_dtype(dtype)
    return next(c for c, d in DTYPES.items() if d is dtype)


def find_fit_int_dtype(min_value, max_value):
    """The smallest integer dtype that holds [min_value, max_value] (unsigned when it can)."""
    if min_value >= 0:
        for t in (np.uint8, np.uint16, np.uint32):
            if max_value <= np.iinfo(t).max:
                return t
        return np.uint64
    for t in (np.int8, np.int16, np.int32):
        if np.iinfo(t).min <= min_value and max_value <= np.iinfo(t).max:
            return t
    return np.int64


class MMapIndexedDataset(torch.utils.data.Dataset):
    """Rows of PREFIX.bin as numpy arrays (views of the mapping)."""

    def __init__(self, path, skip_warmup=True):
        self._path = path
        idx = path + ".idx"
        with open(idx, "rb") as f:
            head = f.read(9 + 8 + 1 + 8 + 8)
        if len(head) < 34 or head[:9] != _MAGIC:
            raise ValueError(f"indexed dataset: {idx} is not an index file (no MMIDIDX header)")
        version, = struct.unpack("<Q", head[9:17])
        if version != 1:
            raise ValueError(f"indexed dataset: {idx} has version {version}, not 1")
        dcode = head[17]
        if dcode not in DTYPES:
            raise ValueError(f"indexed dataset: {idx} names dtype code {dcode}, which is not one of {sorted(DTYPES)}")
        self._dtype = DTYPES[dcode]
        n, docs = struct.unpack("<QQ", head[18:34])
        size = os.path.getsize(idx)
        if size != 34 + n * 12 + docs * 8:
            raise ValueError(f"indexed dataset: {idx} is {size} bytes, not the {34 + n * 12 + docs * 8} its header "
                             f"says ({n} rows, {docs} documents): truncated or not one file")
        index = np.memmap(idx, mode="r", dtype=np.uint8)
        self._sizes = np.frombuffer(index, dtype=np.int32, count=n, offset=34)
        self._pointers = np.frombuffer(index, dtype=np.int64, count=n, offset=34 + n * 4)
        self._doc_idx = np.frombuffer(index, dtype=np.int64, count=docs, offset=34 + n * 12)
        data = path + ".bin"
        need = int(self._pointers[-1] + self._sizes[-1] * np.dtype(self._dtype).itemsize) if n else 0
        if os.path.getsize(data) < need:
            raise ValueError(f"indexed dataset: {data} is {os.path.getsize(data)} bytes; its index needs {need}")
        self._data = np.memmap(data, mode="r", dtype=np.uint8) if need else np.zeros(0, np.uint8)

    def __len__(self):
        return len(self._sizes)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("indexed dataset: slices must be contiguous")
            return [self[i] for i in range(start, stop)]
        idx = int(idx)
        if idx < 0:
            idx += len(self)
        return np.frombuffer(self._data, dtype=self._dtype, count=int(self._sizes[idx]),
                             offset=int(self._pointers[idx]))

    def get(self, idx, offset=0, length=None):
        row = self[idx]
        return row[offset:] if length is None else row[offset:offset + length]

    @property
    def sizes(self):
        return self._sizes

    @property
    def doc_idx(self):
        return self._doc_idx

    @property
    def dtype(self):
        return self._dtype

    @staticmethod
    def exists(path):
        return os.path.exists(path + ".idx") and os.path.exists(path + ".bin")


class MMapIndexedDatasetBuilder:
    """Rows appended to OUT_FILE (PREFIX.bin); finalize(PREFIX.idx) writes the index."""

    def __init__(self, out_file, dtype=np.int64):
        self._out = out_file
        self._dtype = _np_dtype(dtype)
        self._tmp = f"{out_file}.{os.getpid()}.tmp"  # (a name of this process's own)
        self._file = open(self._tmp, "wb")
        self._sizes, self._doc_idx = [], [0]

    def add_item(self, tensor):
        self.add_item_numpy(tensor.numpy() if torch.is_tensor(tensor) else np.asarray(tensor))

    def add_item_numpy(self, array):
        array = np.ascontiguousarray(array, dtype=self._dtype).reshape(-1)
        self._file.write(array.tobytes())
        self._sizes.append(array.size)

    def add_items(self, arrays):
        for a in arrays:
            self.add_item_numpy(a)

    def end_document(self):
        self._doc_idx.append(len(self._sizes))

    def merge_file_(self, other):
        index = MMapIndexedDataset(other)
        if index.dtype is not self._dtype:
            raise ValueError(f"indexed dataset: {other} holds {index.dtype.__name__}, this builder "
                             f"{self._dtype.__name__}")
        offset = len(self._sizes)
        for i in range(len(index)):
            self.add_item_numpy(index[i])
        self._doc_idx.extend(int(d) + offset for d in index.doc_idx[1:])

    def finalize(self, index_file):
        self._file.close()
        os.replace(self._tmp, self._out)
        sizes = np.asarray(self._sizes, dtype=np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes):
            pointers[1:] = np.cumsum(sizes[:-1].astype(np.int64)) * np.dtype(self._dtype).itemsize
        tmp = f"{index_file}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(_MAGIC + struct.pack("<QBQQ", 1, code(self._dtype), len(sizes), len(self._doc_idx)))
            f.write(sizes.tobytes())
            f.write(pointers.tobytes())
            f.write(np.asarray(self._doc_idx, dtype=np.int64).tobytes())
        os.replace(tmp, index_file)  # (the index last: a reader checks the data against it)


def create_mmap_dataset_builder(fname, dtype):
    return MMapIndexedDatasetBuilder(f"{fname}.bin", dtype=dtype)


def close_mmap_dataset_builder(builder, fname):
    builder.end_document()
    builder.finalize(f"{fname}.idx")


def write_rows(fname, rows, dtype):
    """PREFIX.bin/.idx holding rows (one document), in one go."""
    builder = create_mmap_dataset_builder(fname, dtype)
    builder.add_items(rows)
    close_mmap_dataset_builder(builder, fname)
